"""`eval.sets` (orchestrator/config/eval_sets.py): more held-out sets, each evaluated like the task's own.

A set is evaluated by the rollout source of its own task (sources.py: `SingleTurnSource` / `EpisodeSource`) on a
context that differs from the trial's only in the task, `eval.problems` and the task's action ids, so its seeds
and sampling settings are the trial's held-out ones (`EVAL_SEED_OFFSET`, `eval.n`, `eval.temperature`): a
function of (seed, step) only. Its metrics come back as `eval/<set>/...` (`time/eval_<set>_s`), beside the task's
own `eval/...`. `python -m orchestrator eval` (offline_eval.py) builds the same contexts around a checkpoint.
The sets' generations are not written to the samples files (the task's own are).
"""

from __future__ import annotations

import dataclasses

from orchestrator.config.eval_sets import EvalSetConfig
from orchestrator.config.sections import EvalConfig
from orchestrator.tracking.names import eval_set_metric, eval_set_time
from orchestrator.trial.actors.context import TrialContext
from orchestrator.trial.collect.sampling import action_ids
from orchestrator.trial.collect.sources import rollout_source
from workers.tasks import make_task


def set_context(ctx: TrialContext, s: EvalSetConfig | None, ev: EvalConfig | None = None) -> TrialContext:
    """`ctx` for evaluating set `s` (None: the task's own held-out set) under `ev` (None: the trial's `eval`);
    a set with its own task gets a new task object (close it: `close_context`)."""
    cfg = ctx.cfg
    ev = (ev or cfg.eval).model_copy(update={"problems": s.problems} if s is not None and s.problems else {})
    if s is None or s.task is None:
        set_cfg = cfg.model_copy(update={"eval": ev})
        return dataclasses.replace(ctx, cfg=set_cfg)
    set_cfg = cfg.model_copy(update={"task": s.task, "eval": ev})
    task = make_task(s.task, cfg.seed)
    return dataclasses.replace(ctx, cfg=set_cfg, task=task, actions=action_ids(set_cfg, task, ctx.tokenizer))


def close_context(ctx: TrialContext, trial: TrialContext) -> None:
    if ctx.task is not trial.task:
        ctx.task.close()


def under_set(name: str, metrics: dict) -> dict:
    """A source's held-out metrics renamed for set `name`: `eval/x` -> `eval/<name>/x`, `time/eval_s` ->
    `time/eval_<name>_s`."""
    out = {}
    for key, value in metrics.items():
        if key == "time/eval_s":
            out[eval_set_time(name)] = value
        elif key.startswith("eval/"):
            out[eval_set_metric(name, key.removeprefix("eval/"))] = value
    return out


class EvalSets:
    """The trial's `eval.sets`, built once (their tasks too); `evaluate(step)` right after the task's own
    held-out evaluation (loop.py), with the same policy."""

    def __init__(self, ctx: TrialContext):
        self.trial = ctx
        self.sets = [(s.name, set_context(ctx, s)) for s in ctx.cfg.eval.sets]

    def evaluate(self, step: int) -> dict:
        row: dict = {}
        for name, ctx in self.sets:
            row.update(under_set(name, rollout_source(ctx).evaluate(step).metrics))
        return row

    def close(self) -> None:
        for _, ctx in self.sets:
            close_context(ctx, self.trial)
