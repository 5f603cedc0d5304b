"""Power and sample size of a paired (one-sample on differences) two-sided t-test, for campaign reports and
plans: `statsmodels` `TTestPower` (noncentral t, both tails), with the far tail computed from scipy where
statsmodels underflows to NaN. Effects are in the metric's units with `sd_diff` the sd of paired differences;
`effect / sd_diff` is Cohen's d_z."""

from __future__ import annotations

import functools
import math
import warnings

import numpy as np
import scipy.stats as sps
from scipy import optimize
from statsmodels.stats.power import TTestPower

_POWER = TTestPower()


def paired_t_power(n: float, effect_size: float, alpha: float = 0.05) -> float:
    """Power of the two-sided one-sample t-test on `n` paired differences at standardized effect
    `effect_size` = |mean difference| / sd of differences (Cohen's d_z): `statsmodels` `TTestPower().power`
    (noncentral t, both tails). `n` may be fractional (> 1)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pw = float(_POWER.power(effect_size=abs(effect_size), nobs=n, alpha=alpha, alternative="two-sided"))
        if not math.isfinite(pw):  # statsmodels gives NaN where the far tail underflows (large d, few pairs)
            df, nc = n - 1.0, abs(effect_size) * math.sqrt(n)
            tc = float(sps.t.isf(alpha / 2.0, df))
            far = float(sps.nct.cdf(-tc, df, nc))
            pw = float(sps.nct.sf(tc, df, nc)) + (far if math.isfinite(far) else 0.0)
    return min(1.0, pw) if math.isfinite(pw) else 1.0


def _check_power_args(alpha: float, power: float) -> None:
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must lie in (0, 1), got {alpha}")
    if not 0.0 < power < 1.0:
        raise ValueError(f"power must lie in (0, 1), got {power}")


def seeds_for_power(effect: float, sd_diff: float, alpha: float = 0.05, power: float = 0.8,
                    *, max_seeds: int = 10_000_000) -> int | float:
    """Seeds per arm (= number of pairs) for a paired two-sided t-test to reach `power` at level `alpha`:
    the smallest integer n >= 2 with `paired_t_power(n, |effect| / sd_diff, alpha) >= power`, i.e.
    `statsmodels` `TTestPower().solve_power(...)` rounded up (checked on the integers around it).
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
    if paired_t_power(2, d, alpha) >= power:
        return 2
    if paired_t_power(max_seeds, d, alpha) < power:
        return math.inf
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            n0 = float(_POWER.solve_power(effect_size=d, alpha=alpha, power=power, alternative="two-sided"))
    except (ValueError, ArithmeticError):
        n0 = math.nan
    if not math.isfinite(n0):  # solver failed: start from the normal approximation
        n0 = ((sps.norm.isf(alpha / 2.0) + sps.norm.ppf(power)) / d) ** 2
    n = max(2, math.ceil(n0 - 1e-9))
    while paired_t_power(n, d, alpha) < power:
        n += 1
    while n > 2 and paired_t_power(n - 1, d, alpha) >= power:
        n -= 1
    return n if n <= max_seeds else math.inf


def minimum_detectable_effect(n: int, sd_diff: float, alpha: float = 0.05, power: float = 0.8) -> float:
    """Smallest |mean paired difference| (in the metric's units) that `n` pairs detect with probability
    `power` in a two-sided paired t-test at level `alpha`: `d * sd_diff` with `d` the root of
    `paired_t_power(n, d, alpha) = power` (brentq on a bracket doubled until it holds the root), checked
    against that power before it is returned. statsmodels' `solve_power` is not used here: at 3-4 pairs and a
    family's Bonferroni level it stops at its own bracket and returns an effect with far less power (3 pairs,
    alpha 0.05/4: 5.00 sd, power 0.61; the root is 6.55 sd). NaN when `n < 2` or `sd_diff` is non-finite or
    negative; 0 when `sd_diff == 0` or `power <= alpha` (no effect at all is detected that often); inf when no
    finite effect reaches `power`."""
    _check_power_args(alpha, power)
    if n < 2 or not math.isfinite(sd_diff) or sd_diff < 0.0:
        return math.nan
    if sd_diff == 0.0 or power <= alpha:
        return 0.0

    return _effect_for(lambda d: paired_t_power(n, d, alpha), power,
                       f"minimum detectable effect (n={n}, alpha={alpha}, power={power})") * sd_diff


def _effect_for(power_at, power: float, what: str, xtol: float = 1e-10) -> float:
    """The standardized effect d with `power_at(d) = power` (power_at increasing from alpha): brentq on a bracket
    doubled until it holds the root, checked against `power` before it is returned; inf past d = 1e6."""
    def gap(d: float) -> float:
        return power_at(d) - power

    hi = 1.0
    while gap(hi) < 0.0:
        hi *= 2.0
        if hi > 1e6:
            return math.inf
    d = float(optimize.brentq(gap, hi / 2.0 if hi > 1.0 else 0.0, hi, xtol=xtol, rtol=1e-12))
    if abs(gap(d)) > 1e-6:  # the power it promises must be the power it has
        raise ArithmeticError(f"{what}: no root found")
    return d


def generations_per_arm(seeds: float, steps: float, problems_per_step: float, rollouts_per_problem: float) -> float:
    """Generations one arm consumes: seeds x steps x problems per step x rollouts per problem (inf and NaN
    propagate, so an unreachable seed count gives an unreachable budget)."""
    return float(seeds) * float(steps) * float(problems_per_step) * float(rollouts_per_problem)


_GL_X, _GL_W = np.polynomial.legendre.leggauss(48)  # nodes of each of `expected_power`'s 16 panels


def expected_power(n: int, effect_size: float, alpha: float = 0.05) -> float:
    """Power of the two-sided paired t-test on `n` pairs at `effect_size` = |effect| / s, where s is an sd of
    paired differences observed on `n` pairs (independent of the test's own), averaged over s's sampling
    distribution: E[power(n, effect_size * s / sigma)] with (n - 1) s^2 / sigma^2 ~ chi2(n - 1), for any sigma.
    It is the detection rate of an effect stated as a multiple of an observed sd, over the campaigns that could
    have observed it: at 3-4 seeds s is below sigma in most campaigns, so the plug-in power at s overstates it
    (an effect with 80% plug-in power is detected in about 62% at 3 seeds). The same number is the predictive
    power under a 1/sigma prior. Gauss-Legendre over log u (u the chi2 variate, from 1e-14 to far in its tail;
    the integrand is smooth there) on scipy's noncentral t, vectorised; tests/unit/stats checks it against
    `scipy.integrate.quad` and a simulation."""
    if n < 2 or not math.isfinite(effect_size):
        return math.nan
    df = n - 1
    edges = np.linspace(math.log(1e-14), math.log(60.0 + 30.0 * df), 17)
    lo, hi = edges[:-1, None], edges[1:, None]
    v = ((lo + hi) / 2.0 + (hi - lo) / 2.0 * _GL_X).ravel()
    w = ((hi - lo) / 2.0 * _GL_W).ravel()
    u = np.exp(v)
    nc = abs(effect_size) * np.sqrt(u / df * n)
    tc = float(sps.t.isf(alpha / 2.0, df))
    with np.errstate(all="ignore"):  # the far tail underflows to NaN where it is 0
        pw = np.nan_to_num(sps.nct.sf(tc, df, nc), nan=1.0) + np.nan_to_num(sps.nct.cdf(-tc, df, nc), nan=0.0)
    return float(np.clip(np.sum(w * np.minimum(pw, 1.0) * sps.chi2.pdf(u, df) * u), 0.0, 1.0))


@functools.lru_cache(maxsize=256)
def _stated_factor(n: int, alpha: float, power: float) -> float:
    """The d with `expected_power(n, d, alpha) = power` (cached: a report asks for a few (n, alpha) only)."""
    return _effect_for(lambda d: expected_power(n, d, alpha), power,
                       f"stated MDE (n={n}, alpha={alpha}, power={power})", xtol=1e-9)


def stated_mde(n: int, sd_observed: float, alpha: float = 0.05, power: float = 0.8) -> float:
    """The minimum detectable effect a report states from the sd of paired differences it observed on `n`
    pairs: `d * sd_observed` with `expected_power(n, d, alpha) = power`, so an effect of the stated size is
    detected with probability `power` over the campaigns that state it, whatever the true sd (not only when the
    observed sd happens to equal it). Larger than `minimum_detectable_effect(n, sd_observed, ...)`, which holds
    `power` for a known sd. NaN when `n < 2` or `sd_observed` is non-finite or negative; 0 when it is 0 or
    `power <= alpha`; inf when no finite effect reaches `power`."""
    _check_power_args(alpha, power)
    if n < 2 or not math.isfinite(sd_observed) or sd_observed < 0.0:
        return math.nan
    if sd_observed == 0.0 or power <= alpha:
        return 0.0
    return _stated_factor(int(n), float(alpha), float(power)) * sd_observed
