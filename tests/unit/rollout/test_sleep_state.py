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
