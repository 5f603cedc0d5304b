"""rollout.overlong against hand-computed tables: DAPO's soft punishment (workers/objectives/overlong.py) and the
masks / reward shifts it puts on a step's samples (orchestrator/trial/collect/fill.py apply_overlong)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from orchestrator.config.rollout import RolloutConfig
from orchestrator.trial.collect.fill import apply_overlong
from orchestrator.trial.collect.rollouts import Rollouts
from workers.objectives.overlong import soft_overlong_penalty

# limit 10, buffer 4, penalty 0.5: zero up to 10 - 4 = 6, then -0.5 x (len - 6) / 4
TABLE = {0: 0.0, 5: 0.0, 6: 0.0, 7: -0.125, 8: -0.25, 9: -0.375, 10: -0.5}


def test_penalty_table():
    lengths = torch.tensor(list(TABLE))
    assert soft_overlong_penalty(lengths, 10, 4, 0.5).tolist() == list(TABLE.values())


@given(limit=st.integers(1, 200), data=st.data())
def test_penalty_is_zero_before_the_buffer_and_full_at_the_limit(limit, data):
    buffer = data.draw(st.integers(1, limit))
    p = data.draw(st.floats(0.0, 5.0))
    lengths = torch.arange(limit + 1)
    out = soft_overlong_penalty(lengths, limit, buffer, p)
    assert (out[: limit - buffer + 1] == 0).all()
    assert out[-1].item() == pytest.approx(-p)
    assert (out[1:] <= out[:-1] + 1e-12).all()  # never rewards length


@pytest.mark.parametrize("buffer", [0, 11])
def test_penalty_buffer_out_of_range(buffer):
    with pytest.raises(ValueError, match="buffer"):
        soft_overlong_penalty(torch.tensor([1]), 10, buffer, 1.0)


def _roll(multi_turn: bool = False) -> Rollouts:
    # two groups of two; sample (0, 1) and (1, 0) were truncated at the limit 10, (1, 1) is 8 tokens long
    lengths = [[3, 10], [10, 8]]
    extra = {"turn_rewards": [[[0.0, 1.0], [1.0]], [[0.0], [0.0, 0.0, 1.0]]]} if multi_turn else {}
    return Rollouts(
        prompt_ids=[[[1]] * 2] * 2, response_ids=[[[7] * n for n in g] for g in lengths],
        loss_mask=[[[True] * n for n in g] for g in lengths], logprobs=[[[-1.0] * n for n in g] for g in lengths],
        rewards=[[1.0, 1.0], [0.0, 1.0]], correct=[[True, True], [False, True]], num_tokens=31, versions={None},
        metrics={}, extra=extra, truncated=[[False, True], [True, False]], lengths=lengths)


def _ro(**overlong) -> RolloutConfig:
    return RolloutConfig(max_tokens=10, overlong=overlong)


def test_keep_leaves_everything():
    roll = _roll()
    assert apply_overlong(roll, _ro()) is roll


def test_mask_clears_exactly_the_truncated_samples():
    out = apply_overlong(_roll(), _ro(mode="mask"))
    assert [[sum(m) for m in g] for g in out.loss_mask] == [[3, 0], [0, 8]]
    assert out.rewards == [[1.0, 1.0], [0.0, 1.0]]  # rewards untouched: the group is judged as sampled
    assert out.metrics["train/overlong_masked"] == 2


def test_penalty_shifts_rewards_by_the_table():
    # buffer 4, penalty 0.5: length 3 -> 0, 10 -> -0.5, 8 -> -0.25
    out = apply_overlong(_roll(), _ro(mode="penalty", buffer=4, penalty=0.5))
    assert out.rewards == [[1.0, 0.5], [-0.5, 0.75]]
    assert [[sum(m) for m in g] for g in out.loss_mask] == [[3, 10], [10, 8]]


def test_penalty_reaches_the_last_turn_reward_of_an_episode():
    out = apply_overlong(_roll(multi_turn=True), _ro(mode="penalty", buffer=4, penalty=0.5))
    assert out.extra["turn_rewards"] == [[[0.0, 1.0], [0.5]], [[-0.5], [0.0, 0.0, 0.75]]]
