"""The rollout worker's record of its engine's sleep: the transitions it allows and the calls it refuses while
asleep (what keeps a colocated step's order on CPU, where vLLM's sleep is a no-op)."""

from __future__ import annotations

import pytest

from workers.rollout.sleep import SleepState


def test_sleep_then_wake_is_logged_in_order():
    s = SleepState()
    s.check_awake("generate")
    s.enter(2)
    with pytest.raises(RuntimeError, match="generate on a sleeping engine \\(level 2\\)"):
        s.check_awake("generate")
    with pytest.raises(RuntimeError, match="already asleep"):
        s.enter(1)
    s.leave()
    s.check_awake("a policy update")
    s.enter(1)
    s.leave()
    assert s.log == [("sleep", 2), ("wake", 0), ("sleep", 1), ("wake", 0)]


@pytest.mark.parametrize("level", [0, 3])
def test_only_levels_1_and_2(level):
    with pytest.raises(ValueError, match="sleep level must be 1"):
        SleepState().enter(level)


def test_waking_an_awake_engine_is_an_error():
    with pytest.raises(RuntimeError, match="wake_up on an engine that is awake"):
        SleepState().leave()
