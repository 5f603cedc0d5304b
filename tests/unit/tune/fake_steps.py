"""One reported step of a fake Tune trial, for the scheduler tests that drive a scheduler by hand."""

from __future__ import annotations

from ray.tune.experiment import Trial


def report_step(sched, ctl, t, result: dict, steps: int) -> str:
    """`t` reports `result`: the scheduler decides, the step counts, and the trial ends (TERMINATED,
    `on_trial_complete`) at `steps`. Returns the scheduler's decision."""
    t.last_result = result
    decision = sched.on_trial_result(ctl, t, result)
    t.step += 1
    if t.step == steps:
        t.status = Trial.TERMINATED
        sched.on_trial_complete(ctl, t, result)
    return decision
