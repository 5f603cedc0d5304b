"""Report statistics against independent implementations (scipy, statsmodels, numpy) and closed forms."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats as sps
from statsmodels.stats.multitest import multipletests
from statsmodels.stats.power import TTestPower

from orchestrator.stats.paired import (
    MIN_PAIRS,
    MIN_SEEDS,
    bootstrap_ci,
    delta_bounds,
    group_ci,
    holm,
    metric_bounds,
    normalized_auc,
    paired_bootstrap_ci,
    paired_comparison,
    t_interval,
)
from orchestrator.stats.power import (
    expected_power,
    generations_per_arm,
    minimum_detectable_effect,
    paired_t_power,
    seeds_for_power,
    stated_mde,
)

# --- AUC -------------------------------------------------------------------------------------------------------


def test_auc_matches_numpy_trapezoid_on_irregular_curve():
    steps = np.array([0, 1, 2, 4, 7, 10, 12, 15])
    values = np.array([0.30, 0.35, 0.31, 0.40, 0.44, 0.43, 0.50, 0.49])
    for lo, hi in ((0, 10), (0, 15), (2, 12), (4, 7)):
        sel = (steps >= lo) & (steps <= hi)
        want = np.trapezoid(values[sel], steps[sel]) / (hi - lo)
        assert normalized_auc(steps, values, (lo, hi)) == pytest.approx(want, rel=1e-12)
    # order of the points does not matter
    perm = np.random.default_rng(0).permutation(steps.size)
    assert normalized_auc(steps[perm], values[perm], (0, 15)) == pytest.approx(normalized_auc(steps, values, (0, 15)))


def test_auc_linear_ramp_closed_form():
    steps = np.arange(0, 31)
    a, b = 0.25, 0.01
    for lo, hi in ((0, 10), (0, 15), (5, 30)):
        assert normalized_auc(steps, a + b * steps, (lo, hi)) == pytest.approx(a + b * (lo + hi) / 2, rel=1e-12)
    # unevenly sampled ramp: trapezoids are exact on a line
    s = np.array([0, 3, 4, 9, 10])
    assert normalized_auc(s, a + b * s, (0, 10)) == pytest.approx(a + b * 5)


def test_auc_nan_when_window_not_covered():
    steps, values = np.arange(8), np.linspace(0, 1, 8)
    assert math.isnan(normalized_auc(steps, values, (0, 10)))  # run stopped at step 7
    assert math.isnan(normalized_auc(np.array([0, 5, 15]), np.ones(3), (0, 10)))  # no point at 10
    assert math.isnan(normalized_auc(np.array([1, 5, 10]), np.ones(3), (0, 10)))  # no point at 0
    assert math.isnan(normalized_auc([], [], (0, 10)))
    assert math.isnan(normalized_auc(steps, np.where(steps == 3, np.nan, values), (0, 7)))
    with pytest.raises(ValueError):
        normalized_auc(steps, values, (5, 5))


@settings(max_examples=60, deadline=None)
@given(c=st.floats(-1e3, 1e3), lo=st.integers(0, 20), width=st.integers(1, 30),
       extra=st.sets(st.integers(0, 60), max_size=15))
def test_auc_of_constant_curve_is_the_constant(c, lo, width, extra):
    hi = lo + width
    steps = np.array(sorted({lo, hi} | extra), dtype=float)
    assert normalized_auc(steps, np.full(steps.size, c), (lo, hi)) == pytest.approx(c, abs=1e-9 * max(1, abs(c)))


# --- bootstrap ------------------------------------------------------------------------------------------------


def _scipy_ci(data, statistic, method="BCa", **kw):
    res = sps.bootstrap(data, statistic, method=method, n_resamples=10_000, confidence_level=0.95, rng=0, **kw)
    return res.confidence_interval.low, res.confidence_interval.high


@pytest.mark.parametrize("n,dist", [(5, "normal"), (12, "skewed"), (40, "normal")])
def test_bootstrap_ci_is_scipys_bca(n, dist):
    rng = np.random.default_rng(n)
    x = rng.normal(0.4, 0.05, n) if dist == "normal" else rng.exponential(0.1, n)
    assert bootstrap_ci(x, seed=0) == pytest.approx(_scipy_ci((x,), np.mean), rel=1e-12)
    assert bootstrap_ci(x, seed=0, method="percentile") == pytest.approx(
        _scipy_ci((x,), np.mean, method="percentile"), rel=1e-12)
    assert bootstrap_ci(x, statistic="median", seed=0) == pytest.approx(_scipy_ci((x,), np.median), rel=1e-12)
    lo, hi = bootstrap_ci(x, seed=0)
    assert lo < np.mean(x) < hi
    if dist == "skewed":  # BCa shifts a right-skewed sample's interval up relative to the percentile one
        p_lo, p_hi = bootstrap_ci(x, seed=0, method="percentile")
        assert lo > p_lo and hi > p_hi


def test_bootstrap_falls_back_to_percentile_where_bca_is_undefined():
    # A statistic constant on every jackknife sample (here: the max of data with a repeated maximum) makes the
    # BCa acceleration 0/0; scipy warns and returns NaN. The report then uses the percentile interval.
    x = np.array([0.1, 0.2, 0.3, 0.9, 0.9, 0.9])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        raw = sps.bootstrap((x,), np.max, method="BCa", rng=0, n_resamples=2000).confidence_interval
    assert math.isnan(raw.low) or math.isnan(raw.high)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = bootstrap_ci(x, statistic=np.max, n_resamples=2000)
    want = sps.bootstrap((x,), np.max, method="percentile", rng=0, n_resamples=2000).confidence_interval
    assert got == pytest.approx(tuple(want))


def test_bootstrap_ci_width_and_seed():
    x = np.random.default_rng(7).normal(size=30)
    lo, hi = bootstrap_ci(x)
    # CI of the mean ~ mean +- 1.96 SE
    se = x.std(ddof=0) / math.sqrt(x.size)
    assert hi - lo == pytest.approx(2 * 1.96 * se, rel=0.1)
    assert bootstrap_ci(x, seed=0) == (lo, hi) and bootstrap_ci(x, seed=1) != (lo, hi)
    lo90, hi90 = bootstrap_ci(x, confidence=0.9)
    assert lo < lo90 < hi90 < hi


def test_paired_bootstrap_ci_is_scipys_paired_bca():
    rng = np.random.default_rng(11)
    a = rng.normal(0.40, 0.03, 10)
    b = a + 0.01 + rng.normal(0, 0.01, 10)
    lo, hi = paired_bootstrap_ci(a, b)

    def mean_diff(x, y, axis=-1):
        return np.mean(y - x, axis=axis)

    # scipy resamples the pairs' indices; the same indices applied to the differences give the same interval
    assert (lo, hi) == pytest.approx(_scipy_ci((a, b), mean_diff, paired=True), rel=1e-9)
    # pairing matters: the unpaired spread of a is much larger than the CI width
    assert hi - lo < 0.5 * (np.std(a) * 2 * 1.96 / math.sqrt(10))
    # NaN pairs are dropped
    a2, b2 = np.append(a, np.nan), np.append(b, 0.9)
    assert paired_bootstrap_ci(a2, b2) == (lo, hi)


def test_t_interval_and_group_ci():
    x = np.random.default_rng(2).normal(0.5, 0.1, 6)
    want = sps.ttest_1samp(x, 0.0).confidence_interval(0.95)
    assert t_interval(x) == pytest.approx((want.low, want.high), rel=1e-12)
    assert group_ci(x) == pytest.approx((want.low, want.high), rel=1e-12)
    # fewer than MIN_SEEDS seeds: no group CI
    assert MIN_SEEDS == 3 and all(math.isnan(v) for v in group_ci(x[:2]))
    # a rate near 0 gets its interval clipped to [0, 1]
    rate = np.array([0.0, 0.0, 0.02, 0.01])
    lo, hi = group_ci(rate, bounds=(0.0, 1.0))
    assert t_interval(rate)[0] < 0.0 and lo == 0.0 and hi == pytest.approx(t_interval(rate)[1])


def test_metric_bounds_by_name():
    for m in ("train/correct_rate", "eval/pass@1", "eval/pass@k", "env/success_rate", "eval/success",
              "eval/accuracy"):
        assert metric_bounds(m) == (0.0, 1.0), m
        assert delta_bounds(m) == (-1.0, 1.0)
    for m in ("train/reward_mean", "loss/total", "policy/entropy_mean", "train/completion_len"):
        assert metric_bounds(m) is None and delta_bounds(m) is None, m


def test_bootstrap_degenerate_inputs_do_not_warn():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert bootstrap_ci([0.3]) == (0.3, 0.3)
        assert bootstrap_ci([0.25] * 6) == (0.25, 0.25)
        assert bootstrap_ci([0.25, np.nan]) == (0.25, 0.25)
        lo, hi = bootstrap_ci([])
        assert math.isnan(lo) and math.isnan(hi)
        assert paired_bootstrap_ci([0.1, 0.2], [0.3, 0.4]) == pytest.approx((0.2, 0.2))
        c = paired_comparison([0.1], [0.2])
        assert c.n == 1 and c.delta == pytest.approx(0.1) and math.isnan(c.p_value) and not c.excludes_zero
        c = paired_comparison([0.1, 0.2, 0.3], [0.2, 0.3, 0.4])  # constant difference: t undefined
        assert c.n == 3 and math.isnan(c.p_value) and c.sd_diff == pytest.approx(0, abs=1e-12)
        assert paired_comparison([], []).n == 0


def test_fewer_than_three_pairs_claim_nothing():
    # two pairs with a large, consistent difference: a bootstrap CI would exclude zero; the report claims nothing
    c = paired_comparison([0.30, 0.31], [0.40, 0.45])
    assert c.n == 2 and c.too_few and not c.excludes_zero
    assert math.isnan(c.ci_low) and math.isnan(c.ci_high) and math.isnan(c.p_value)
    assert c.delta == pytest.approx(0.12) and c.sd_diff == pytest.approx(np.std([0.10, 0.14], ddof=1))
    assert MIN_PAIRS == 3


@settings(max_examples=40, deadline=None)
@given(st.lists(st.floats(-1e3, 1e3, allow_nan=False), min_size=1, max_size=25))
def test_bootstrap_ci_contains_the_sample_mean(xs):
    x = np.array(xs)
    lo, hi = bootstrap_ci(x, n_resamples=2000)
    tol = 1e-9 * max(1.0, float(np.max(np.abs(x))))
    assert lo - tol <= np.mean(x) <= hi + tol


# --- paired comparison and Holm -------------------------------------------------------------------------------


def test_paired_comparison_matches_ttest_rel():
    rng = np.random.default_rng(3)
    base = rng.normal(0.4, 0.05, 8)
    other = base + 0.02 + rng.normal(0, 0.01, 8)
    c = paired_comparison(base, other)
    ref = sps.ttest_rel(other, base)
    assert c.n == 8 and c.delta == pytest.approx(np.mean(other - base))
    assert c.p_value == pytest.approx(ref.pvalue, rel=1e-10)
    assert (c.ci_low, c.ci_high) == pytest.approx(tuple(ref.confidence_interval(0.95)), rel=1e-12)
    assert c.sd_diff == pytest.approx(np.std(other - base, ddof=1))
    assert (c.boot_low, c.boot_high) == paired_bootstrap_ci(base, other) and c.excludes_zero
    # the CI excludes zero exactly when the paired t-test rejects at 5%, whatever the data
    rng = np.random.default_rng(5)
    for _ in range(300):
        n = int(rng.integers(3, 12))
        a, b = rng.normal(0, 1, n), rng.normal(0, 1, n) + rng.normal(0, 0.5)
        c = paired_comparison(a, b, bootstrap=False)
        assert c.excludes_zero == (sps.ttest_rel(b, a).pvalue < 0.05)
    # bounded: the CI of a difference of rates stays in [-1, 1]
    c = paired_comparison([0.0, 0.0, 0.0], [1.0, 0.2, 1.0], bounds=(-1.0, 1.0))
    assert -1.0 <= c.ci_low and c.ci_high == 1.0


@pytest.mark.parametrize("seed", range(5))
def test_holm_equals_statsmodels(seed):
    rng = np.random.default_rng(seed)
    p = np.concatenate([rng.uniform(0, 0.06, 6), rng.uniform(0, 1, 6), [0.03, 0.03]])
    rng.shuffle(p)
    want = multipletests(p, alpha=0.05, method="holm")[1]
    np.testing.assert_allclose(holm(p), want, rtol=1e-12)


@settings(max_examples=15, deadline=None)  # statsmodels' Holm runs gc.collect() per call: keep the calls few
@given(st.lists(st.lists(st.one_of(st.floats(0, 1), st.just(math.nan)), min_size=4, max_size=4), min_size=1,
                max_size=3))
def test_holm_along_rows_equals_statsmodels_per_row(rows):
    p = np.array(rows)
    got = holm(p)
    for row, adj in zip(p, got, strict=True):
        ok = np.isfinite(row)
        assert np.all(np.isnan(adj[~ok]))
        if ok.any():
            np.testing.assert_allclose(adj[ok], multipletests(row[ok], method="holm")[1], rtol=1e-12)


def test_holm_skips_nan():
    got = holm([0.01, np.nan, 0.04, 0.03])
    assert math.isnan(got[1])
    np.testing.assert_allclose(got[[0, 2, 3]], multipletests([0.01, 0.04, 0.03], method="holm")[1])
    assert holm([]).size == 0


# --- power ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("d", [0.1, 0.2, 0.35, 0.5, 0.8, 1.0, 1.5, 2.5])
@pytest.mark.parametrize("alpha,power", [(0.05, 0.8), (0.01, 0.9)])
def test_seeds_for_power_equals_statsmodels(d, alpha, power):
    want = TTestPower().solve_power(effect_size=d, alpha=alpha, power=power, alternative="two-sided")
    sd = 0.013
    n = seeds_for_power(d * sd, sd, alpha, power)
    assert isinstance(n, int) and n == math.ceil(want - 1e-6)
    assert paired_t_power(n, d, alpha) >= power > paired_t_power(n - 1, d, alpha) or n == 2
    # the sign of the effect does not matter
    assert seeds_for_power(-d * sd, sd, alpha, power) == n


def _nct_power(n: int, d: float, alpha: float) -> float:
    """Two-sided paired t power from scipy's noncentral t, both tails (the reference, not the code under test)."""
    tc = sps.t.isf(alpha / 2, n - 1)
    nc = d * math.sqrt(n)
    return float(sps.nct.sf(tc, n - 1, nc) + sps.nct.sf(tc, n - 1, -nc))  # far tail: P(T < -tc | nc)


@pytest.mark.parametrize("n,family", [(3, 1), (3, 4), (3, 8), (3, 11), (4, 1), (4, 4), (4, 8), (4, 11), (8, 8),
                                      (16, 1), (50, 1)])
def test_minimum_detectable_effect_reaches_its_power(n, family):
    """The MDE has exactly the stated power (scipy's noncentral t), and a 1% smaller effect less: at 3 pairs and
    a family of 4 it is 6.55 sd, not statsmodels' solve_power's 5.00 (power 0.61)."""
    sd, alpha = 0.02, 0.05 / family
    mde = minimum_detectable_effect(n, sd, alpha, 0.8)
    assert _nct_power(n, mde / sd, alpha) == pytest.approx(0.8, abs=1e-6)
    assert _nct_power(n, 0.99 * mde / sd, alpha) < 0.8
    assert seeds_for_power(mde * 1.0001, sd, alpha) == n  # the MDE needs exactly n seeds (up to rounding)
    if (n, family) == (3, 4):
        assert mde / sd == pytest.approx(6.55, abs=0.01)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            solved = TTestPower().solve_power(nobs=3, alpha=alpha, power=0.8, effect_size=None)
        assert _nct_power(3, solved, alpha) < 0.65  # what the report printed before


def test_power_where_statsmodels_underflows_is_the_noncentral_t_tail():
    # statsmodels' TTestPower returns NaN here (the far tail underflows); the power is not 1 but ~85%, matching
    # the MDE at the same n and alpha
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert math.isnan(TTestPower().power(effect_size=4.65, nobs=4, alpha=0.00625, alternative="two-sided"))
    tc = sps.t.isf(0.00625 / 2, 3)
    assert paired_t_power(4, 4.65, 0.00625) == pytest.approx(sps.nct.sf(tc, 3, 4.65 * 2), rel=1e-9)
    assert 0.8 < paired_t_power(4, 4.65, 0.00625) < 0.9
    assert paired_t_power(4, minimum_detectable_effect(4, 1.0, 0.00625), 0.00625) == pytest.approx(0.8, abs=1e-6)


@pytest.mark.parametrize("n,d,family", [(3, 0.4, 1), (3, 5.06, 1), (3, 12.0, 4), (4, 3.0, 4), (8, 1.3, 1),
                                        (8, 2.0, 8), (16, 0.8, 1), (2, 20.0, 1)])
def test_expected_power_is_the_plug_in_power_averaged_over_the_observed_sd(n, d, family):
    """expected_power = E[power(n, d s / sigma)] with (n - 1) s^2 / sigma^2 ~ chi2(n - 1): scipy.integrate.quad
    of scipy's noncentral t over the chi2 density (split where the power turns) is the reference."""
    from scipy import integrate

    alpha, df = 0.05 / family, n - 1
    turn = df * (sps.t.isf(alpha / 2, df) / (d * math.sqrt(n))) ** 2
    f = lambda u: _nct_power(n, d * math.sqrt(u / df), alpha) * sps.chi2.pdf(u, df)  # noqa: E731
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        want = sum(integrate.quad(f, lo, hi, limit=400, epsabs=1e-11)[0] for lo, hi in ((0, turn), (turn, np.inf)))
    assert expected_power(n, d, alpha) == pytest.approx(want, abs=2e-6)
    assert expected_power(n, d, alpha) < _nct_power(n, d, alpha) or d < 1  # the plug-in overstates it


@pytest.mark.parametrize("n", [3, 4, 8])
def test_stated_mde_is_detected_with_its_power_whatever_the_true_sd(n):
    """Campaigns of n normal pairs (sigma 1) state stated_mde from their own sd; a fresh campaign with that
    effect is detected at the stated power (simulated: 40,000 campaigns, 3 standard errors), while the MDE from
    the observed sd as it is (`minimum_detectable_effect`) falls short at 3-4 pairs."""
    rng, m, alpha = np.random.default_rng(n), 40_000, 0.05 / 4
    s = rng.normal(0, 1, (m, n)).std(axis=1, ddof=1)
    fresh = rng.normal(0, 1, (m, n))
    tc = sps.t.isf(alpha / 2, n - 1)

    def detected(effect):
        x = fresh + effect[:, None]
        return float((np.abs(x.mean(axis=1) / (x.std(axis=1, ddof=1) / math.sqrt(n))) > tc).mean())

    assert detected(stated_mde(n, 1.0, alpha) * s) == pytest.approx(0.8, abs=3 * math.sqrt(0.16 / m))
    assert stated_mde(n, 0.02, alpha) == pytest.approx(0.02 * stated_mde(n, 1.0, alpha), rel=1e-12)  # scales with s
    if n <= 4:
        assert detected(minimum_detectable_effect(n, 1.0, alpha) * s) < 0.7
    assert math.isnan(stated_mde(1, 1.0)) and stated_mde(5, 0.0) == 0.0 and math.isnan(stated_mde(5, -1.0))


def test_power_edge_cases_and_generations():
    assert seeds_for_power(0.0, 0.01) == math.inf
    assert seeds_for_power(0.01, 0.0) == 2
    assert math.isnan(seeds_for_power(math.nan, 0.01)) and math.isnan(seeds_for_power(0.01, math.nan))
    assert seeds_for_power(1e-9, 1.0) == math.inf  # beyond max_seeds
    assert math.isnan(minimum_detectable_effect(1, 0.01)) and minimum_detectable_effect(5, 0.0) == 0.0
    assert paired_t_power(10, 0.0) == pytest.approx(0.05, abs=1e-9)
    # paper scale: 0.2pp effect; seeds x steps x 16 problems x 16 rollouts
    assert generations_per_arm(4, 11, 16, 16) == 4 * 11 * 256
    assert generations_per_arm(math.inf, 11, 16, 16) == math.inf
    # seeds fall as the effect grows
    ns = [seeds_for_power(e, 0.01) for e in (0.002, 0.004, 0.008, 0.016)]
    assert ns == sorted(ns, reverse=True) and len(set(ns)) == 4
