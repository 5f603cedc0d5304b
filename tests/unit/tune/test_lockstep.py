"""The lockstep scheduler's decisions, driven as Tune's controller drives them (fake trials, no Ray): turns on
one slot, no trial a round ahead, the budget ending the campaign at a boundary, status lines from events.jsonl.
The real stack: tests/integration/campaign/test_lockstep.py."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

import pytest
from ray.tune.experiment import Trial
from ray.tune.schedulers import TrialScheduler

from orchestrator.campaign.sections import BudgetConfig
from orchestrator.storage import campaign_events
from orchestrator.tune.lockstep import LockstepScheduler
from tests.unit.tune.fake_steps import Controller, add_trials, report_step


def _drive(sched: LockstepScheduler, names: list[str], steps: int, hours_per_step: float = 0.0):
    """Run the trials as Tune would: start what the scheduler chooses, feed one result per step until it says
    PAUSE / STOP or the trial ends. Returns the executed (trial, step) in order."""
    trials, ctl = add_trials(sched, names)
    ran = []
    while (t := sched.choose_trial_to_run(ctl)) is not None:
        t.status = Trial.RUNNING
        while True:
            ran.append((t.config["trial"], t.step))
            result = {"step": t.step, "time_this_iter_s": hours_per_step * 3600}
            decision = report_step(sched, ctl, t, result, steps)
            if t.status == Trial.TERMINATED:
                break
            if decision == TrialScheduler.PAUSE:
                t.status = Trial.PAUSED
                break
            if decision == TrialScheduler.STOP:
                t.status = Trial.TERMINATED
                break
    return ran, trials


def _scheduler(tmp_path, names, steps, **kw):
    return LockstepScheduler(2, dict.fromkeys(names, steps), dict.fromkeys(names, 1.0), str(tmp_path), **kw)


def test_one_slot_takes_turns_round_by_round(tmp_path):
    names = ["A_s0", "B_s0", "C_s0", "A_s1", "B_s1", "C_s1"]
    ran, trials = _drive(_scheduler(tmp_path, names, 6, slots=1), names, 6)
    assert all(t.status == Trial.TERMINATED and t.step == 6 for t in trials)
    # every step of round r runs after every trial's last step of round r - 1
    for i, (name, step) in enumerate(ran):
        r = step // 2
        for other in names:
            before = [s for n, s in ran[:i] if n == other]
            assert not r or (before and max(before) >= 2 * r - 1), (name, step, other)
    assert [n for n, s in ran if s == 0] == names  # round 1 in campaign order, then round 2, ...
    rounds = [e["round"] for e in campaign_events(str(tmp_path)) if e["event"] == "round"]
    assert rounds == [1, 2]


def test_fifo_would_not_be_lockstep(tmp_path):
    """The check above fails for a scheduler that never pauses (what the test guards against)."""
    names = ["A_s0", "B_s0"]

    class Fifo(LockstepScheduler):
        def on_trial_result(self, *a):
            return TrialScheduler.CONTINUE

    ran, _ = _drive(Fifo(2, dict.fromkeys(names, 4), dict.fromkeys(names, 1.0), str(tmp_path), slots=1), names, 4)
    assert ran[:4] == [("A_s0", 0), ("A_s0", 1), ("A_s0", 2), ("A_s0", 3)]  # A runs round 2 before B's round 1


def test_gpu_hour_budget_ends_every_trial_at_the_same_step(tmp_path):
    names = ["A_s0", "B_s0", "C_s0"]
    # 0.5 GPU-hours a step: a round of 3 trials x 2 steps costs 3; after round 1, 3 + 3 > 5 ends it
    sched = _scheduler(tmp_path, names, 10, slots=1, budget=BudgetConfig(gpu_hours=5))
    ran, trials = _drive(sched, names, 10, hours_per_step=0.5)
    assert {t.step for t in trials} == {2} and sched.stopped
    stop = [e for e in campaign_events(str(tmp_path)) if e["event"] == "budget_stop"]
    assert stop[0]["step"] == 1 and "3 GPU-hours spent" in stop[0]["reason"]
    # a budget that covers two rounds (3 + 3 <= 7.5, 6 + 3 > 7.5) stops after round 2
    sched = _scheduler(tmp_path / "b", names, 10, slots=1, budget=BudgetConfig(gpu_hours=7.5))
    _, trials = _drive(sched, names, 10, hours_per_step=0.5)
    assert {t.step for t in trials} == {4}


def test_deadline_in_the_past_ends_at_the_first_boundary(tmp_path):
    names = ["A_s0", "B_s0"]
    past = datetime.now(UTC) - timedelta(minutes=1)
    _, trials = _drive(_scheduler(tmp_path, names, 6, budget=BudgetConfig(deadline=past)), names, 6)
    assert {t.step for t in trials} == {2}


def test_budget_state_survives_a_new_driver(tmp_path):
    names = ["A_s0", "B_s0"]
    sched = _scheduler(tmp_path, names, 4, slots=1)
    _drive(sched, names, 4, hours_per_step=0.25)
    again = _scheduler(tmp_path, names, 4, slots=1)
    again.on_trial_add(Controller([]), SimpleNamespace(config={"trial": "A_s0"}, status=Trial.PENDING,
                                                       last_result={"step": 1}))
    assert again.spent == pytest.approx(1.0) and again.boundary == 1 and again.rounds["A_s0"] == 1


def test_status_shows_round_budget_and_looks(tmp_path):
    from orchestrator.jobs.status import schedule_lines

    names = ["A_s0", "B_s0"]
    _drive(_scheduler(tmp_path, names, 10, budget=BudgetConfig(gpu_hours=1)), names, 10, hours_per_step=0.25)
    cfg = SimpleNamespace(schedule=SimpleNamespace(mode="lockstep", round_steps=2), budget=None, adaptive=None)
    campaign = SimpleNamespace(config=cfg, directory=str(tmp_path),
                               trials=[SimpleNamespace(trial=SimpleNamespace(steps=10))] * 2)
    lines = schedule_lines(campaign)
    assert lines[0].startswith("lockstep: round 1 of 5 finished by every unfinished trial (2 steps a round)")
    assert lines[1].startswith("budget: ended after step 1 (round 1)")


def test_seeds_added_by_a_look_run_their_rounds_under_the_budget(tmp_path):
    first, later = ["A_s0", "B_s0"], ["A_s1", "B_s1"]
    sched = LockstepScheduler(2, dict.fromkeys(first + later, 6), dict.fromkeys(first + later, 1.0), str(tmp_path),
                              BudgetConfig(gpu_hours=100), slots=1, expected=first)
    _drive(sched, first, 6, hours_per_step=0.5)
    sched.expect(later)  # what the adaptive searcher does after a look
    _drive(sched, later, 6, hours_per_step=0.5)
    rounds = [e["round"] for e in campaign_events(str(tmp_path)) if e["event"] == "round"]
    assert rounds == [1, 2, 1, 2]  # the later seeds' boundaries are recorded (and budget-checked) too


def test_a_scheduler_pickled_with_an_int_slots_still_counts_them(tmp_path):
    import pickle

    sched = _scheduler(tmp_path, ["A_s0", "B_s0"], 4, slots=1)
    state = dict(sched.__dict__)
    del state["cap"]
    state["slots"] = 1  # what an earlier version pickled
    old = LockstepScheduler.__new__(LockstepScheduler)
    old.__setstate__(state)
    again = pickle.loads(pickle.dumps(old))
    again.active = {"A_s0"}
    assert not again.has_slot("B_s0") and again.cap.limit == 1 and not hasattr(again, "slots")
