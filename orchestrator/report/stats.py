"""Pure numpy/scipy statistics for campaign reports: normalized AUC, percentile bootstrap, paired comparisons,
Holm correction and paired t-test power.

Conventions used throughout:
- Non-finite samples (NaN, inf) are dropped before any computation; a paired sample is dropped when either of
  its two values is non-finite.
- Paired differences are always `other - base` (`b - a`), so a positive delta means `other` is higher.
- Nothing here warns on degenerate input (no samples, one sample, all samples equal); such cases return NaN or
  a zero-width interval as documented per function.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
from scipy import optimize
from scipy import stats as sps

Statistic = Literal["mean", "median"] | Callable[..., np.ndarray]

_MAX_BOOT_ELEMENTS = 4_000_000  # resampled values held in memory at once


def normalized_auc(steps: Sequence[float] | np.ndarray, values: Sequence[float] | np.ndarray,
                   window: tuple[int, int]) -> float:
    """Trapezoidal area under `values(steps)` over `lo <= step <= hi`, divided by `hi - lo`.

    The result is the mean of the metric over the window (a constant curve gives the constant). Points are
    sorted by step first. Returns NaN when the run has no point exactly at `lo` or at `hi` (it did not cover
    the window), or when any value inside the window is non-finite. Raises `ValueError` unless `lo < hi`.
    """
    lo, hi = window
    if not lo < hi:
        raise ValueError(f"window must satisfy lo < hi, got {window}")
    s = np.asarray(steps, dtype=float).ravel()
    v = np.asarray(values, dtype=float).ravel()
    if s.shape != v.shape:
        raise ValueError(f"steps and values differ in length: {s.shape} vs {v.shape}")
    inside = (s >= lo) & (s <= hi)
    s, v = s[inside], v[inside]
    if not (np.any(s == lo) and np.any(s == hi)) or not np.all(np.isfinite(v)):
        return math.nan
    order = np.argsort(s, kind="stable")
    s, v = s[order], v[order]
    area = float(np.sum((s[1:] - s[:-1]) * (v[1:] + v[:-1]) / 2.0))
    return area / (hi - lo)


def _statistic_fn(statistic: Statistic) -> Callable[[np.ndarray], np.ndarray]:
    """A function of `(array, axis=-1)` for a named or callable statistic."""
    if statistic == "mean":
        return lambda x: np.mean(x, axis=-1)
    if statistic == "median":
        return lambda x: np.median(x, axis=-1)
    if callable(statistic):
        return lambda x: np.asarray(statistic(x, axis=-1), dtype=float)
    raise ValueError(f"statistic must be 'mean', 'median' or a callable f(x, axis), got {statistic!r}")


def _check_confidence(confidence: float) -> None:
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must lie in (0, 1), got {confidence}")


def _finite(samples: Sequence[float] | np.ndarray) -> np.ndarray:
    x = np.asarray(samples, dtype=float).ravel()
    return x[np.isfinite(x)]


def _percentile_bootstrap(x: np.ndarray, fn: Callable[[np.ndarray], np.ndarray], confidence: float,
                          n_resamples: int, seed: int) -> tuple[float, float]:
    """Vectorised percentile bootstrap of `fn` over the rows of resampled `x` (already finite, n >= 2)."""
    n = x.size
    rng = np.random.default_rng(seed)
    chunk = max(1, _MAX_BOOT_ELEMENTS // n)
    boot = np.empty(n_resamples, dtype=float)
    for start in range(0, n_resamples, chunk):
        stop = min(start + chunk, n_resamples)
        idx = rng.integers(0, n, size=(stop - start, n))
        boot[start:stop] = fn(x[idx])
    alpha = 1.0 - confidence
    lo, hi = np.quantile(boot, [alpha / 2.0, 1.0 - alpha / 2.0])
    return float(lo), float(hi)


def bootstrap_ci(samples: Sequence[float] | np.ndarray, *, statistic: Statistic = "mean",
                 confidence: float = 0.95, n_resamples: int = 10_000, seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap confidence interval of `statistic` over `samples`.

    Resamples with replacement `n_resamples` times (index matrix drawn from `numpy.random.default_rng(seed)`,
    evaluated in vectorised chunks) and returns the `(1-confidence)/2` and `(1+confidence)/2` quantiles (linear
    interpolation) of the resampled statistic. `statistic` is "mean", "median" or a callable `f(x, axis)`.

    Non-finite samples are dropped. No samples: `(nan, nan)`. One sample or all samples equal: the
    zero-width interval `(s, s)` with `s` the statistic of the sample, without resampling or warnings.
    """
    _check_confidence(confidence)
    if n_resamples < 1:
        raise ValueError(f"n_resamples must be >= 1, got {n_resamples}")
    fn = _statistic_fn(statistic)
    x = _finite(samples)
    if x.size == 0:
        return math.nan, math.nan
    if x.size == 1 or np.all(x == x[0]):
        s = float(fn(x[None, :])[0])
        return s, s
    return _percentile_bootstrap(x, fn, confidence, n_resamples, seed)


def _paired_differences(a: Sequence[float] | np.ndarray, b: Sequence[float] | np.ndarray) -> np.ndarray:
    """`b - a` over the pairs where both values are finite."""
    a_ = np.asarray(a, dtype=float).ravel()
    b_ = np.asarray(b, dtype=float).ravel()
    if a_.shape != b_.shape:
        raise ValueError(f"paired samples differ in length: {a_.size} vs {b_.size}")
    keep = np.isfinite(a_) & np.isfinite(b_)
    return b_[keep] - a_[keep]


def paired_bootstrap_ci(a: Sequence[float] | np.ndarray, b: Sequence[float] | np.ndarray, *,
                        confidence: float = 0.95, n_resamples: int = 10_000,
                        seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap CI of the mean paired difference `mean(b - a)`.

    Pairs (not the two samples independently) are resampled, which for the mean is the same as bootstrapping
    the differences. Pairs with a non-finite value are dropped; degenerate cases behave as in `bootstrap_ci`.
    """
    return bootstrap_ci(_paired_differences(a, b), statistic="mean", confidence=confidence,
                        n_resamples=n_resamples, seed=seed)


@dataclass(frozen=True)
class PairedComparison:
    """Result of `paired_comparison`; `delta` is `mean(other - base)` over the `n` complete pairs."""

    n: int
    delta: float
    ci_low: float
    ci_high: float
    p_value: float
    sd_diff: float  # sample standard deviation (ddof=1) of the paired differences; NaN when n < 2

    @property
    def excludes_zero(self) -> bool:
        """Whether the CI lies strictly on one side of zero; False for fewer than two pairs, where the
        zero-width interval carries no evidence."""
        return self.n >= 2 and (self.ci_low > 0.0 or self.ci_high < 0.0)


def paired_comparison(base: Sequence[float] | np.ndarray, other: Sequence[float] | np.ndarray, *,
                      confidence: float = 0.95, n_resamples: int = 10_000, seed: int = 0) -> PairedComparison:
    """Mean paired difference `other - base`, its percentile bootstrap CI and a paired t-test p-value.

    The p-value is two-sided from `scipy.stats.ttest_rel(other, base)`. It is NaN when there are fewer than
    two complete pairs or when the differences have zero variance, i.e. are equal up to floating-point
    rounding (the t statistic is undefined there; scipy would return NaN, +-inf or a spurious tiny p with a
    precision warning). Pairs with a non-finite value are dropped.
    """
    d = _paired_differences(base, other)
    n = int(d.size)
    if n == 0:
        return PairedComparison(0, math.nan, math.nan, math.nan, math.nan, math.nan)
    lo, hi = bootstrap_ci(d, confidence=confidence, n_resamples=n_resamples, seed=seed)
    delta = float(np.mean(d))
    if n < 2:
        return PairedComparison(n, delta, lo, hi, math.nan, math.nan)
    sd = float(np.std(d, ddof=1))
    p = math.nan
    # Differences equal up to rounding (e.g. 0.3-0.2 vs 0.2-0.1) count as zero variance.
    if sd > 1e3 * np.finfo(float).eps * float(np.max(np.abs(d))):
        b_ = np.asarray(base, dtype=float).ravel()
        o_ = np.asarray(other, dtype=float).ravel()
        keep = np.isfinite(b_) & np.isfinite(o_)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            p = float(sps.ttest_rel(o_[keep], b_[keep]).pvalue)
    return PairedComparison(n, delta, lo, hi, p, sd)


def holm(pvalues: Sequence[float] | np.ndarray) -> np.ndarray:
    """Holm step-down adjusted p-values, in the input order.

    With the `m` finite p-values sorted ascending, `p_(i)` becomes `max_{j <= i} min(1, (m - j + 1) p_(j))`.
    Non-finite entries (NaN: comparison not testable) are left as NaN and are not counted in the family.
    """
    p = np.asarray(pvalues, dtype=float).ravel()
    out = np.full(p.shape, math.nan)
    idx = np.flatnonzero(np.isfinite(p))
    m = idx.size
    if m == 0:
        return out
    if np.any((p[idx] < 0.0) | (p[idx] > 1.0)):
        raise ValueError("p-values must lie in [0, 1]")
    order = np.argsort(p[idx], kind="stable")
    adj = (m - np.arange(m)) * p[idx][order]
    adj = np.minimum(np.maximum.accumulate(adj), 1.0)
    out[idx[order]] = adj
    return out


# --- power of a paired (one-sample on differences) two-sided t-test -------------------------------------------


def paired_t_power(n: float, effect_size: float, alpha: float = 0.05) -> float:
    """Power of the two-sided one-sample t-test on `n` paired differences at standardized effect
    `effect_size` = |mean difference| / sd of differences (Cohen's d_z), from the noncentral t distribution:
    `P(T > t_crit) + P(T < -t_crit)` with `T ~ nct(n - 1, d sqrt(n))`. `n` may be fractional (> 1)."""
    df = n - 1.0
    nc = abs(effect_size) * math.sqrt(n)
    tc = sps.t.isf(alpha / 2.0, df)
    upper = float(sps.nct.sf(tc, df, nc))
    if not math.isfinite(upper):
        upper = 1.0 - float(sps.nct.cdf(tc, df, nc))
    lower = float(sps.nct.cdf(-tc, df, nc))
    # scipy's nct can return NaN for the far tail at a large noncentrality; that tail is then negligible.
    return min(1.0, upper + (lower if math.isfinite(lower) else 0.0))


def _check_power_args(alpha: float, power: float) -> None:
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must lie in (0, 1), got {alpha}")
    if not 0.0 < power < 1.0:
        raise ValueError(f"power must lie in (0, 1), got {power}")


def seeds_for_power(effect: float, sd_diff: float, alpha: float = 0.05, power: float = 0.8,
                    *, max_seeds: int = 10_000_000) -> int | float:
    """Seeds per arm (= number of pairs) for a paired two-sided t-test to reach `power` at level `alpha`.

    Exact in the noncentral t distribution: returns the smallest integer n >= 2 with
    `paired_t_power(n, |effect| / sd_diff, alpha) >= power` (= the continuous solution rounded up, since the
    power increases with n), found by an integer search started at the normal approximation.
    Returns `math.inf` when `effect == 0` or more than `max_seeds` would be needed, NaN for non-finite input
    or a negative sd, and 2 (the minimum for the test) when `sd_diff == 0` and `effect != 0`.
    """
    _check_power_args(alpha, power)
    if not (math.isfinite(effect) and math.isfinite(sd_diff)) or sd_diff < 0.0:
        return math.nan
    if effect == 0.0:
        return math.inf
    if sd_diff == 0.0:
        return 2
    d = abs(effect) / sd_diff

    def gap(n: float) -> float:
        return paired_t_power(n, d, alpha) - power

    if gap(2.0) >= 0.0:
        return 2
    # Power increases with n: gallop from the normal approximation to a bracket (fail, ok] of integers, then
    # bisect it. The normal start is within a few seeds of the answer, so this takes a handful of evaluations.
    z = sps.norm.isf(alpha / 2.0) + sps.norm.ppf(power)
    start = (z / d) ** 2
    if start > max_seeds:
        return math.inf
    n, stride = max(3, math.ceil(start)), 1
    if gap(n) >= 0.0:
        ok, fail = n, None
        while fail is None:  # terminates: gap(2) < 0
            cand = max(2, ok - stride)
            if gap(cand) >= 0.0:
                ok, stride = cand, stride * 2
            else:
                fail = cand
    else:
        fail, ok = n, None
        while ok is None:
            cand = fail + stride
            if cand > 2 * max_seeds:
                return math.inf
            if gap(cand) >= 0.0:
                ok = cand
            else:
                fail, stride = cand, stride * 2
    while ok - fail > 1:
        mid = (ok + fail) // 2
        if gap(mid) >= 0.0:
            ok = mid
        else:
            fail = mid
    return ok if ok <= max_seeds else math.inf


def minimum_detectable_effect(n: int, sd_diff: float, alpha: float = 0.05, power: float = 0.8) -> float:
    """Smallest |mean paired difference| (in the metric's units) that `n` pairs detect with probability
    `power` in a two-sided paired t-test at level `alpha`: `d * sd_diff` with `d` solving
    `paired_t_power(n, d, alpha) = power`. NaN when `n < 2` or `sd_diff` is non-finite or negative; 0 when
    `sd_diff == 0`."""
    _check_power_args(alpha, power)
    if n < 2 or not math.isfinite(sd_diff) or sd_diff < 0.0:
        return math.nan
    if sd_diff == 0.0:
        return 0.0

    def gap(d: float) -> float:
        return paired_t_power(n, d, alpha) - power

    hi = 1.0
    while gap(hi) < 0.0:
        hi *= 2.0
        if hi > 1e9:
            return math.inf
    d = optimize.brentq(gap, 0.0, hi, xtol=1e-12, rtol=1e-12)
    return float(d * sd_diff)


def generations_per_arm(seeds: float, steps: float, problems_per_step: float, rollouts_per_problem: float) -> float:
    """Generations one arm consumes: seeds x steps x problems per step x rollouts per problem (inf and NaN
    propagate, so an unreachable seed count gives an unreachable budget)."""
    return float(seeds) * float(steps) * float(problems_per_step) * float(rollouts_per_problem)
