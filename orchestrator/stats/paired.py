"""Statistics for campaign reports: normalized AUC, confidence intervals, paired comparisons and Holm correction
(the paired t-test's power and sample size: orchestrator/stats/power.py). The computations are the libraries'
(`scipy.integrate.trapezoid`, `scipy.stats.ttest_rel` / `ttest_1samp(...).confidence_interval()`,
`scipy.stats.bootstrap`); Holm is written out (see `holm`).

Conventions used throughout:
- Non-finite samples (NaN, inf) are dropped before any computation; a paired sample is dropped when either of
  its two values is non-finite.
- Paired differences are always `other - base` (`b - a`), so a positive delta means `other` is higher.
- Intervals that support a claim (a group's CI, a delta's CI) are t intervals and need at least
  `MIN_SEEDS` seeds / `MIN_PAIRS` pairs; below that they are NaN ("too few seeds"). A bootstrap CI cannot
  reach its nominal coverage at a handful of seeds (the resampled mean never leaves [min, max] of the sample:
  at 4 seeds that caps coverage at 87.5%; over 400 synthetic no-effect campaigns, BCa and percentile intervals
  excluded zero in 19-22% of them at 4 seeds and 10-12% at 8), while the paired t interval excludes zero
  exactly when the paired t-test rejects, at the nominal rate (4.5-5.3% in the same campaigns; see
  tests/unit/report/test_report_calibration.py). The BCa bootstrap CI is still written to the CSVs for reference.
  The report's `*` is not a single interval: it marks the report's one primary test, the Holm-adjusted p within
  the primary measure's family, or a sweep's primary trend, or the adaptive stop's decision
  (`orchestrator.report.claims`).
- Bounded metrics (rates, pass@k, success; `metric_bounds`) get intervals clipped to their range.
- Paired differences that are all equal (zero variance) have no t statistic: no interval, no p-value, never a
  `*`; `PairedComparison.zero_variance` says so and the tables write it as a note.
- Nothing here warns on degenerate input (no samples, one sample, all samples equal); such cases return NaN or
  a zero-width interval as documented per function.
"""

from __future__ import annotations

import math
import re
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
from scipy import stats as sps
from scipy.integrate import trapezoid

Statistic = Literal["mean", "median"] | Callable[..., np.ndarray]

MIN_SEEDS = 3  # fewest seeds for a group CI
MIN_PAIRS = 3  # fewest seed pairs for a delta CI, its `*` and its p-value
_BOUNDED = re.compile(r"(^|[/_.])(rate|pass@\w+|success\w*|accuracy|acc|correct\w*|solved|frac\w*)$")


def metric_bounds(metric: str) -> tuple[float, float] | None:
    """(0, 1) for metrics that are shares by construction (`*_rate`, `pass@k`, `success*`, `accuracy`, ...),
    judged from the metric's name (the last path segment), else None."""
    last = metric.rsplit("/", 1)[-1]
    return (0.0, 1.0) if _BOUNDED.search(last) else None


_NATS = re.compile(r"(entropy|surprisal|varentropy|kl|nats|logprob|log_prob)")
_LOSS = re.compile(r"(^|/)loss(/|$)|loss")


def metric_kind(metric: str) -> Literal["rate", "nats", "loss", "value"]:
    """What a metric measures, from its name, not its values: "rate" (a share in [0, 1], printed as % and pp),
    "nats" (entropies, surprisals, KL), "loss" (a loss: `loss`, `loss/*`, `*_loss`), else "value"."""
    if metric_bounds(metric):
        return "rate"
    if _LOSS.search(metric):
        return "loss"
    if _NATS.search(metric.rsplit("/", 1)[-1]):
        return "nats"
    return "value"


def delta_bounds(metric: str) -> tuple[float, float] | None:
    """The range of a difference of two values of `metric`: (-1, 1) for a bounded metric, else None."""
    b = metric_bounds(metric)
    return (b[0] - b[1], b[1] - b[0]) if b else None


def clip_interval(lo: float, hi: float, bounds: tuple[float, float] | None) -> tuple[float, float]:
    """`(lo, hi)` clipped to `bounds` (NaN stays NaN)."""
    if bounds is None:
        return lo, hi
    a, b = bounds
    return (min(max(lo, a), b) if math.isfinite(lo) else lo, max(min(hi, b), a) if math.isfinite(hi) else hi)


def window_auc(steps: Sequence[float] | np.ndarray, values: Sequence[float] | np.ndarray,
               window: tuple[int, int], *, grid: Sequence[float] | np.ndarray | None = None,
               interpolate: bool = False) -> tuple[float, str]:
    """`(normalized AUC, "")`, or `(nan, why)` when the run cannot give one for `window`.

    The AUC is `scipy.integrate.trapezoid` of `values(steps)` over `lo <= step <= hi`, divided by `hi - lo`:
    the mean of the metric over the window (a constant curve gives the constant). Points are sorted by step;
    a step with a non-finite value is missing. A run needs a value at `lo` and at `hi`; a run missing a step
    inside the window (a non-finite value, or a step of `grid`, the steps the metric is logged at, e.g. every
    eval step of the campaign) is dropped unless `interpolate` (then the trapezoid bridges the gap linearly). Raises `ValueError` unless
    `lo < hi`.
    """
    lo, hi = window
    if not lo < hi:
        raise ValueError(f"window must satisfy lo < hi, got {window}")
    s = np.asarray(steps, dtype=float).ravel()
    v = np.asarray(values, dtype=float).ravel()
    if s.shape != v.shape:
        raise ValueError(f"steps and values differ in length: {s.shape} vs {v.shape}")
    expected = s if grid is None else np.union1d(s, np.asarray(grid, dtype=float))  # a NaN row is a gap too
    last = f"; its last value is at step {int(np.max(s[np.isfinite(v)]))}" if np.isfinite(v).any() else ""
    inside = (s >= lo) & (s <= hi) & np.isfinite(v)
    s, v = s[inside], v[inside]
    ends = [e for e in (lo, hi) if not np.any(s == e)]
    if ends:
        return math.nan, "no value at step " + " and ".join(map(str, ends)) + last
    if not interpolate:
        gaps = np.setdiff1d(expected[(expected > lo) & (expected < hi)], s)
        if gaps.size:
            return math.nan, ("no value at interior step " + ", ".join(str(int(x)) for x in gaps)
                              + " (interpolation across a missing step is off)")
    order = np.argsort(s, kind="stable")
    return float(trapezoid(v[order], s[order])) / (hi - lo), ""


def normalized_auc(steps: Sequence[float] | np.ndarray, values: Sequence[float] | np.ndarray,
                   window: tuple[int, int], *, grid: Sequence[float] | np.ndarray | None = None,
                   interpolate: bool = False) -> float:
    """`window_auc` without the reason: NaN when the run did not cover the window (no point exactly at `lo` or
    at `hi`, or a `grid` step missing inside it without `interpolate`)."""
    return window_auc(steps, values, window, grid=grid, interpolate=interpolate)[0]


def _statistic_fn(statistic: Statistic) -> Callable[..., np.ndarray]:
    """A vectorised function `f(x, axis=-1)` for a named or callable statistic."""
    if statistic == "mean":
        return lambda x, axis=-1: np.mean(x, axis=axis)
    if statistic == "median":
        return lambda x, axis=-1: np.median(x, axis=axis)
    if callable(statistic):
        return lambda x, axis=-1: np.asarray(statistic(x, axis=axis), dtype=float)
    raise ValueError(f"statistic must be 'mean', 'median' or a callable f(x, axis), got {statistic!r}")


def _check_confidence(confidence: float) -> None:
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must lie in (0, 1), got {confidence}")


def _finite(samples: Sequence[float] | np.ndarray) -> np.ndarray:
    x = np.asarray(samples, dtype=float).ravel()
    return x[np.isfinite(x)]


def bootstrap_ci(samples: Sequence[float] | np.ndarray, *, statistic: Statistic = "mean",
                 confidence: float = 0.95, n_resamples: int = 10_000, seed: int = 0,
                 method: Literal["BCa", "percentile"] = "BCa") -> tuple[float, float]:
    """Bootstrap confidence interval of `statistic` over `samples`: `scipy.stats.bootstrap` with `method`
    (BCa by default) and `rng=seed`; where BCa is not defined (its acceleration or bias correction is NaN, e.g.
    a statistic constant on every jackknife sample) the percentile interval of the same resamples.
    `statistic` is "mean", "median" or a callable `f(x, axis)`.

    Non-finite samples are dropped. No samples: `(nan, nan)`. One sample or all samples equal: the
    zero-width interval `(s, s)` with `s` the statistic of the sample, without resampling or warnings.
    """
    _check_confidence(confidence)
    if n_resamples < 1:
        raise ValueError(f"n_resamples must be >= 1, got {n_resamples}")
    if method not in ("BCa", "percentile"):
        raise ValueError(f"method must be 'BCa' or 'percentile', got {method!r}")
    fn = _statistic_fn(statistic)
    x = _finite(samples)
    if x.size == 0:
        return math.nan, math.nan
    if x.size == 1 or np.all(x == x[0]):
        s = float(fn(x[None, :])[0])
        return s, s
    for m in (method, "percentile"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # scipy's DegenerateDataWarning: handled by the fallback
            res = sps.bootstrap((x,), fn, vectorized=True, n_resamples=n_resamples, confidence_level=confidence,
                                method=m, rng=seed)
        lo, hi = float(res.confidence_interval.low), float(res.confidence_interval.high)
        if math.isfinite(lo) and math.isfinite(hi):
            return lo, hi
    return lo, hi


def t_interval(samples: Sequence[float] | np.ndarray, *, confidence: float = 0.95) -> tuple[float, float]:
    """Student t interval of the mean of `samples` (non-finite dropped):
    `scipy.stats.ttest_1samp(x, 0).confidence_interval(confidence)`. NaN for fewer than two samples; zero width
    when all samples are equal."""
    _check_confidence(confidence)
    x = _finite(samples)
    if x.size < 2:
        return math.nan, math.nan
    if np.all(x == x[0]):
        return float(x[0]), float(x[0])
    ci = sps.ttest_1samp(x, 0.0).confidence_interval(confidence)
    return float(ci.low), float(ci.high)


def group_ci(samples: Sequence[float] | np.ndarray, *, confidence: float = 0.95,
             bounds: tuple[float, float] | None = None) -> tuple[float, float]:
    """The report's CI of a group mean: the t interval, clipped to `bounds`; NaN below `MIN_SEEDS` seeds."""
    x = _finite(samples)
    if x.size < MIN_SEEDS:
        return math.nan, math.nan
    return clip_interval(*t_interval(x, confidence=confidence), bounds)


def _paired_differences(a: Sequence[float] | np.ndarray, b: Sequence[float] | np.ndarray) -> np.ndarray:
    """`b - a` over the pairs where both values are finite."""
    a_ = np.asarray(a, dtype=float).ravel()
    b_ = np.asarray(b, dtype=float).ravel()
    if a_.shape != b_.shape:
        raise ValueError(f"paired samples differ in length: {a_.size} vs {b_.size}")
    keep = np.isfinite(a_) & np.isfinite(b_)
    return b_[keep] - a_[keep]


def paired_bootstrap_ci(a: Sequence[float] | np.ndarray, b: Sequence[float] | np.ndarray, *,
                        confidence: float = 0.95, n_resamples: int = 10_000, seed: int = 0,
                        method: Literal["BCa", "percentile"] = "BCa") -> tuple[float, float]:
    """Bootstrap CI of the mean paired difference `mean(b - a)` (`bootstrap_ci` of the differences).

    Pairs (not the two samples independently) are resampled, which for the mean is the same as bootstrapping
    the differences. Pairs with a non-finite value are dropped; degenerate cases behave as in `bootstrap_ci`.
    """
    return bootstrap_ci(_paired_differences(a, b), statistic="mean", confidence=confidence,
                        n_resamples=n_resamples, seed=seed, method=method)


@dataclass(frozen=True)
class PairedComparison:
    """Result of `paired_comparison`; `delta` is `mean(other - base)` over the `n` complete pairs.

    `ci_low, ci_high`: the paired t interval; `p_value`: the paired t-test (both NaN below `MIN_PAIRS` pairs or
    at zero variance); `boot_low, boot_high`: the BCa bootstrap interval of the mean difference, for reference
    only (it under-covers at few seeds; NaN below `MIN_PAIRS` pairs); `zero_variance`: every paired difference
    is the same (up to rounding), so no t statistic exists."""

    n: int
    delta: float
    ci_low: float
    ci_high: float
    p_value: float
    sd_diff: float  # sample standard deviation (ddof=1) of the paired differences; NaN when n < 2
    boot_low: float = math.nan
    boot_high: float = math.nan
    zero_variance: bool = False

    @property
    def too_few(self) -> bool:
        return self.n < MIN_PAIRS

    @property
    def excludes_zero(self) -> bool:
        """Whether the CI lies strictly on one side of zero; always False below `MIN_PAIRS` pairs and at zero
        variance (the interval is not defined there)."""
        return not self.too_few and not self.zero_variance and (self.ci_low > 0.0 or self.ci_high < 0.0)

    @property
    def note(self) -> str:
        """Why no test was made: too few pairs, or zero variance; "" otherwise."""
        if self.too_few:
            return f"too few seeds ({self.n} pairs; {MIN_PAIRS} needed for a CI)"
        if self.zero_variance:
            return f"zero variance: all {self.n} paired differences equal {self.delta:+.4g}; no test"
        return ""


def is_constant(d: np.ndarray) -> bool:
    """All values equal up to rounding (differences 0.3-0.2 vs 0.2-0.1): a t statistic is undefined."""
    return bool(np.ptp(d) <= 1e3 * np.finfo(float).eps * max(float(np.max(np.abs(d))), np.finfo(float).tiny))


def paired_comparison(base: Sequence[float] | np.ndarray, other: Sequence[float] | np.ndarray, *,
                      confidence: float = 0.95, n_resamples: int = 10_000, seed: int = 0,
                      bounds: tuple[float, float] | None = None, bootstrap: bool = True) -> PairedComparison:
    """Mean paired difference `other - base`, its paired t interval and the paired t-test p-value.

    Both are `scipy.stats.ttest_rel(other, base)` (its `.confidence_interval(confidence)` and `.pvalue`), so the
    interval excludes zero exactly when the two-sided p-value is below `1 - confidence`. Both need `MIN_PAIRS`
    complete pairs. Differences with zero variance (equal up to floating-point rounding) have no t statistic:
    interval and p-value are NaN and `zero_variance` is set. `bounds` clips the intervals (the range of a
    difference, e.g. (-1, 1) for rates). `bootstrap`: also compute the BCa bootstrap CI (`n_resamples`,
    `seed`). Pairs with a non-finite value are dropped.
    """
    _check_confidence(confidence)
    d = _paired_differences(base, other)
    n = int(d.size)
    if n == 0:
        return PairedComparison(0, math.nan, math.nan, math.nan, math.nan, math.nan)
    delta = float(np.mean(d))
    sd = float(np.std(d, ddof=1)) if n >= 2 else math.nan
    if n < MIN_PAIRS:
        return PairedComparison(n, delta, math.nan, math.nan, math.nan, sd)
    if is_constant(d):
        return PairedComparison(n, delta, math.nan, math.nan, math.nan, 0.0, zero_variance=True)
    keep = np.isfinite(np.asarray(base, float).ravel()) & np.isfinite(np.asarray(other, float).ravel())
    res = sps.ttest_rel(np.asarray(other, float).ravel()[keep], np.asarray(base, float).ravel()[keep])
    ci = res.confidence_interval(confidence)
    lo, hi = clip_interval(float(ci.low), float(ci.high), bounds)
    boot = (bootstrap_ci(d, confidence=confidence, n_resamples=n_resamples, seed=seed) if bootstrap
            else (math.nan, math.nan))
    return PairedComparison(n, delta, lo, hi, float(res.pvalue), sd, *clip_interval(*boot, bounds))


def holm(pvalues: Sequence[float] | np.ndarray) -> np.ndarray:
    """Holm step-down adjusted p-values in the input order, along the last axis (one family per row of a 2-D
    array): the i-th smallest of m p-values times (m - i), made monotone by a running maximum and capped at 1;
    equal to `statsmodels` `multipletests(method="holm")` (tests/unit/stats/test_report_stats.py). Written out
    because statsmodels' Holm runs `gc.collect()` on every call (a third of a second in a loaded process) and
    takes one family at a time. Non-finite entries (NaN: comparison not testable) stay NaN and are not
    counted in the family."""
    p = np.asarray(pvalues, dtype=float)
    finite = np.isfinite(p)
    if np.any((p[finite] < 0.0) | (p[finite] > 1.0)):
        raise ValueError("p-values must lie in [0, 1]")
    if p.size == 0:
        return np.full(p.shape, math.nan)
    order = np.argsort(np.where(finite, p, np.inf), axis=-1, kind="stable")
    ranked = np.take_along_axis(p, order, axis=-1)
    m = finite.sum(axis=-1, keepdims=True)
    adjusted = np.minimum(1.0, np.maximum.accumulate(ranked * (m - np.arange(p.shape[-1])), axis=-1))
    out = np.empty_like(p)
    np.put_along_axis(out, order, adjusted, axis=-1)
    return np.where(finite, out, math.nan)
