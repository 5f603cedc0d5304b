"""A shared pool's learner restarted under a trial is the pool's fault, absorbed by the trial's client
(orchestrator/trial/actors/shared.py:PoolLearnerClient, restart.py): the call that meets it waits for the learner,
reopens the slot under the same lease and raises `LearnerRestarted` (the loop then restores the newest checkpoint in
process); a learner dead for good, or not back in time, fails in one line; any other error goes on as it is; and
every step's result passes the leak guard (leak_guard.py). A fake learner handle and fake deadlines, no Ray."""

from __future__ import annotations

import pytest
from ray.exceptions import ActorDiedError, ActorUnavailableError, GetTimeoutError

from orchestrator.config.trial import TrialConfig
from orchestrator.trial.actors import shared
from orchestrator.trial.actors.leak_guard import LEAK_GAP, AdapterLeak, check_rollout_policy
from orchestrator.trial.actors.ports import LearnerRestarted
from orchestrator.trial.actors.restart import await_learner, learner_lost
from workers.fence import SlotLease, SlotNotOpen
from workers.learner.inputs import StepResult

CFG = TrialConfig(model={"name": "tiny"}, task={"name": "arithmetic"}, learner={"mode": "lora"},
                  resources={"shared_base": {"slots": 2}}, timeouts={"setup": 30})
LEASE = SlotLease(1, 4, "grpo_s0")


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.now += s


def _unavailable() -> ActorUnavailableError:
    return ActorUnavailableError("The actor is temporarily unavailable: RpcError", b"\x00" * 16)


def test_await_learner_asks_until_the_restarted_learner_answers():
    clock, asked = Clock(), []

    def ping(left: float):
        asked.append(left)
        if len(asked) < 3:
            raise _unavailable() if len(asked) == 1 else GetTimeoutError("not yet")
        return True

    assert await_learner(ping, 30.0, "w", clock, clock.sleep) == pytest.approx(1.0)
    assert len(asked) == 3 and asked[0] == 30.0


def test_a_learner_dead_for_good_fails_in_one_line_naming_the_spent_budget():
    def ping(left: float):
        raise ActorDiedError()

    with pytest.raises(RuntimeError) as e:
        await_learner(ping, 30.0, "shared pool learner, slot 1 of trial grpo_s0")
    message = str(e.value)
    assert "\n" not in message and message.startswith("shared pool learner, slot 1 of trial grpo_s0: the learner is "
                                                      "dead for good") and "restart budget is spent" in message


def test_a_learner_not_back_in_time_fails_in_one_line():
    clock = Clock()

    def ping(left: float):
        raise _unavailable()

    with pytest.raises(RuntimeError, match=r"^w: the learner was not back from its restart in time \(waited 30 s"):
        await_learner(ping, 30.0, "w", clock, clock.sleep)


def test_what_counts_as_the_learner_lost():
    from ray.exceptions import RayTaskError

    assert learner_lost(_unavailable()) and learner_lost(ActorDiedError()) and learner_lost(SlotNotOpen("slot 1"))
    wrapped = RayTaskError("train_step", "traceback", SlotNotOpen("slot 1 is not open"))
    assert learner_lost(wrapped)
    assert not learner_lost(RayTaskError("train_step", "traceback", ValueError("bad batch")))
    assert not learner_lost(ValueError("bad batch"))


class Remote:
    """`handle.method.remote(*args)`: the outcome the test scripted for that method, as a thunk."""

    def __init__(self, handle, name):
        self.handle, self.name = handle, name

    def remote(self, *args, **kwargs):
        self.handle.seen.append((self.name, args, kwargs))
        outcome = self.handle.script.get(self.name, [None])
        value = outcome.pop(0) if len(outcome) > 1 else outcome[0]
        return value


class FakeLearner:
    def __init__(self, **script):
        self.script = {k: list(v) for k, v in script.items()}
        self.seen: list = []

    def __getattr__(self, name):
        return Remote(self, name)


class FakeCalls:
    def get(self, ref, phase, actors):
        if isinstance(ref, BaseException):
            raise ref
        return ref


def _client(monkeypatch, learner: FakeLearner) -> shared.PoolLearnerClient:
    monkeypatch.setattr(shared, "ready_within", lambda handle, s: True)
    client = shared.PoolLearnerClient(learner, LEASE, FakeCalls())
    client.open(CFG)
    return client


def _result(gap: float) -> StepResult:
    return StepResult(metrics={"train/logprob_gap_mean": gap}, exec_values=None)


def test_a_restart_under_a_call_reopens_the_slot_under_the_same_lease_and_says_so(monkeypatch):
    learner = FakeLearner(train_step=["handle"], export_policy=[_unavailable(), "update"],
                          checkpoint_files=[shared.ray.exceptions.RayTaskError("checkpoint_files", "tb",
                                                                               SlotNotOpen("slot 1 is not open"))])
    client = _client(monkeypatch, learner)
    for call in (lambda: client.export_policy(3), lambda: client.write_checkpoint("/nonexistent")):
        with pytest.raises(LearnerRestarted) as e:
            call()
        assert "slot 1 of trial grpo_s0: the learner restarted under the trial" in e.value.reason
        assert e.value.event(2)["event"] == "learner_restart" and e.value.event(2)["from_step"] == 2
    opens = [args for name, args, _ in learner.seen if name == "open"]
    assert opens == [(LEASE,)] * 3  # the first open, then one per restart, each under the trial's lease
    assert client.export_policy(3) == "update"  # the learner is back: calls go through


def test_a_restart_while_the_trial_connects_opens_the_slot_on_the_new_process_and_costs_no_retry(monkeypatch):
    """`connect`'s opening (open, then the slot's v0 adapter) meets the learner dying under `open`, then again under
    the export: each time it waits, opens the slot again under the same lease and goes on; nothing is raised (there
    is no checkpoint to restore yet), so the trial is not failed and retried."""
    monkeypatch.setattr(shared, "ready_within", lambda handle, s: True)
    learner = FakeLearner(open=[_unavailable(), None], export_policy=[ActorDiedError(), "v0"])
    client = shared.PoolLearnerClient(learner, LEASE, FakeCalls())
    assert client.open_fresh(CFG) == "v0"
    assert [name for name, _, _ in learner.seen] == ["open", "open", "export_policy", "open", "export_policy"]
    assert all(args == (LEASE,) for name, args, _ in learner.seen if name == "open")


def test_an_error_of_the_call_itself_is_not_a_restart(monkeypatch):
    learner = FakeLearner(restore=[ValueError("a damaged checkpoint")])
    client = _client(monkeypatch, learner)
    with pytest.raises(ValueError, match="damaged"):
        client.restore({}, "ckpt")
    assert [name for name, _, _ in learner.seen].count("open") == 1


def test_a_learner_dead_for_good_fails_the_call_in_one_line(monkeypatch):
    learner = FakeLearner(export_policy=[ActorDiedError()])
    client = _client(monkeypatch, learner)

    def dead(handle, s):
        raise ActorDiedError()

    monkeypatch.setattr(shared, "ready_within", dead)
    with pytest.raises(RuntimeError, match="dead for good") as e:
        client.export_policy(1)
    assert not isinstance(e.value, LearnerRestarted) and "\n" not in str(e.value)


def test_the_leak_guard_fails_a_step_sampled_under_another_adapter(monkeypatch):
    # measured (leak_guard.py): 5e-6 under the trial's own adapter, <= 0.055 one step off, 10.9 under another's
    for gap in (5e-6, 0.055):
        check_rollout_policy({"train/logprob_gap_mean": gap}, LEASE)
    check_rollout_policy({}, LEASE)  # no batch trained: nothing measured
    with pytest.raises(AdapterLeak) as e:
        check_rollout_policy({"train/logprob_gap_mean": 10.9}, LEASE)
    assert str(e.value) == (f"slot 1 of trial grpo_s0 (epoch 4): its rollouts' log-probs are 10.9 nats per token from "
                            f"the learner's, over the bound {LEAK_GAP:g}: they were sampled under another adapter than "
                            "the trial's")
    learner = FakeLearner(train_step=[_result(10.9), _result(0.01)])
    client = _client(monkeypatch, learner)
    with pytest.raises(AdapterLeak):  # where the pool's learner hands the step back
        client.result(client.submit_train_step(None))
    assert client.result(client.submit_train_step(None)).metrics["train/logprob_gap_mean"] == 0.01
