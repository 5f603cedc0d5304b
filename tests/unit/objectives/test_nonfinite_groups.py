"""The non-finite filter: groups with a NaN/inf reward or sampled-token log-prob are found, whole, and counted."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from workers.objectives.filters import nonfinite_groups

NAN, INF = float("nan"), float("inf")


def test_bad_rewards_and_logprobs_are_found_per_group():
    rewards = [[1.0, 0.0], [NAN, 1.0], [0.0, 0.0], [1.0, -INF], [1.0, 1.0]]
    logprobs = [[[-0.1, -0.2], [-0.3]], [[-0.1], [-0.2]], [[-0.5, NAN], [-0.1]], [[-0.1], [-0.1]],
                [[-0.2, -INF], [-0.3]]]
    mask = [[[True, True], [True]], [[True], [True]], [[True, True], [True]], [[True], [True]],
            [[True, False], [True]]]  # group 4's -inf sits at a position outside the loss mask
    check = nonfinite_groups(rewards, logprobs, mask)
    assert check.bad == [1, 2, 3]
    assert (check.reward_groups, check.logprob_groups) == (2, 1)
    assert check.metrics == {"train/nonfinite_groups": 3, "train/nonfinite_reward_groups": 2,
                             "train/nonfinite_logprob_groups": 1}
    assert check.rewards == [[1.0, 0.0], [0.0, 0.0], [0.0, 0.0], [0.0, 0.0], [1.0, 1.0]]
    # without a mask every position counts
    assert nonfinite_groups(rewards, logprobs).bad == [1, 2, 3, 4]
    # None where a number belongs is as bad as NaN; a clean step drops nothing
    assert nonfinite_groups([[1.0, None]]).bad == [0]
    clean = nonfinite_groups([[1.0, 0.0]], [[[-0.1], [-0.2]]])
    assert clean.bad == [] and clean.metrics["train/nonfinite_groups"] == 0


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.sampled_from([0.0, 1.0, 0.5, NAN, INF, -INF]), min_size=1, max_size=4),
                min_size=1, max_size=6))
def test_matches_numpy_and_nothing_non_finite_survives(rewards):
    check = nonfinite_groups(rewards)
    want = [i for i, g in enumerate(rewards) if not np.all(np.isfinite(g))]
    assert check.bad == want
    kept = [g for i, g in enumerate(check.rewards) if i not in check.bad]
    assert all(math.isfinite(r) for g in check.rewards for r in g)
    assert kept == [g for i, g in enumerate(rewards) if i not in want]
