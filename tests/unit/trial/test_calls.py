"""Deadlines of the trial loop's actor calls (orchestrator/trial/actors/calls.py), without Ray: a fake `ray.wait` /
`ray.get` over fake refs, so a late actor is a ref that never becomes ready. The real stack (a frozen engine core,
a frozen learner rank): tests/integration/trial/test_faults.py, tests/integration/trial/test_full_mode.py."""

from __future__ import annotations

import statistics
from types import SimpleNamespace

import pytest
from hypothesis import given
from hypothesis import strategies as st

import orchestrator.trial.actors.calls as calls_mod
from orchestrator.config.sections import TimeoutsConfig
from orchestrator.trial.actors.calls import Calls, Deadlines, Hang, PhaseTimeout, check_health


class Ref:
    def __init__(self, value, ready=True):
        self.value, self.ready = value, ready


class FakeRay:
    """`wait` returns the ready refs and the rest after recording the timeout it was given; `get` the values."""

    def __init__(self):
        self.timeouts: list[float] = []

    def wait(self, refs, num_returns, timeout):
        self.timeouts.append(timeout)
        ready = [r for r in refs if r.ready][:num_returns]
        return ready, [r for r in refs if r not in ready]

    def get(self, refs):
        if isinstance(refs, list):
            return [r.value for r in refs]
        return refs.value


class Actor:
    """An actor handle whose `health` answers (alive) or never answers (frozen)."""

    def __init__(self, frozen: bool):
        self.health = SimpleNamespace(remote=lambda: Ref({"pid": 1, "ok": True}, ready=not frozen))


@pytest.fixture
def fake_ray(monkeypatch):
    fake = FakeRay()
    monkeypatch.setattr(calls_mod, "ray", fake)
    return fake


def test_fixed_deadlines_and_the_adaptive_rule():
    d = Deadlines(TimeoutsConfig(train=7.0, multiple=3.0, min_s=10.0, first_s=100.0, warmup=2, window=3))
    assert d.deadline("train") == 7.0 and d.deadline("health") == 60.0 and d.deadline("setup") == 3600.0
    assert d.deadline("generate") == 100.0  # nothing seen yet: the first steps' floor
    d.record("generate", 20.0)
    assert d.deadline("generate") == 100.0  # one duration < warmup
    d.record("generate", 2.0)
    assert d.deadline("generate") == 33.0  # 3 x median(20, 2) = 33
    d.record("generate", 2.0)
    d.record("generate", 2.0)  # the window (3) forgets the 20
    assert d.deadline("generate") == 10.0  # 3 x 2 = 6 < min_s
    with pytest.raises(ValueError, match="unknown phase"):
        d.deadline("score")


@given(st.lists(st.floats(0.001, 1e4), min_size=1, max_size=40), st.floats(1.0, 20.0), st.integers(1, 10))
def test_adaptive_deadline_is_the_multiple_of_the_windows_median(durations, multiple, window):
    cfg = TimeoutsConfig(multiple=multiple, min_s=1.0, first_s=1e9, warmup=1, window=window)
    d = Deadlines(cfg)
    for x in durations:
        d.record("sync", x)
    assert d.deadline("sync") == max(1.0, multiple * statistics.median(durations[-window:]))


def test_ready_calls_return_their_values_and_teach_the_median(fake_ray):
    calls = Calls(Deadlines(TimeoutsConfig(first_s=50.0, min_s=1.0, warmup=1)))
    a = Actor(frozen=False)
    assert calls.get([Ref(1), Ref(2)], "generate", [("rollout[0]", a), ("rollout[1]", a)]) == [1, 2]
    assert calls.get(Ref(3), "train", [("learner[0]", a)]) == 3
    assert fake_ray.timeouts == [50.0, 50.0]  # first_s before any duration
    assert len(calls.deadlines.recent["generate"]) == 1


def test_a_late_call_names_the_phase_the_late_actors_and_the_frozen_one(fake_ray):
    seen: list[Hang] = []
    calls = Calls(Deadlines(TimeoutsConfig(train=5.0)), on_hang=seen.append)
    calls.step = 4
    busy, frozen = Actor(frozen=False), Actor(frozen=True)
    refs = [Ref(None, ready=False), Ref(None, ready=False)]  # rank 0 waits in a collective on frozen rank 1
    with pytest.raises(PhaseTimeout, match="hang in phase 'train' at step 4") as err:
        calls.get(refs, "train", [("learner[0]", busy), ("learner[1]", frozen)])
    hang = err.value.hang
    assert seen == [hang]  # the loop's handler ran before the raise
    assert hang.late == ["learner[0]", "learner[1]"] and hang.frozen == ["learner[1]"]
    assert set(hang.health) == {"learner[0]"} and hang.deadline_s == 5.0
    event = hang.event()
    assert event["event"] == "hang" and event["phase"] == "train" and event["step"] == 4
    assert "frozen (no health answer): learner[1]" in event["reason"]
    assert fake_ray.timeouts[0] == 5.0


def test_a_late_worker_whose_engine_is_stopped_says_so(fake_ray):
    class Alive:  # answers health on its own thread while its generate waits on the frozen engine
        health = SimpleNamespace(remote=lambda: Ref({"pid": 2, "ok": False, "reason": "process 9 (X) is stopped"}))

    calls = Calls(Deadlines(TimeoutsConfig(generate=3.0)))
    with pytest.raises(PhaseTimeout) as err:
        calls.get([Ref(None, ready=False)], "generate", [("rollout[0]", Alive())])
    hang = err.value.hang
    assert hang.frozen == [] and hang.reason == "rollout[0]: process 9 (X) is stopped"
    assert str(err.value) == "hang in phase 'generate': rollout[0]: process 9 (X) is stopped"  # the name once


def test_wait_each_yields_as_ready_and_fails_on_the_late_one(fake_ray):
    calls = Calls(Deadlines(TimeoutsConfig(checkpoint=9.0)))
    a = Actor(frozen=False)
    assert list(calls.wait_each([Ref("x"), Ref("y")], "checkpoint", [("learner[0]", a), ("learner[1]", a)])) \
        == ["x", "y"]
    got = []
    with pytest.raises(PhaseTimeout) as err:
        for v in calls.wait_each([Ref("x"), Ref(None, ready=False)], "checkpoint",
                                 [("learner[0]", a), ("learner[1]", Actor(frozen=True))]):
            got.append(v)
    assert got == ["x"] and err.value.hang.late == ["learner[1]"] and err.value.hang.frozen == ["learner[1]"]


def test_an_unhealthy_engine_fails_before_the_phase(fake_ray):
    class Sick:
        health = SimpleNamespace(remote=lambda: Ref({"pid": 2, "ok": False, "reason": "process 9 (X) is stopped"}))

    seen: list[Hang] = []
    calls = Calls(on_hang=seen.append)
    ok = Actor(frozen=False)
    assert check_health(calls, [("rollout[0]", ok)]) == [{"pid": 1, "ok": True}]
    with pytest.raises(PhaseTimeout, match="rollout\\[1\\]: process 9 \\(X\\) is stopped"):
        check_health(calls, [("rollout[0]", ok), ("rollout[1]", Sick())])
    assert seen[0].phase == "health" and seen[0].late == ["rollout[1]"]


def test_a_phase_timeout_survives_copy_and_pickle():
    """Tune copies a failed trial's exception and Ray pickles it: both must give back the same hang and message
    (a copy once raised AttributeError instead, which became the trial's recorded error)."""
    import copy
    import pickle

    err = PhaseTimeout(Hang("generate", ["rollout[0]"], [], 45.0, step=3, reason="process 9 (X) is stopped"))
    for again in (copy.copy(err), pickle.loads(pickle.dumps(err))):
        assert type(again) is PhaseTimeout and str(again) == str(err) and again.hang == err.hang
