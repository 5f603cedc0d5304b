"""Group-sequential testing for adaptive seeds: alpha spending over repeated looks at a paired contrast.

A campaign with adaptive seeds looks at its contrast after `n_1 < n_2 < ... < n_K` seed pairs and stops at the
first look whose interval excludes zero. Looking K times at the nominal 5% would claim an effect far more often
than 5% when there is none; the Lan-DeMets alpha-spending approach spends the 5% over the looks instead, here
with the O'Brien-Fleming-type function alpha(t) = 2 - 2 Phi(z_{1-alpha/2} / sqrt(t)) of the information fraction
t = n_k / n_K (tiny spends early, nearly the whole alpha at the last look). Look k's two-sided z boundary c_k
solves P(|Z_1| < c_1, ..., |Z_{k-1}| < c_{k-1}, |Z_k| >= c_k) = alpha(t_k) - alpha(t_{k-1}) under no effect,
where Z_k = S_k / sqrt(n_k) and S is a sum of independent unit-variance increments (the canonical joint
distribution); the probabilities come from the recursive numerical integration of Armitage, McPherson and Rowe
(1969) on a grid. Those z boundaries hold the rate for a z statistic (4.997% at 5%), but the looks test a paired
t statistic at a handful of pairs, whose joint law over the looks is not the z's (each look re-estimates the sd
from 2-15 degrees of freedom): the z levels applied to t p-values claim 5.66% (100,000 simulated campaigns).
`nominal_alphas` therefore calibrates each look's level for the t reference so the same spending function holds
for the t procedure (see its docstring), and tests/unit/report/test_claims_calibration.py checks the whole
procedure's false-claim rate on fresh simulations against alpha within the simulation's standard error.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import numpy as np
from scipy import optimize
from scipy import stats as sps

GRID = 1601  # points across the continuation region at each look


def obrien_fleming_spending(t: np.ndarray | float, alpha: float = 0.05) -> np.ndarray:
    """Cumulative two-sided alpha spent by information fraction `t` in (0, 1] (Lan-DeMets O'Brien-Fleming type)."""
    t = np.asarray(t, dtype=float)
    return 2.0 - 2.0 * sps.norm.cdf(sps.norm.ppf(1.0 - alpha / 2.0) / np.sqrt(t))


def z_boundaries(looks: Sequence[int], alpha: float = 0.05) -> np.ndarray:
    """Two-sided z boundaries c_k, shape (K,), for looks after `looks` (increasing sample sizes) pairs."""
    n = np.asarray(looks, dtype=float)
    if n.ndim != 1 or n.size == 0 or np.any(np.diff(n) <= 0) or n[0] <= 0:
        raise ValueError(f"looks must be increasing positive sample sizes, got {list(looks)}")
    spent = obrien_fleming_spending(n / n[-1], alpha)
    increments = np.diff(spent, prepend=0.0)
    bounds = np.empty(n.size)
    bounds[0] = sps.norm.isf(increments[0] / 2.0)
    # density of S_1 = sqrt(n_1) Z_1 on the continuation region |S_1| < c_1 sqrt(n_1)
    grid = np.linspace(-1.0, 1.0, GRID) * bounds[0] * np.sqrt(n[0])
    dens = sps.norm.pdf(grid, scale=np.sqrt(n[0]))
    for k in range(1, n.size):
        sd = np.sqrt(n[k] - n[k - 1])
        weights = dens * np.gradient(grid)  # trapezoid-like mass of each grid point

        def crossing(c: float, weights=weights, grid=grid, sd=sd, k=k) -> float:
            edge = c * np.sqrt(n[k])
            inside = sps.norm.cdf((edge - grid) / sd) - sps.norm.cdf((-edge - grid) / sd)
            return float(np.sum(weights * (1.0 - inside)))

        target = increments[k]
        bounds[k] = optimize.brentq(lambda c, target=target: crossing(c) - target, 0.1, 40.0, xtol=1e-10)
        new_grid = np.linspace(-1.0, 1.0, GRID) * bounds[k] * np.sqrt(n[k])
        dens = (sps.norm.pdf((new_grid[:, None] - grid[None, :]) / sd) / sd) @ weights
        grid = new_grid
    return bounds


CALIBRATION_PATHS = 400_000  # simulated no-effect campaigns the per-look t levels are calibrated on
CALIBRATION_SEED = 20_260_533  # fixed: the same looks and alpha give the same levels at every look and report


def z_levels(looks: Sequence[int], alpha: float = 0.05) -> np.ndarray:
    """Two-sided nominal level of each look for a z test (shape (K,)): 2 (1 - Phi(c_k))."""
    return 2.0 * sps.norm.sf(z_boundaries(looks, alpha))


@functools.lru_cache(maxsize=64)
def _t_levels(looks: tuple[int, ...], alpha: float) -> tuple[float, ...]:
    n = np.asarray(looks)
    spend = np.diff(obrien_fleming_spending(n / n[-1], alpha), prepend=0.0)
    rng = np.random.default_rng(CALIBRATION_SEED)
    total = np.zeros(CALIBRATION_PATHS)
    squares = np.zeros(CALIBRATION_PATHS)
    crossed = np.zeros(CALIBRATION_PATHS, dtype=bool)
    levels, before = [], 0
    for k, size in enumerate(looks):
        x = rng.standard_normal((CALIBRATION_PATHS, size - before))
        total += x.sum(axis=1)
        squares += (x * x).sum(axis=1)
        before = size
        var = np.maximum(squares - total**2 / size, 0.0) / (size - 1)
        t = np.abs(total / size) / np.sqrt(var / size)
        # P(continue to look k, p_k < l) = l - P(stopped before k, p_k < l): the first term is exact (p_k is
        # uniform), only the overlap with earlier stops is simulated; its least fixed point is the level
        overlap = np.sort(2.0 * sps.t.sf(t[crossed], size - 1))
        candidates = spend[k] + np.arange(overlap.size + 1) / CALIBRATION_PATHS
        # the least j with count(overlap < spend + j/M) <= j: the least fixed point of that monotone map
        j = int(np.argmax(np.searchsorted(overlap, candidates, side="left") <= np.arange(overlap.size + 1)))
        level = float(candidates[j])
        levels.append(float(level))
        crossed |= t > sps.t.isf(level / 2.0, size - 1)
    return tuple(levels)


def nominal_alphas(looks: Sequence[int], alpha: float = 0.05) -> np.ndarray:
    """Two-sided level of each look's paired t-test (shape (K,)), calibrated for the t reference: look k's
    level l_k makes P(no stop before look k, p_k < l_k) equal the O'Brien-Fleming-type spend
    alpha(t_k) - alpha(t_{k-1}) for paired differences that are normal with no effect (the t statistics' joint
    law does not depend on their sd). The exact marginal P(p_k < l) = l carries the bulk; the overlap with
    earlier stops comes from `CALIBRATION_PATHS` simulated campaigns with a fixed seed (deterministic, cached).
    The z levels (`z_levels`) applied to t statistics at 3-5 pairs claim 5.66% at alpha 0.05."""
    n = np.asarray(looks, dtype=float)
    if n.ndim != 1 or n.size == 0 or np.any(np.diff(n) <= 0) or n[0] < 2 or np.any(n != np.round(n)):
        raise ValueError(f"looks must be increasing whole numbers of pairs >= 2, got {list(looks)}")
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must lie in (0, 1), got {alpha}")
    return np.array(_t_levels(tuple(int(x) for x in n), float(alpha)))


def look_test(base: Sequence[float], other: Sequence[float], level: float) -> dict:
    """One look of the adaptive stop on paired per-seed values (NaN: the seed's run has no value): pairs, delta
    (mean other - base), the repeated confidence interval lo, hi (the paired t interval at confidence
    1 - level), p, level, and claimed (p < level, i.e. the interval excludes zero; zero variance never claims).
    The stop (orchestrator/tune/adaptive.py) and the report's primary result both decide with this."""
    from orchestrator.stats.paired import paired_comparison

    c = paired_comparison(base, other, confidence=1.0 - level, bootstrap=False)
    claimed = c.excludes_zero and np.isfinite(c.p_value)
    return {"pairs": c.n, "delta": c.delta, "lo": c.ci_low, "hi": c.ci_high, "p": c.p_value, "level": level,
            "claimed": bool(claimed)}


def look_decision(result: dict, last: bool) -> str:
    """What a look decides: claim, stop at max (the last look without a claim), or add seeds."""
    return "claim" if result["claimed"] else ("stop at max" if last else "add seeds")


def sequential_paired_t(diffs: np.ndarray, looks: Sequence[int], alpha: float = 0.05) -> tuple[np.ndarray,
                                                                                                 np.ndarray]:
    """The adaptive-seeds procedure on many campaigns at once (the simulation's vectorised twin of
    orchestrator/tune/adaptive.py, which decides each look with `look_test`).

    diffs: (campaigns, n_max) paired differences in the order seeds are added; looks: pairs at each look (the
    last <= n_max). Returns (claimed (campaigns,) bool, pairs used when stopped (campaigns,) int): stop at the
    first look whose two-sided paired t p-value is below that look's nominal alpha, else at the last look.
    """
    d = np.asarray(diffs, dtype=float)
    levels = nominal_alphas(looks, alpha)
    claimed = np.zeros(d.shape[0], dtype=bool)
    used = np.full(d.shape[0], looks[-1], dtype=int)
    for n, level in zip(looks, levels, strict=True):
        p = sps.ttest_1samp(d[:, :n], 0.0, axis=1).pvalue
        hit = ~claimed & (used == looks[-1]) & (p < level)
        if n != looks[-1]:
            used[hit] = n
        claimed |= hit
    return claimed, used
