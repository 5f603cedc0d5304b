"""A fake of Tune's controller and one reported step of a fake Tune trial, for the scheduler tests that drive a
scheduler by hand."""

from __future__ import annotations

from types import SimpleNamespace

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


class Controller:
    """What a scheduler asks of Tune's controller: the trials, and stopping one."""

    def __init__(self, trials):
        self.trials = trials

    def get_trials(self):
        return self.trials

    def stop_trial(self, trial):
        trial.status = Trial.TERMINATED


def add_trials(sched, names: list[str]) -> tuple[list, Controller]:
    """Fake pending trials named `names`, each added to `sched` as Tune adds them; and the controller."""
    trials = [SimpleNamespace(config={"trial": n}, status=Trial.PENDING, last_result={}, step=0) for n in names]
    ctl = Controller(trials)
    for t in trials:
        sched.on_trial_add(ctl, t)
    return trials, ctl
