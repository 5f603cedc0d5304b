"""Held-out eval metrics: `pass_at_k` against the closed form 1 - C(n - c, k) / C(n, k) in exact arithmetic."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from orchestrator.trial.collect.evaluation import pass_at_k


def _exact(n: int, c: int, k: int) -> Fraction:
    """Probability that at least one of k draws without replacement from n samples (c correct) is correct."""
    return 1 - Fraction(math.comb(n - c, k), math.comb(n, k))  # math.comb(a, b) == 0 when b > a


@st.composite
def _nck(draw) -> tuple[int, int, int]:
    n = draw(st.integers(1, 50))
    return n, draw(st.integers(0, n)), draw(st.integers(1, n))


@given(_nck())
def test_pass_at_k_equals_binomial_closed_form(nck):
    n, c, k = nck
    got = pass_at_k(n, c, k)
    assert isinstance(got, float)
    assert 0.0 <= got <= 1.0
    assert got == pytest.approx(float(_exact(n, c, k)), rel=1e-12, abs=1e-12), (n, c, k)


@given(_nck())
def test_pass_at_1_is_fraction_correct(nck):
    n, c, _ = nck
    assert pass_at_k(n, c, 1) == pytest.approx(c / n, rel=1e-12, abs=1e-15)


@given(_nck())
def test_pass_at_k_monotone_in_k_and_c(nck):
    n, c, k = nck
    p = pass_at_k(n, c, k)
    if k < n:
        assert pass_at_k(n, c, k + 1) >= p - 1e-12
    if c < n:
        assert pass_at_k(n, c + 1, k) >= p - 1e-12


@pytest.mark.parametrize(("n", "k"), [(1, 1), (8, 1), (8, 8), (50, 7)])
def test_no_correct_sample_gives_zero(n, k):
    assert pass_at_k(n, 0, k) == 0.0


@pytest.mark.parametrize(("n", "c", "k"), [(1, 1, 1), (8, 8, 1), (8, 5, 4), (8, 1, 8), (50, 44, 7), (50, 50, 50)])
def test_fewer_wrong_than_k_gives_one(n, c, k):
    assert n - c < k
    assert pass_at_k(n, c, k) == 1.0


def test_known_values():
    assert pass_at_k(2, 1, 1) == pytest.approx(0.5)
    assert pass_at_k(4, 1, 2) == pytest.approx(0.5)  # 1 - C(3,2)/C(4,2) = 1 - 3/6
    assert pass_at_k(10, 3, 5) == pytest.approx(1 - 21 / 252)  # C(7,5)=21, C(10,5)=252
