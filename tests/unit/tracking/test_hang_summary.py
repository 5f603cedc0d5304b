"""A hang reaches the trial's W&B run: its summary names the phase, the actors, the step and why."""

from __future__ import annotations

from orchestrator.config.trial import TrialConfig
from orchestrator.tracking.run import TrialTracker
from orchestrator.trial.actors.calls import Hang


class FakeRun:
    def __init__(self):
        self.summary: dict = {}
        self.finished = False

    def finish(self):
        self.finished = True


def test_the_hang_goes_to_the_run_summary_and_the_run_is_flushed():
    tracker = TrialTracker(TrialConfig())  # wandb disabled: no run, recording is a no-op
    hang = Hang("train", ["learner[0]", "learner[1]"], ["learner[1]"], 45.0, step=2)
    tracker.record_hang(hang.event())
    run = FakeRun()
    tracker.run = run
    tracker.record_hang(hang.event())
    assert run.finished and tracker.run is None  # written out before the trial fails
    assert run.summary["hang/phase"] == "train" and run.summary["hang/actors"] == "learner[1]"
    assert run.summary["hang/step"] == 2 and "45 s deadline" in run.summary["hang/reason"]
