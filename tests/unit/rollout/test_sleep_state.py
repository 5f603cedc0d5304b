"""The rollout worker's record of its engine's sleep: the transitions it allows and the calls it refuses while
asleep (what keeps a colocated step's order on CPU, where vLLM's sleep is a no-op)."""

from __future__ import annotations

import pytest

from workers.rollout.sleep import SleepState


def test_sleep_then_wake_is_logged_in_order():
    s = SleepState()
    s.check_awake("generate")
    s.enter(2)
    with pytest.raises(RuntimeError, match="generate on a sleeping engine \\(level 2, asleep: weights, kv_cache\\)"):
        s.check_awake("generate")
    with pytest.raises(RuntimeError, match="already asleep"):
        s.enter(1)
    s.leave()
    s.check_awake("a policy update")
    s.enter(1)
    s.leave()
    assert s.log == [("sleep", 2), ("wake", "weights"), ("wake", "kv_cache"), ("sleep", 1), ("wake", "weights"),
                     ("wake", "kv_cache")]


def test_weights_wake_first_a_policy_loads_then_the_kv_cache_lets_it_sample():
    """A colocated step's order: a policy can load once the weights are back, sampling waits for the KV cache."""
    s = SleepState()
    s.enter(2)
    with pytest.raises(RuntimeError, match="a policy update on a sleeping engine \\(level 2, asleep: weights\\)"):
        s.check_awake("a policy update", needs=("weights",))
    s.leave(["weights"])
    s.check_awake("a policy update", needs=("weights",))
    with pytest.raises(RuntimeError, match="asleep: kv_cache\\)"):
        s.check_awake("generate")
    assert s.level == 2  # still asleep until every part is back
    with pytest.raises(RuntimeError, match="whose parts are awake"):
        s.leave(["weights"])
    s.leave(["kv_cache"])
    s.check_awake("generate")
    assert s.level == 0 and s.asleep == []


@pytest.mark.parametrize("level", [0, 3])
def test_only_levels_1_and_2(level):
    with pytest.raises(ValueError, match="sleep level must be 1"):
        SleepState().enter(level)


def test_waking_an_awake_engine_or_an_unknown_part_is_an_error():
    with pytest.raises(RuntimeError, match="on an engine whose parts are awake"):
        SleepState().leave()
    s = SleepState()
    s.enter(1)
    with pytest.raises(ValueError, match="wake_up parts must be among"):
        s.leave(["scheduling"])


def test_waking_checks_without_recording():
    s = SleepState()
    s.enter(2)
    assert s.waking(["weights"]) == ["weights"] and s.waking() == ["weights", "kv_cache"]
    assert s.asleep == ["weights", "kv_cache"] and s.log == [("sleep", 2)]  # nothing recorded yet
    with pytest.raises(ValueError, match="wake_up parts must be among"):
        s.waking(["scheduling"])


class _Engine:
    """vLLM's sleep/wake calls as a real GPU engine answers them; `fail` makes the next wake raise."""

    def __init__(self):
        self.calls, self.fail = [], False

    def sleep(self, level):
        self.calls.append(("sleep", level))

    def wake_up(self, tags):
        if self.fail:
            raise RuntimeError("CUDA out of memory while reallocating")
        self.calls.append(("wake", tuple(tags)))
        return len(self.calls) >= 3  # fully awake after the second wake (weights, then kv_cache)


def test_a_failed_wake_leaves_the_record_asleep():
    """The record follows vLLM: a wake that raises leaves its parts asleep, so the worker keeps refusing to
    sample or load a policy instead of reading memory that was never given back."""
    from workers.rollout.worker import RolloutWorker

    worker = object.__new__(RolloutWorker)  # the sleep methods only: no engine is built
    worker._llm, worker._sleep = _Engine(), SleepState(real=True)
    worker.sleep(2)
    worker._llm.fail = True
    with pytest.raises(RuntimeError, match="CUDA out of memory"):
        worker.wake_up(["weights"])
    assert worker._sleep.asleep == ["weights", "kv_cache"] and worker.sleep_log() == [("sleep", 2)]
    with pytest.raises(RuntimeError, match="a policy update on a sleeping engine"):
        worker._sleep.check_awake("a policy update", needs=("weights",))
    worker._llm.fail = False
    assert worker.wake_up(["weights"])["asleep"] == ["kv_cache"]
    assert worker.wake_up()["asleep"] == [] and worker._llm.calls == [
        ("sleep", 2), ("wake", ("weights",)), ("wake", ("kv_cache",))]
