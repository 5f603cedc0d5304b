"""Each step's training batch, saved for reading and for `trial --replay` (orchestrator/trial/artifacts/replay.py).

`logging.batches: true` writes, through the storage layer (a path or a bucket URI), after every step
    trials/<trial>/batches/step_<s>.npz
the step's `Rollouts` (orchestrator/trial/collect/sources.py) as the rollout side handed them to `step.prepare`: every
sampled group (the learner's filter runs again on replay, under the replaying trial's settings), after the
refill's choice (`train`) and rollout.overlong. Everything the learner batch is built from is in it, so a replay
trains exactly as the run did.

The file is a plain compressed `.npz` (no pickle: `np.load(path)` reads it, numpy only). Sequences are in group
order (group i's G sequences, then group i+1's); B = the number of sequences, N = the number of groups.
    header                 0-d string: JSON, below
    group_sizes            int64 [N]   sequences per group (G)
    <ragged>, <ragged>_lens             one sequence's values after another, and each one's length [B]:
                           prompt_ids (int64), response_ids (int64), loss_mask (bool, aligned with response_ids),
                           logprobs (float64, vLLM's, aligned with response_ids); and the multi-turn extras
                           extra.reward_positions (int64), extra.turn_rewards (float64), extra.sampled_mask (bool)
    rewards, correct       float64 / bool [B]
    truncated, lengths     bool / int64 [B]   (absent when the source recorded none)
    train                  bool [N]   the refill's choice of the groups to train on (absent without rollout.fill)
Split a ragged array with `np.split(a, np.cumsum(a_lens)[:-1])`. The header (JSON) holds `format` (FORMAT),
`step`, `trial`, `model` ({name, tiny_seed, tokenizer: the fingerprint of the tokenizer the ids are in}), `task`,
`rollout` (the run's whole rollout section: what shaped the data), `num_tokens`, `versions` (the policy versions that sampled it), `metrics` (the rollout side's step
metrics), `groups_info` (each group's problem id, prompt text, truncation) and `extra` (the extras' names).
Floats are float64, so vLLM's log-probs and the rewards come back bit for bit.
"""

from __future__ import annotations

import io
import json

import numpy as np

from orchestrator import storage as store
from orchestrator.config.trial import TrialConfig
from orchestrator.storage import BATCHES_DIR, batch_file
from orchestrator.trial.collect.rollouts import Rollouts

FORMAT = 1
RAGGED = {"prompt_ids": np.int64, "response_ids": np.int64, "loss_mask": np.bool_, "logprobs": np.float64}
PER_SEQUENCE = {"rewards": np.float64, "correct": np.bool_, "truncated": np.bool_, "lengths": np.int64}


def _flat(groups: list[list]) -> list:
    return [x for g in groups for x in g]


def _dtype(values: list) -> type:
    """An extra's dtype from its values (bool before int: bool is an int in Python)."""
    if values and all(isinstance(v, bool) for v in values):
        return np.bool_
    if values and all(isinstance(v, int) for v in values):
        return np.int64
    return np.float64


def header_of(cfg: TrialConfig, step: int, roll: Rollouts, tokenizer: str | None = None) -> dict:
    """What a replay checks the replaying trial against, and what the arrays do not say. `tokenizer`: the
    fingerprint of the tokenizer the ids are in (workers/models/loading.py: tokenizer_fingerprint)."""
    model = {"name": cfg.model.name, "tiny_seed": cfg.model.tiny_seed}
    if tokenizer:
        model["tokenizer"] = tokenizer
    return {
        "format": FORMAT, "step": step, "trial": cfg.name, "model": model, "task": cfg.task.name,
        "rollout": cfg.rollout.model_dump(mode="json"), "num_tokens": roll.num_tokens,
        "versions": sorted(roll.versions, key=lambda v: -1 if v is None else v), "metrics": roll.metrics,
        "groups_info": roll.groups_info, "extra": sorted(roll.extra),
    }


def encode(roll: Rollouts, header: dict) -> bytes:
    """One step's `Rollouts` as the bytes of a compressed npz (module doc)."""
    arrays: dict[str, np.ndarray] = {"header": np.array(json.dumps(header)),
                                     "group_sizes": np.array([len(g) for g in roll.rewards], dtype=np.int64)}
    ragged = {name: (getattr(roll, name), dtype) for name, dtype in RAGGED.items()}
    for name, groups in roll.extra.items():
        seqs = _flat(groups)
        ragged[f"extra.{name}"] = (groups, _dtype([x for s in seqs for x in s]))
    for name, (groups, dtype) in ragged.items():
        seqs = _flat(groups)
        arrays[name] = np.array([x for s in seqs for x in s], dtype=dtype)
        arrays[f"{name}_lens"] = np.array([len(s) for s in seqs], dtype=np.int64)
    for name, dtype in PER_SEQUENCE.items():
        if getattr(roll, name):
            arrays[name] = np.array(_flat(getattr(roll, name)), dtype=dtype)
    if roll.train:
        arrays["train"] = np.array(roll.train, dtype=np.bool_)
    buf = io.BytesIO()
    np.savez_compressed(buf, **arrays)
    return buf.getvalue()


def _groups(values: list, sizes: list[int]) -> list[list]:
    out, at = [], 0
    for n in sizes:
        out.append(values[at:at + n])
        at += n
    return out


def decode(data: bytes) -> tuple[Rollouts, dict]:
    """`encode`'s bytes back as (Rollouts, header): the same lists of Python ints, floats and bools."""
    with np.load(io.BytesIO(data), allow_pickle=False) as z:
        header = json.loads(str(z["header"]))
        if header.get("format") != FORMAT:
            raise ValueError(f"batch format {header.get('format')!r}, this version reads {FORMAT}")
        sizes = z["group_sizes"].tolist()

        def ragged(name: str) -> list[list[list]]:
            values, lens = z[name], z[f"{name}_lens"].tolist()
            ends = np.cumsum(lens).tolist()
            seqs = [values[e - n:e].tolist() for n, e in zip(lens, ends, strict=True)]
            return _groups(seqs, sizes)

        def per_sequence(name: str) -> list[list]:
            return _groups(z[name].tolist(), sizes) if name in z.files else []

        roll = Rollouts(
            prompt_ids=ragged("prompt_ids"), response_ids=ragged("response_ids"), loss_mask=ragged("loss_mask"),
            logprobs=ragged("logprobs"), rewards=per_sequence("rewards"), correct=per_sequence("correct"),
            num_tokens=header["num_tokens"], versions=set(header["versions"]), metrics=dict(header["metrics"]),
            extra={name: ragged(f"extra.{name}") for name in header["extra"]}, groups_info=header["groups_info"],
            truncated=per_sequence("truncated"), lengths=per_sequence("lengths"),
            train=z["train"].tolist() if "train" in z.files else [])
    return roll, header


def read_batch(run_dir: str, step: int) -> tuple[Rollouts, dict] | None:
    """The batch a run saved for `step` (its trial directory: a path or URI), or None when it saved none."""
    data = store.read_bytes(store.join(run_dir, BATCHES_DIR, batch_file(step)))
    return None if data is None else decode(data)


class TrialBatches:
    """The loop's writer: `record` after each step (before the samples files take the step's rollouts)."""

    def __init__(self, cfg: TrialConfig, out_dir: str, tokenizer: str | None = None):
        self.cfg, self.out_dir, self.tokenizer = cfg, out_dir, tokenizer  # tokenizer: its fingerprint

    def record(self, step: int, roll: Rollouts) -> None:
        """Step `step`'s groups into its file when `logging.batches` is on."""
        if not self.cfg.logging.batches:
            return
        data = encode(roll, header_of(self.cfg, step, roll, self.tokenizer))
        store.write_bytes(store.join(self.out_dir, BATCHES_DIR, batch_file(step)), data)
