"""The shared tolerance helpers (tests/tolerance.py): Higham's bound holds for float32 sums taken in any order,
and an error the suite's comparisons exist to catch (a term dropped, a sum halved, a term counted twice) fails it."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.tolerance import (
    EPS32,
    NETWORK_ULPS,
    assert_close_to_scale,
    assert_sum_close,
    close_to_scale,
    scale_tolerance,
    sum_tolerance,
)

TERMS = st.lists(st.floats(-1e3, 1e3, allow_nan=False, width=32), min_size=2, max_size=400)


def _sequential(x: np.ndarray) -> float:
    acc = np.float32(0.0)
    for v in x:
        acc = np.float32(acc + v)
    return float(acc)


@settings(max_examples=100, deadline=None)
@given(TERMS, st.randoms(use_true_random=False))
def test_any_two_orders_are_within_the_bound(terms, rnd):
    x = np.array(terms, dtype=np.float32)
    shuffled = x.copy()
    rnd.shuffle(shuffled)
    orders = [_sequential(x), _sequential(x[::-1]), _sequential(shuffled), float(np.sum(x)),  # numpy: pairwise
              float(torch.from_numpy(x).sum())]  # torch: vectorised lanes
    magnitude = float(np.abs(x.astype(np.float64)).sum())
    exact = float(np.sum(x.astype(np.float64)))
    for got in orders:
        assert_sum_close(got, orders[0], magnitude=magnitude, terms=len(x), what="order")
        assert_sum_close(got, exact, magnitude=magnitude, terms=len(x), what="vs float64")


@settings(max_examples=100, deadline=None)
@given(TERMS, st.integers(0, 10**6))
def test_a_dropped_term_fails_unless_it_is_rounding_sized(terms, pick):
    x = np.array(terms, dtype=np.float64)
    i = pick % len(x)
    magnitude, n = float(np.abs(x).sum()), len(x)
    dropped = float(np.delete(x, i).sum())
    if abs(x[i]) > sum_tolerance(magnitude, n):
        with pytest.raises(AssertionError, match="summation bound"):
            assert_sum_close(dropped, float(x.sum()), magnitude=magnitude, terms=n)


def test_the_bound_scales_with_what_is_summed():
    assert sum_tolerance(10.0, 101) == pytest.approx(10 * sum_tolerance(1.0, 101))
    assert sum_tolerance(1.0, 1001) == pytest.approx(10 * sum_tolerance(1.0, 101))
    assert sum_tolerance(1.0, 2) == pytest.approx(2 * EPS32)


@pytest.mark.parametrize("fault", ["halved", "dropped_row", "one_element"])
def test_scale_tolerance_catches_a_wrong_gradient(fault):
    """A gradient as the learner-group test compares it: a sum over 64 tokens of per-token outer products. The
    same sum in another order passes; the errors of issue 54's list fail by orders of magnitude."""
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(64, 32, generator=g), torch.randn(64, 16, generator=g)
    whole = a.T @ b
    reordered = sum(a[i:i + 8].T @ b[i:i + 8] for i in range(0, 64, 8))  # micro-batches of 8 tokens
    assert_close_to_scale(reordered, whole)
    wrong = {"halved": whole / 2,  # summed over 2 ranks where it should have been the sum, not the mean
             "dropped_row": whole - a[:8].T @ b[:8],  # one micro-batch lost
             "one_element": whole.clone().index_put_((torch.tensor([3]), torch.tensor([5])), torch.tensor(0.0))}
    with pytest.raises(AssertionError, match="eps x the largest magnitude"):
        assert_close_to_scale(wrong[fault], whole)
    assert float((wrong[fault] - whole).abs().max()) > 100 * scale_tolerance(whole)


def test_scale_tolerance_of_zeros_is_exact_and_metrics_compare_nan():
    zero = torch.zeros(3)
    assert_close_to_scale(zero.clone(), zero)
    with pytest.raises(AssertionError):
        assert_close_to_scale(torch.tensor([0.0, 1e-30, 0.0]), zero)
    assert close_to_scale(float("nan"), float("nan"), 1.0) and not close_to_scale(0.0, float("nan"), 1.0)
    assert close_to_scale(1.0 + NETWORK_ULPS * EPS32 / 2, 1.0, 1.0)
    assert not close_to_scale(1.0 + 2 * NETWORK_ULPS * EPS32, 1.0, 1.0)
