"""`python -m orchestrator trial CONFIG --replay RUN_DIR`: train on a run's saved batches instead of sampling.

A run with `logging: {batches: true}` saved every step's groups (orchestrator/trial/artifacts/batches.py). A replay is an
ordinary rollout source whose `collect` of step t is the saved groups of step t, handed to `step.prepare` where a
sampled step's would go, so the
learner side runs under the replaying trial's own settings (credit, learner, interventions, the group filter
and SEPA) on exactly the data the run trained on: two learner settings compared on identical batches, and the
run's own config reproduces its metrics. The run's rollout settings shaped the data (refill, overlong, length);
the replaying trial's `rollout.fill` / `rollout.overlong` / `max_tokens` are not applied again.

No rollout engine starts for training (`config/placement.py: engines`). With `eval.every` > 0 the engines start
anyway, receive each new policy and run the held-out evaluation as in a sampled trial; with `eval.every: 0` none
starts. A replayed step's `time/generate_s` is the time to read its file; the saved rollout metrics (grader
errors, per-source rates) are reported as the run's, its other `time/*` are dropped.

Refused before anything starts, one line each (`check_replay`): a RUN_DIR without saved batches, a trial whose
model (its name, or under the same name a tokenizer with another vocabulary), task or rollout shape
(prompts_per_step, n, temperature) differs from the saved batches', fewer saved
steps than `steps`, and rollout.mode one_step_off (it overlaps sampling with training; a replay samples nothing).
"""

from __future__ import annotations

import dataclasses
import json
import time
import zipfile
from pathlib import Path

from orchestrator import storage as store
from orchestrator.config.errors import UserError
from orchestrator.config.trial import TrialConfig
from orchestrator.storage import BATCHES_DIR, TRIAL_CONFIG_FILE, batch_file
from orchestrator.trial.actors.context import TrialContext
from orchestrator.trial.artifacts.batches import read_batch
from orchestrator.trial.collect.rollouts import HeldOut, Rollouts
from orchestrator.trial.collect.sources import RolloutSource


def run_location(run_dir: str) -> str:
    """The trial directory that holds `batches/`: RUN_DIR itself (a campaign's trials/<trial>, or a trial's
    output_dir), or for the directory a lone `orchestrator trial` wrote (<storage>/<name>) its output_dir."""
    run = run_dir if store.is_uri(run_dir) else str(Path(run_dir).resolve())
    if store.file_sizes(store.join(run, BATCHES_DIR)):
        return run
    text = store.read_text(store.join(run, TRIAL_CONFIG_FILE))
    out = json.loads(text).get("output_dir") if text else None
    return out or run


def saved_steps(run: str) -> int:
    """How many steps' batches the run saved, counted from step 0 without a gap."""
    names, k = set(store.file_sizes(store.join(run, BATCHES_DIR))), 0
    while batch_file(k) in names:
        k += 1
    return k


def mismatches(cfg: TrialConfig, header: dict, tokenizer: str | None = None) -> list[str]:
    """`key path: what differs` for every setting of `cfg` the saved batches were made under and disagree with;
    `tokenizer`: the replaying trial's tokenizer fingerprint, checked against the run's where both are known (the
    same model name may hold other files: a local path rebuilt, a hub revision)."""
    saved = {"model.name": header["model"]["name"], "model.tiny_seed": header["model"]["tiny_seed"],
             "task.name": header["task"], "rollout.prompts_per_step": header["rollout"]["prompts_per_step"],
             "rollout.n": header["rollout"]["n"], "rollout.temperature": header["rollout"]["temperature"]}
    ours = {"model.name": cfg.model.name, "model.tiny_seed": cfg.model.tiny_seed, "task.name": cfg.task.name,
            "rollout.prompts_per_step": cfg.rollout.prompts_per_step, "rollout.n": cfg.rollout.n,
            "rollout.temperature": cfg.rollout.temperature}
    wrong = [f"{k}: {ours[k]!r}, but the saved batches were sampled with {saved[k]!r}"
             for k in saved if ours[k] != saved[k]]
    theirs = header["model"].get("tokenizer")
    if not wrong and tokenizer and theirs and tokenizer != theirs:
        wrong.append(f"model.name: {cfg.model.name!r} now has another tokenizer (vocabulary {tokenizer}) than the "
                     f"one the saved batches' token ids are in ({theirs})")
    return wrong


def _tokenizer_of(cfg: TrialConfig) -> str | None:
    """The replaying trial's tokenizer fingerprint, None where its tokenizer is not on this machine (a hub model
    not downloaded here: the trial checks it itself, `ReplaySource`)."""
    from orchestrator.actors.models import local_tokenizer
    from workers.models.loading import tokenizer_fingerprint

    tok = local_tokenizer(cfg.model)
    return None if tok is None else tokenizer_fingerprint(tok)


def check_replay(cfg: TrialConfig, run_dir: str, where: str) -> str:
    """The run directory `cfg` may replay (see `run_location`), or UserError naming what refuses it (module doc)."""
    if cfg.rollout.mode == "one_step_off":
        raise UserError(f"{where}: rollout.mode: one_step_off overlaps sampling with training and a replay samples "
                        "nothing: use 'sync' with --replay")
    if cfg.rollout.mode == "async":
        raise UserError(f"{where}: rollout.mode: async samples ahead of the learner and a replay samples nothing: "
                        "use 'sync' with --replay")
    run = run_location(run_dir)
    have = saved_steps(run)
    if not have:
        raise UserError(f"{where}: --replay {run_dir}: no saved batches ({BATCHES_DIR}/{batch_file(0)}); the run "
                        "needs logging: {batches: true}")
    try:
        _, header = read_batch(run, 0)
    except (ValueError, KeyError, OSError, zipfile.BadZipFile) as exc:
        raise UserError(f"{where}: --replay {run_dir}: {BATCHES_DIR}/{batch_file(0)} is unreadable: {exc}") from None
    wrong = mismatches(cfg, header)
    if not wrong and header["model"].get("tokenizer"):  # the same model name: are its token ids the same?
        wrong = mismatches(cfg, header, _tokenizer_of(cfg))
    if wrong:
        raise UserError(f"{where}: {wrong[0]} in {run_dir}")
    if have < cfg.steps:
        raise UserError(f"{where}: steps: {cfg.steps}, but {run_dir} saved the batches of {have} step(s) "
                        f"(0..{have - 1}): set steps <= {have}")
    return run


class ReplaySource:
    """A `RolloutSource` whose training groups are a run's saved batches (`saved`); held-out evaluation is the
    trial's own source's, on its engines. Not wrapped in a `Refill`: the saved step holds every round the run
    sampled."""

    def __init__(self, cfg: TrialConfig, inner: RolloutSource, tokenizer: str | None = None):
        self.run, self.inner = cfg.replay, inner
        got = read_batch(self.run, 0)
        wrong = mismatches(cfg, got[1], tokenizer) if got is not None else [f"{self.run}: no saved batches"]
        if wrong:  # the CLI refused these already; a config that set `replay:` itself meets them here
            raise ValueError(f"replay: {wrong[0]}")

    def saved(self, step: int) -> Rollouts:
        """Step `step`'s groups as the run gathered them; sampled by no engine of this trial (no versions)."""
        t0 = time.perf_counter()
        got = read_batch(self.run, step)
        if got is None:
            raise FileNotFoundError(f"replay: {self.run} saved no batch of step {step}")
        roll = got[0]
        metrics = {k: v for k, v in roll.metrics.items() if not k.startswith("time/")}
        metrics["time/generate_s"] = time.perf_counter() - t0
        return dataclasses.replace(roll, versions=set(), metrics=metrics)

    def collect(self, step: int, round: int = 0) -> Rollouts:
        """The saved step (every round the run sampled: `round` has nothing left to ask)."""
        return self.saved(step)

    def evaluate(self, step: int) -> HeldOut:
        return self.inner.evaluate(step)


def replay_source(ctx: TrialContext, inner: RolloutSource) -> RolloutSource:
    """The trial's source: `inner`, or under `replay:` the saved batches with `inner`'s evaluation."""
    if not ctx.cfg.replay:
        return inner
    from workers.models.loading import tokenizer_fingerprint

    return ReplaySource(ctx.cfg, inner, tokenizer_fingerprint(ctx.tokenizer) if ctx.tokenizer is not None else None)
