"""One training step's pieces, shared by the sync loop (`one_step`) and one_step_off (orchestrator/trial/one_step_off.py):
collect (from the trial's rollout source, orchestrator/trial/sources.py: prompts -> completions -> rewards, or
levels -> episodes -> returns; this module never asks which; refill rounds and rollout.overlong: fill.py) ->
prepare (check the adapter, drop uninformative / non-finite groups, build the row and the learner batch) -> train -> absorb (SEPA observes the step) ->
push_policy (the new policy to every worker)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from orchestrator.trial.context import TrialContext
from orchestrator.trial.fill import usable_groups
from orchestrator.trial.samples import SampleGroup
from orchestrator.trial.sources import Rollouts, RolloutSource
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


def prepare(ctx: TrialContext, step: int, roll: Rollouts, sepa: SepaController,
            version: int) -> Prepared:
    """Check the adapter `roll` was sampled with (`version`), drop uninformative groups, and build the step's
    row and learner batch (None when no group is kept)."""
    cfg, actions = ctx.cfg, ctx.actions
    ro = cfg.rollout
    expected = version or None
    if roll.versions - {expected}:
        raise RuntimeError(f"a rollout worker sampled with adapter {sorted(roll.versions - {expected}, key=str)}, "
                           f"expected {expected}")
    usable = usable_groups(cfg, roll)  # over every sampled group; the refill's choice (roll.train) wins
    finite, filtered, uniform = usable.finite, usable.filtered, usable.uniform
    rewards = finite.rewards  # a dropped group's rewards count as 0 in the statistics below
    flat = [r for g in rewards for r in g]
    correct_rate = sum(c for g in roll.correct for c in g) / len(flat)
    rv = cfg.interventions.rv_filter
    keep = [i for i, t in enumerate(roll.train) if t] if roll.train else usable.keep

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
        loss_scale=filtered.loss_scale, action_token_ids=actions, tis_cap=ro.tis_cap,
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
    """The learner's policy (adapter or full weights) as `version` on every worker; returns `version`."""
    return ctx.learner.push_policy(ctx.workers, version)


def one_step(ctx: TrialContext, source: RolloutSource, step: int, sepa: SepaController,
             version: int) -> StepOutcome:
    """Collect (the source's groups) -> drop uninformative groups -> [colocated: engines sleep] -> train ->
    [engines wake their weights] -> push the new policy -> [engines wake their KV cache]."""
    roll = source.collect(step)
    prep = prepare(ctx, step, roll, sepa, version)
    row, batch = prep.row, prep.batch
    row.update(ctx.phases.before_train(step, trains=batch is not None))  # colocated: engines sleep
    t0 = time.perf_counter()
    out = ctx.learner.train_step(batch) if batch is not None else None
    outcome = absorb(prep, roll, out, sepa)
    row["time/train_s"] = time.perf_counter() - t0
    row.update(ctx.phases.before_sync(step))  # colocated: engines wake their weights

    t0 = time.perf_counter()
    if batch is not None:  # a new policy only when the learner stepped
        version = push_policy(ctx, version + 1)
    row["time/sync_s"] = time.perf_counter() - t0
    row.update(ctx.phases.after_sync(step))  # colocated: engines wake their KV cache
    outcome.version = version
    return outcome
