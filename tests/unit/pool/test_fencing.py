"""Fencing of a pool's slots (workers/fence.py): the registry gives every acquire a new epoch, the engine and the
learner learn it when the holder opens the slot, and a late call of the slot's previous holder is refused with one
line naming the slot, both epochs and the trial, while the new holder's calls go through. The shared engine against
the fake vLLM engine of tests/unit/rollout/test_shared_batching.py; the shared learner with a stand-in slot learner
(no model: what is fenced is which calls reach it)."""

from __future__ import annotations

import pytest

from orchestrator.pool.actors import _leased
from orchestrator.pool.slots import SlotTable
from tests.unit.rollout.test_shared_batching import _req, _update, worker  # noqa: F401 - `worker`: a fixture
from workers.fence import Fence, SlotLease, StaleLease
from workers.learner.config import LearnerConfig


def _two_holders() -> tuple[SlotLease, SlotLease]:
    """Trial A's lease on the pool's one slot, then B's after the campaign driver released A's."""
    table = SlotTable(1)
    old = table.acquire("A_s0", "driver-a")
    table.release("A_s0")
    return old, table.acquire("B_s0", "driver-b")


def test_a_stale_epoch_is_refused_with_the_slot_the_epochs_and_the_trial():
    old, new = _two_holders()
    assert (old.slot, old.epoch, new.slot, new.epoch) == (0, 1, 0, 2)
    fence = Fence(1)
    fence.open(old)
    fence.check(old)  # the holder's own calls
    fence.open(new)
    with pytest.raises(StaleLease) as e:
        fence.check(old)
    assert str(e.value) == ("slot 0: call of trial A_s0 at epoch 1 refused, the slot is at epoch 2 (trial B_s0): "
                            "a late call of an earlier holder")
    with pytest.raises(StaleLease):
        fence.open(old)  # nor may the old holder open it again
    fence.check(new)
    fence.check(0)  # a bare slot (the engine used alone) is not fenced; the pool's actors refuse one:
    with pytest.raises(TypeError, match="SlotLease"):
        _leased(0)


def test_the_engine_refuses_the_previous_holders_late_calls(worker):  # noqa: F811 - the fixture
    w, llm = worker
    old, new = _two_holders()
    w.drop(old)
    w.load_policy(old, _update(1))
    assert w.generate(old, [[10]], _req(1)).adapter_version == 1
    w.drop(new)  # the new holder opens the slot
    for late in (lambda: w.generate(old, [[11]], _req(2)), lambda: w.load_policy(old, _update(2)),
                 lambda: w.drop(old)):
        with pytest.raises(StaleLease, match="slot 0: call of trial A_s0 at epoch 1 refused, the slot is at epoch "
                                             "2 \\(trial B_s0\\)"):
            late()
    assert w.adapter_version(new) is None  # the late load did not land on B's slot
    w.load_policy(new, _update(7))
    assert w.generate(new, [[12]], _req(3)).adapter_version == 7


class _SlotLearner:
    """A slot's learner stand-in: records which trial's calls reach it."""

    def __init__(self, base, *, learner, credit, interventions, run):
        self.seed, self.calls = run.seed, []

    prepared = None  # a threading.Event set by `prepare`, when a test wants to see it run

    def prepare(self, batch):
        if self.prepared is not None:
            self.prepared.set()
        return batch

    def train_prepared(self, batch):
        self.calls.append(("train", batch))
        return batch

    def export_policy(self, version):
        return ("policy", self.seed, version)

    def checkpoint_files(self):
        return {"learner.pt": bytes([self.seed])}


def test_the_learner_refuses_the_previous_holders_late_calls(monkeypatch):
    import workers.learner.pool.shared as shared

    monkeypatch.setattr(shared, "SharedBase", lambda path: None)
    monkeypatch.setattr(shared, "SlotLearner", _SlotLearner)
    pool = shared.SharedLearner("model", slots=1)
    old, new = _two_holders()

    def settings(seed: int) -> dict:
        return {"learner": LearnerConfig(), "credit": None, "interventions": None,
                "run": type("Run", (), {"seed": seed})()}

    pool.open(old, **settings(1))
    assert pool.train_step(old, "a0") == "a0"
    pool.open(new, **settings(2))
    for late in (lambda: pool.train_step(old, "a1"), lambda: pool.export_policy(old, 1),
                 lambda: pool.checkpoint_files(old), lambda: pool.restore(old, {}), lambda: pool.close(old),
                 lambda: pool.open(old, **settings(1))):
        with pytest.raises(StaleLease, match="slot 0: call of trial A_s0 at epoch 1 refused, the slot is at epoch "
                                             "2 \\(trial B_s0\\)"):
            late()
    assert pool.learner(new).seed == 2 and pool.learner(new).calls == []  # nothing of A reached B's learner
    assert pool.train_step(new, "b0") == "b0" and pool.export_policy(new, 1) == ("policy", 2, 1)


def test_a_learner_of_several_refuses_another_learners_slot():
    """Learner j of L serves the slots s with s mod L = j (orchestrator/config/pool_key.py:slot_learner): a call
    for another learner's slot is refused in one line before it reaches any slot."""
    from orchestrator.pool.actors import PoolLearnerActor

    actor = PoolLearnerActor.__new__(PoolLearnerActor)  # no model: only the slot's check
    actor._slots, actor.place = [None] * 4, (1, 2)
    assert actor._index(SlotLease(3, 1, "T")) == 3
    with pytest.raises(ValueError, match=r"slot 2 trains on learner 0 of the pool's 2, not on learner 1 \(trial T\)"):
        actor._index(SlotLease(2, 1, "T"))


def test_a_train_steps_cpu_preparation_runs_beside_another_slots_call(monkeypatch):
    """While another slot's call holds the learner's device lock, a slot's train step prepares its batch
    (Learner.prepare: CPU only) and only then waits for the lock; its training runs once the lock is free."""
    import threading

    import workers.learner.pool.shared as shared

    monkeypatch.setattr(shared, "SharedBase", lambda path: None)
    monkeypatch.setattr(shared, "SlotLearner", _SlotLearner)
    pool = shared.SharedLearner("model", slots=2)
    run = type("Run", (), {"seed": 1})()
    pool.open(1, learner=LearnerConfig(), credit=None, interventions=None, run=run)
    pool.learner(1).prepared = threading.Event()
    out = []
    with pool._lock:  # another slot's step under way
        step = threading.Thread(target=lambda: out.append(pool.train_step(1, "b")))
        step.start()
        assert pool.learner(1).prepared.wait(10)  # prepared while the device lock is held
        step.join(0.2)
        assert step.is_alive() and out == [] and pool.learner(1).calls == []  # training waits for the lock
    step.join(10)
    assert out == ["b"] and pool.learner(1).calls == [("train", "b")]
