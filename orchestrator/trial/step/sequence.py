"""One training step, written once for both rollout modes (`TrainingStep`): collect (from the trial's rollout
source, trial_source.py: prompts -> completions -> rewards, or levels -> episodes -> returns, refilled, or a
replayed run's; this module never asks which) -> prepare (check the policy version, drop uninformative /
non-finite groups, build the row and the learner batch) -> train -> absorb (SEPA observes the step) ->
push_policy (the new policy to every engine). The step hands the loop a `StepOutcome`."""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

from orchestrator.config.members import is_mix
from orchestrator.trial.actors.context import TrialContext
from orchestrator.trial.collect.fill import usable_groups
from orchestrator.trial.collect.rollouts import Rollouts, SampleGroup
from orchestrator.trial.collect.sources import RolloutSource
from orchestrator.trial.step.completion import CompletionQueue, save_inflight
from orchestrator.trial.step.prefetch import save_queue
from orchestrator.trial.step.staleness import (
    Admission,
    group_staleness,
    offpolicy_settings,
    staleness_metrics,
    stamp,
)
from workers.credit import SepaController
from workers.learner.inputs import LearnerBatch, StepResult


@dataclass
class Prepared:
    """`prepare`'s answer: the step's metrics row so far, the learner batch (None when no group is kept), the
    correct rate SEPA observes and the indices of the kept groups."""

    row: dict
    batch: LearnerBatch | None
    correct_rate: float
    kept: list[int]


@dataclass
class StepOutcome:
    """What one training step hands the trial loop: `row`, its metrics (logged, written to metrics.jsonl); the
    groups it sampled (`rollouts`) and the ones it trained on (`kept`, indices into them); the policy version the
    engines hold after it; the learner's per-token uncertainty record and advantages (None when it did not train);
    the held-out generations of an evaluation that ran before it (`eval_samples`, set by the loop)."""

    row: dict
    rollouts: Rollouts
    kept: list[int]
    version: int
    uncertainty: dict[str, list[float]] | None = None
    advantages: tuple[list[float] | None, list[float] | None] | None = None  # (per sequence, token means)
    eval_samples: list[SampleGroup] = field(default_factory=list)


def check_versions(ctx: TrialContext, roll: Rollouts, version: int) -> None:
    """Raise unless the engines sampled `roll` with the adapter `version`."""
    # before the first push: the engines' initial policy (ports.py:EnginesPort.initial_versions: the bare base or
    # its adapter v0 on the trial's own engines, only v0 on a pool slot, which always holds an adapter)
    expected = {version} if version else set(ctx.engines.initial_versions)
    if roll.versions - expected:
        raise RuntimeError(f"a rollout worker sampled with adapter {sorted(roll.versions - expected, key=str)}, "
                           f"expected {sorted(expected, key=str)}")


def prepare(ctx: TrialContext, step: int, roll: Rollouts, sepa: SepaController,
            version: int, exclude: frozenset[int] = frozenset(), checked: bool = False) -> Prepared:
    """Check the adapter `roll` was sampled with (`version`; `checked`: already done when each batch was sampled,
    completion.py), drop uninformative groups and those in `exclude` (past the staleness bound under discard:
    staleness.py), and build the step's row and learner batch (None when no group is kept)."""
    cfg, actions = ctx.cfg, ctx.actions
    ro = cfg.rollout
    if not checked:
        check_versions(ctx, roll, version)
    usable = usable_groups(cfg, roll)  # over every sampled group; the refill's choice (roll.train) wins
    finite, filtered, uniform = usable.finite, usable.filtered, usable.uniform
    rewards = finite.rewards  # a dropped group's rewards count as 0 in the statistics below
    flat = [r for g in rewards for r in g]
    correct_rate = sum(c for g in roll.correct for c in g) / len(flat)
    rv = cfg.interventions.rv_filter
    keep = [i for i in ([i for i, t in enumerate(roll.train) if t] if roll.train else usable.keep)
            if i not in exclude]

    lam = sepa.lambda_for(step)
    metrics = dict(roll.metrics)
    t_gen = metrics.pop("time/generate_s")
    row: dict = {
        "step": step,
        "train/correct_rate": correct_rate,
        "train/reward_mean": sum(flat) / len(flat),
        "train/groups_kept": len(keep),
        # the effective batch (the report's table): sampled, informative (not uniform, finite), trained tokens
        "train/groups_sampled": len(rewards),
        "train/groups_informative": sum(1 for i, u in enumerate(uniform) if not u and i not in finite.bad),
        "train/tokens_trained": sum(sum(m) for i in keep for m in roll.loss_mask[i]),
        **({"train/overlong_share": sum(c for t in roll.truncated for c in t) / len(flat)} if roll.truncated
           else {}),
        "train/groups_skipped_all_correct": sum(1 for i, u in enumerate(uniform)
                                                if ro.skip_uninformative and u and all(roll.correct[i])),
        "train/groups_skipped_all_wrong": sum(1 for i, u in enumerate(uniform)
                                              if ro.skip_uninformative and u and not all(roll.correct[i])),
        "train/completion_len": roll.num_tokens / len(flat),
        "rollout/tokens_per_s": roll.num_tokens / max(t_gen, 1e-9),
        "rollout/adapter_version": version,
        "credit/sepa_lambda": lam,
        "credit/sepa_gate_open": float(sepa.gate_open),
        **(filtered.metrics if rv.enabled else {}),
        **finite.metrics,
        **metrics,
        "time/generate_s": t_gen,
    }
    if not keep:
        return Prepared(row, None, correct_rate, keep)

    def rows(groups):
        return [x for i in keep for x in groups[i]]

    batch = LearnerBatch(
        prompt_ids=rows(roll.prompt_ids), response_ids=rows(roll.response_ids),
        loss_mask=rows(roll.loss_mask), rollout_logprobs=rows(roll.logprobs),
        rewards=[rewards[i] for i in keep],
        temperature=ro.temperature, sepa_lambda=lam, step=step,
        loss_scale=filtered.loss_scale, action_token_ids=actions,
        tis_cap=ro.tis_cap if ro.correction == "tis" else None, offpolicy=offpolicy_settings(ro),
        want_uncertainty="sepa" in cfg.credit.stages,  # the report's mechanistic histogram
        reward_positions=rows(roll.extra["reward_positions"]) if "reward_positions" in roll.extra else None,
        turn_rewards=rows(roll.extra["turn_rewards"]) if "turn_rewards" in roll.extra else None,
        sampled_mask=rows(roll.extra["sampled_mask"]) if "sampled_mask" in roll.extra else None,
    )
    return Prepared(row, batch, correct_rate, keep)


def absorb(prep: Prepared, roll: Rollouts, out: StepResult | None, sepa: SepaController) -> StepOutcome:
    """The learner's result into the step's outcome (metrics into the row; uncertainty samples, advantages);
    SEPA observes the step. The version is the one sampled with until the new policy is pushed."""
    sepa.observe(prep.correct_rate, out.exec_values if out is not None else None)
    if out is None:
        return StepOutcome(prep.row, roll, prep.kept, 0)
    prep.row.update(out.metrics)
    return StepOutcome(prep.row, roll, prep.kept, 0, out.uncertainty,
                       (out.episode_advantages, out.token_advantage_means))


def push_policy(ctx: TrialContext, version: int) -> int:
    """The learner's policy (adapter or full weights) as `version` on every engine; returns `version`. With no
    engine (a replay without evaluation: replay.py) nothing is exported."""
    if not ctx.engines.count:
        return version
    return ctx.engines.load_policy(ctx.learner.export_policy(version))


class TrainingStep:
    """The one step sequence, for every `rollout.mode`: the step's groups (collected now, or sampled ahead) ->
    prepare -> [colocated: engines sleep] -> the learner trains -> [engines wake their weights] -> push the new
    policy -> [engines wake their KV cache].

    The modes differ only in how far ahead the generator samples (staleness.py: `Admission`): while the learner
    trains on step t the driver collects the batches of steps t+1 .. t+lookahead that it does not hold yet, with the
    policy the engines hold, kept in `queue` (each with the version it was sampled with; saved in the checkpoint:
    prefetch.py) and trained oldest first. sync: lookahead 0; one_step_off (`overlap`): 1; async: max_staleness,
    or one more under discard, whose groups past the bound are dropped. With a lookahead its row adds
    `rollout/staleness`, `time/prefetch_s` and `time/learner_wait_s`; async rows add `async/*`."""

    def __init__(self, ctx: TrialContext, source: RolloutSource, *, overlap: bool = False,
                 pending: tuple[Rollouts, int] | list[tuple[Rollouts, int]] | None = None,
                 admission: Admission | None = None, inflight: CompletionQueue | None = None):
        self.ctx, self.source = ctx, source
        self.admission = admission or Admission(bound=int(overlap))
        self.overlap = self.admission.lookahead > 0
        self.queue: deque[tuple[Rollouts, int]] = deque()  # batches of steps t+1, t+2, ..., and their versions
        self.pending = pending
        # rollout.decode_per_step under discard: groups admitted as they complete (completion.py)
        self.clock = inflight if inflight is not None else \
            CompletionQueue(self.admission.clock, self.admission.bound) if self.admission.clock else None
        self.labels = list(ctx.cfg.task.labels) if is_mix(ctx.cfg) else []
        self.timeline: list[dict] = []  # driver-side intervals of the latest steps (tests, benchmarks)

    @property
    def pending(self) -> tuple[Rollouts, int] | None:
        """The next step's batch sampled ahead and its version (None when none is held)."""
        return self.queue[0] if self.queue else None

    @pending.setter
    def pending(self, value: tuple[Rollouts, int] | list[tuple[Rollouts, int]] | None) -> None:
        items = [] if value is None else value if isinstance(value, list) else [value]
        self.queue = deque((r if r.policy_versions else stamp(r, v), v) for r, v in items)

    @classmethod
    def for_trial(cls, ctx: TrialContext, source: RolloutSource,
                  pending: tuple[Rollouts, int] | list[tuple[Rollouts, int]] | None = None,
                  inflight: CompletionQueue | None = None) -> TrainingStep:
        """The trial's step: sampling ahead as `rollout.mode` (and max_staleness, admission, decode_per_step)
        say; `pending` / `inflight`: a checkpoint's batches sampled ahead / groups in flight."""
        return cls(ctx, source, pending=pending, admission=Admission.for_rollout(ctx.cfg.rollout), inflight=inflight)

    def _batch(self, step: int, version: int) -> tuple[Rollouts, int, set[int], list[int], bool]:
        """Step `step`'s groups, the (oldest) version they were sampled with, which of them were sampled at an
        earlier step, those dropped past the bound, and whether the versions were checked at sampling: the oldest
        queued batch, else collected now; under the clock the groups completed by now (completion.py)."""
        if self.clock is not None:
            if not self.clock.has(step):
                roll = self.source.collect(step)
                check_versions(self.ctx, roll, version)
                self.clock.add(stamp(roll, version), version, step, step, inline=True)
            taken = self.clock.take(step, version)
            oldest = min(v for v, _ in taken.roll.policy_versions)
            return taken.roll, oldest, taken.delayed, taken.dropped, True
        if self.queue:
            roll, sampled_with = self.queue.popleft()
            delayed = set(range(len(roll)))
        else:
            roll, sampled_with, delayed = stamp(self.source.collect(step), version), version, set()
        return roll, sampled_with, delayed, self.admission.dropped(group_staleness(roll, version)), False

    def _sample_ahead(self, step: int, version: int) -> None:
        """While the learner trains step `step`: the batches of the next steps up to the lookahead, with the policy
        the engines hold (`version`)."""
        if self.clock is not None:
            nxt = self.clock.next_index(step)
            while nxt <= step + self.admission.lookahead and nxt < self.ctx.cfg.steps:
                roll = self.source.collect(nxt)
                check_versions(self.ctx, roll, version)
                self.clock.add(stamp(roll, version), version, nxt, step)
                nxt += 1
            return
        while len(self.queue) < self.admission.lookahead and step + len(self.queue) + 1 < self.ctx.cfg.steps:
            nxt = step + len(self.queue) + 1
            self.queue.append((stamp(self.source.collect(nxt), version), version))

    def run(self, step: int, sepa: SepaController, version: int) -> StepOutcome:
        """Train on step `step`; `version`: the policy the engines (and the learner) hold. Returns the step's
        outcome, whose `version` is the policy the engines hold after it."""
        ctx, learner, adm = self.ctx, self.ctx.learner, self.admission
        roll, sampled_with, delayed, dropped, checked = self._batch(step, version)
        staleness = group_staleness(roll, version)
        prep = prepare(ctx, step, roll, sepa, sampled_with, exclude=frozenset(dropped), checked=checked)
        row, batch = prep.row, prep.batch
        if self.overlap or adm.log:
            row["rollout/staleness"] = version - sampled_with
        if adm.log:
            row.update(staleness_metrics(roll, staleness, prep.kept, dropped, delayed, adm.bound, self.labels))
        row.update(ctx.phases.before_train(step, trains=batch is not None))  # colocated: engines sleep
        t0 = time.perf_counter()
        future = learner.submit_train_step(batch) if batch is not None else None
        t1, w1 = time.perf_counter(), time.time()
        self._sample_ahead(step, version)  # overlaps the learner, with the policy the engines hold
        t2, w2 = time.perf_counter(), time.time()
        out = learner.result(future) if future is not None else None
        t_end = time.perf_counter()
        outcome = absorb(prep, roll, out, sepa)
        row["time/train_s"] = t_end - t0  # submit -> result (sampling ahead: the next steps' generation inside it)
        if self.overlap:
            row["time/prefetch_s"] = t2 - t1
            row["time/learner_wait_s"] = t_end - t2
            # wall-clock (time.time) interval of the next step's generation, comparable with other processes' clocks
            self.timeline = [*self.timeline[-7:], {"step": step, "prefetch": (w1, w2)}]
        row.update(ctx.phases.before_sync(step))  # colocated: engines wake their weights

        t0 = time.perf_counter()
        if batch is not None:  # a new policy only when the learner stepped
            version = push_policy(ctx, version + 1)
        row["time/sync_s"] = time.perf_counter() - t0
        row.update(ctx.phases.after_sync(step))  # colocated: engines wake their KV cache
        outcome.version = version
        return outcome

    def save(self, checkpoint_dir: str | Path) -> None:
        """Write the batches sampled ahead (if any) into a checkpoint directory (prefetch.py), or under the clock
        the groups in flight (completion.py)."""
        save_queue(checkpoint_dir, list(self.queue))
        save_inflight(checkpoint_dir, self.clock)
