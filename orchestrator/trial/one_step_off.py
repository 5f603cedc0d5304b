"""One-step-off-policy rollouts (`rollout.mode: one_step_off`).

While the learner trains on step t (a Ray call that returns a future), the driver generates step t+1 with the
adapter the workers hold, i.e. the policy after step t-1's update; then it waits for the learner, exports the
new adapter and loads it on the workers. Generation and training overlap; the batch of step t+1 is one policy
version stale (`rollout/staleness`), which the learner corrects per token with the truncated importance weight
min(pi_old / pi_rollout, C) (`rollout.tis_cap`; pi_old is the learner's recomputed log-prob, pi_rollout vLLM's).

Everything else is the sync step's (orchestrator/trial/step.py: `collect`, `prepare`, `absorb`,
`push_policy`): the same seeds, task cursor order (next_batch for t+1 runs after step t's, as in sync), SEPA
lambda and observation order, filtering and metrics. The prefetched batch and the version it was sampled with
are saved in the checkpoint (`PREFETCH_FILE`), so a restored trial trains on exactly the batch the uninterrupted
one would have (regenerating it would need the previous adapter).
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

from orchestrator.trial.context import TrialContext
from orchestrator.trial.sources import Rollouts, RolloutSource
from orchestrator.trial.step import StepOutcome, absorb, prepare, push_policy
from workers.credit import SepaController

PREFETCH_FILE = "prefetch.json"


def rollouts_to_json(roll: Rollouts, version: int) -> str:
    """The prefetched batch and the adapter version it was sampled with, as JSON (floats round-trip exactly)."""
    data = dataclasses.asdict(roll)
    data["versions"] = sorted(roll.versions, key=lambda v: -1 if v is None else v)
    return json.dumps({"version": version, "rollouts": data})


def rollouts_from_json(text: str) -> tuple[Rollouts, int]:
    data = json.loads(text)
    fields = dict(data["rollouts"])
    fields["versions"] = set(fields["versions"])
    return Rollouts(**fields), int(data["version"])


def load_pending(checkpoint_dir: str | Path) -> tuple[Rollouts, int] | None:
    """The prefetched batch saved in a checkpoint directory, or None (sync trials, or the trial's last step)."""
    path = Path(checkpoint_dir) / PREFETCH_FILE
    return rollouts_from_json(path.read_text()) if path.exists() else None


class OneStepOff:
    """The one_step_off step loop body; `step` replaces `orchestrator.trial.step.one_step` (same row, plus
    `rollout/staleness`, `time/prefetch_s`, `time/learner_wait_s` and the learner's `tis/*`)."""

    def __init__(self, ctx: TrialContext, source: RolloutSource, pending: tuple[Rollouts, int] | None = None):
        self.ctx, self.source = ctx, source
        self.pending = pending  # (batch of the next step, adapter version it was sampled with)
        self.timeline: list[dict] = []  # driver-side intervals of the latest steps (tests, benchmarks)

    def _collect(self, step: int) -> Rollouts:
        return self.source.collect(step)

    def step(self, step: int, sepa: SepaController, version: int) -> StepOutcome:
        """Train on step `step` (prefetched, or generated now on the first step of this process) while
        generating step + 1; returns the step's outcome like `one_step`."""
        cfg, learner = self.ctx.cfg, self.ctx.learner
        if self.pending is None:
            self.pending = (self._collect(step), version)
        roll, gen_version = self.pending
        self.pending = None
        prep = prepare(self.ctx, step, roll, sepa, gen_version)
        row, batch = prep.row, prep.batch
        row["rollout/staleness"] = version - gen_version
        t0 = time.perf_counter()
        future = None
        if batch is not None:
            future = learner.submit_train_step(dataclasses.replace(batch, tis_cap=cfg.rollout.tis_cap))
        t1, w1 = time.perf_counter(), time.time()
        if step + 1 < cfg.steps:  # overlaps the learner: sampled with the adapter the workers hold (`version`)
            self.pending = (self._collect(step + 1), version)
        t2, w2 = time.perf_counter(), time.time()
        t_pre = t2 - t1
        out = learner.result(future) if future is not None else None
        t_end = time.perf_counter()
        outcome = absorb(prep, roll, out, sepa)
        row["time/train_s"] = t_end - t0  # submit -> result, the next step's generation ran inside it
        row["time/prefetch_s"] = t_pre
        row["time/learner_wait_s"] = t_end - t2
        # wall-clock (time.time) interval of the next step's generation, comparable with other processes' clocks
        self.timeline = [*self.timeline[-7:], {"step": step, "prefetch": (w1, w2)}]

        t0 = time.perf_counter()
        if batch is not None:
            version = push_policy(self.ctx, version + 1)
        row["time/sync_s"] = time.perf_counter() - t0
        outcome.version = version
        return outcome

    def save(self, checkpoint_dir: str | Path) -> None:
        """Write the prefetched batch (if any) into a checkpoint directory."""
        if self.pending is not None:
            (Path(checkpoint_dir) / PREFETCH_FILE).write_text(rollouts_to_json(*self.pending))
