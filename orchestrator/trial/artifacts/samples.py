"""Sampled text kept for reading: what the model wrote, how it was scored and what credit it got.

`logging.samples` (orchestrator/config/sections.py) writes, through the storage layer (a path or a bucket URI),
    trials/<trial>/samples/step_<s>.jsonl.gz        the first `per_step` groups of training step s
    trials/<trial>/samples/eval_step_<s>.jsonl.gz   every generation of the held-out evaluation at step s
one JSON row per completion (or episode): `ROW_KEYS`. `completion` is the text of every response token (for an
episode: each turn's sampled text with the observations between them, split out in `turns`); `planning_spans` are
`[start, end)` character ranges of `completion` that the credit stack's planning-token detector marks (the
trial's `credit.strategic_grams` / `credit.planning_detector`, on each sampled turn alone, as the learner does).
Advantages are the learner's for that step (None for groups it did not train on, and for evaluations).

Size cap (`max_mb`, per trial): a file that would take the trial's samples folder past the cap is not written;
the first file skipped is said once in the trial's events.jsonl (`samples_capped`); files already written stay.
A resumed trial rewrites the files of the steps it re-runs (same names, same bytes on CPU).
"""

from __future__ import annotations

from dataclasses import dataclass

from orchestrator import storage as store
from orchestrator.storage import EVENTS_FILE, SAMPLES_DIR, gzip_jsonl, samples_file
from orchestrator.trial.collect.rollouts import SampleGroup

ROW_KEYS = ("step", "split", "group", "problem", "sample", "prompt", "completion", "turns", "reward", "correct",
            "episode_advantage", "token_advantage", "length", "truncated", "planning_spans", "adapter_version",
            "trained")


def train_groups(roll, count: int) -> list[SampleGroup]:
    """The first `count` groups of a step's `Rollouts` (orchestrator/trial/collect/sources.py) with their metadata."""
    out = []
    for i, info in enumerate(roll.groups_info[:count]):
        out.append(SampleGroup(info["problem"], info["prompt"], roll.response_ids[i], roll.rewards[i],
                               roll.correct[i], info["truncated"], roll.loss_mask[i]))
    return out


def runs(flags: list[bool]) -> list[tuple[int, int, bool]]:
    """`[start, end)` of each maximal run of equal flags, with the flag."""
    out, start = [], 0
    for i in range(1, len(flags) + 1):
        if i == len(flags) or flags[i] != flags[start]:
            out.append((start, i, flags[start]))
            start = i
    return out


class SampleText:
    """Turns token ids into the rows' text and planning spans with the trial's tokenizer and planning detector."""

    def __init__(self, tokenizer, grams: list[str] | None = None, detector=None):
        from workers.credit import planning_mask

        self.tokenizer, self.grams, self.detect = tokenizer, grams, detector or planning_mask

    def completion(self, ids: list[int], mask: list[bool] | None) -> tuple[str, list[dict], list[list[int]]]:
        """(text, turns, planning spans) of one response. Turns: `{"role": "assistant" | "observation",
        "text"}` in order (one assistant turn for a single-turn completion)."""
        from workers.models.loading import token_pieces

        mask = [True] * len(ids) if mask is None else list(mask)
        text, turns, spans = "", [], []
        for s, e, sampled in runs(mask):
            pieces = token_pieces(self.tokenizer, ids[s:e])
            if sampled:
                flags = self.detect(pieces, self.grams)
                offset = len(text)
                for a, b, marked in runs(list(flags)):
                    if marked:
                        lo = offset + sum(len(p) for p in pieces[:a])
                        spans.append([lo, lo + sum(len(p) for p in pieces[a:b])])
            piece = "".join(pieces)
            turns.append({"role": "assistant" if sampled else "observation", "text": piece})
            text += piece
        return text, turns, spans


@dataclass(frozen=True)
class Credit:
    """The learner's advantages of the groups it trained on: `kept` group indices of the step, and per sequence
    (in kept-group order) the episode advantage and the mean token advantage."""

    kept: list[int]
    episode: list[float] | None
    token_mean: list[float] | None

    def of(self, group: int, sample: int, size: int) -> tuple[float | None, float | None]:
        if group not in self.kept or self.episode is None or self.token_mean is None:
            return None, None
        i = self.kept.index(group) * size + sample
        return self.episode[i], self.token_mean[i]


def sample_rows(text: SampleText, groups: list[SampleGroup], *, step: int, split: str, version: int,
                credit: Credit | None = None) -> list[dict]:
    """One row per completion of `groups` (keys `ROW_KEYS`)."""
    rows = []
    for gi, grp in enumerate(groups):
        for k, ids in enumerate(grp.response_ids):
            mask = grp.loss_mask[k] if grp.loss_mask is not None else None
            body, turns, spans = text.completion(ids, mask)
            ep, tok = credit.of(gi, k, len(grp.response_ids)) if credit is not None else (None, None)
            rows.append({
                "step": step, "split": split, "group": gi, "problem": grp.problem, "sample": k,
                "prompt": grp.prompt, "completion": body, "turns": turns if len(turns) > 1 else None,
                "reward": float(grp.rewards[k]), "correct": bool(grp.correct[k]),
                "episode_advantage": ep, "token_advantage": tok,
                "length": sum(mask) if mask is not None else len(ids), "truncated": bool(grp.truncated[k]),
                "planning_spans": spans, "adapter_version": version,
                "trained": credit is not None and gi in credit.kept,
            })
    return rows


class SamplesWriter:
    """Writes one trial's samples files under `out_dir/<folder>/` (samples/; the `eval` command's generations:
    eval/), within the trial's cap on that folder."""

    def __init__(self, out_dir: str, max_mb: float, folder: str = SAMPLES_DIR):
        self.dir, self.cap = store.join(out_dir, folder), int(max_mb * 2**20)
        self.events = store.join(out_dir, EVENTS_FILE)
        self.capped = False

    def write(self, step: int, split: str, rows: list[dict], name: str | None = None) -> str | None:
        """The file's location (`name`, default the samples file of `step` and `split`), or None when the cap
        kept it out (or there is nothing to write)."""
        if not rows:
            return None
        name, data = name or samples_file(step, split), gzip_jsonl(rows)
        used = sum(size for other, size in store.file_sizes(self.dir).items() if other != name)
        if used + len(data) > self.cap:
            if not self.capped:
                store.append_line(self.events, {"event": "samples_capped", "step": step, "split": split,
                                                "file": name, "used_bytes": used, "file_bytes": len(data),
                                                "cap_bytes": self.cap})
            self.capped = True
            return None
        location = store.join(self.dir, name)
        store.write_bytes(location, data)
        return location


def read_samples(trial_dir: str, step: int, split: str = "train") -> list[dict] | None:
    """The rows of one samples file, or None when it was not written."""
    return store.read_gzip_jsonl(store.join(trial_dir, SAMPLES_DIR, samples_file(step, split)))


class TrialSamples:
    """The trial loop's one call after each step (`record`): the step's samples files written, and the rows
    handed back for the W&B table."""

    def __init__(self, cfg, out_dir: str, tokenizer):
        from workers.credit import resolve_plugins

        self.settings = cfg.logging.samples
        self.text = SampleText(tokenizer, cfg.credit.strategic_grams,
                               resolve_plugins(cfg.credit).get("planning_detector"))
        self.writer = SamplesWriter(out_dir, self.settings.max_mb)

    def record(self, step: int, outcome, eval_version: int) -> dict[str, list[dict]]:
        """Writes what `logging.samples` asks for of a step's outcome (orchestrator/trial/step/sequence.py: its rollouts,
        kept groups and advantages, and the held-out generations). Returns {"samples/train" | "samples/eval":
        rows} of the files written."""
        roll, kept, row = outcome.rollouts, outcome.kept, outcome.row
        advantages, held_out = outcome.advantages, outcome.eval_samples
        s, out = self.settings, {}
        if roll is not None and s.every and s.per_step and step % s.every == 0:
            credit = Credit(kept, *advantages) if advantages is not None else Credit(kept, None, None)
            rows = sample_rows(self.text, train_groups(roll, s.per_step), step=step, split="train",
                               version=int(row["rollout/adapter_version"]), credit=credit)
            if self.writer.write(step, "train", rows):
                out["samples/train"] = rows
        if held_out and s.eval:
            rows = sample_rows(self.text, held_out, step=step, split="eval", version=eval_version)
            if self.writer.write(step, "eval", rows):
                out["samples/eval"] = rows
        return out
