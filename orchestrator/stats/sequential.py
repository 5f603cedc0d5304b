"""Group-sequential testing for adaptive seeds: alpha spending over repeated looks at a paired contrast.

A campaign with adaptive seeds looks at its contrast after `n_1 < n_2 < ... < n_K` seed pairs and stops at the
first look whose interval excludes zero. Looking K times at the nominal 5% would claim an effect far more often
than 5% when there is none; the Lan-DeMets alpha-spending approach spends the 5% over the looks instead, here
with the O'Brien-Fleming-type function alpha(t) = 2 - 2 Phi(z_{1-alpha/2} / sqrt(t)) of the information fraction
t = n_k / n_K (tiny spends early, nearly the whole alpha at the last look). Look k's two-sided z boundary c_k
solves P(|Z_1| < c_1, ..., |Z_{k-1}| < c_{k-1}, |Z_k| >= c_k) = alpha(t_k) - alpha(t_{k-1}) under no effect,
where Z_k = S_k / sqrt(n_k) and S is a sum of independent unit-variance increments (the canonical joint
distribution); the probabilities come from the recursive numerical integration of Armitage, McPherson and Rowe
(1969) on a grid. Each look then tests the paired t statistic at the nominal level 2 (1 - Phi(c_k)): at a
handful of pairs the t reference keeps each look's own rate exact, and the simulation in
tests/unit/tune/test_adaptive_seeds.py checks the whole procedure's false-claim rate.
"""

from __future__ import annotations

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


def nominal_alphas(looks: Sequence[int], alpha: float = 0.05) -> np.ndarray:
    """Two-sided nominal level of each look's test (shape (K,)): 2 (1 - Phi(c_k))."""
    return 2.0 * sps.norm.sf(z_boundaries(looks, alpha))


def sequential_paired_t(diffs: np.ndarray, looks: Sequence[int], alpha: float = 0.05) -> tuple[np.ndarray,
                                                                                                 np.ndarray]:
    """The adaptive-seeds procedure on many campaigns at once (the simulation's vectorised twin of
    orchestrator/tune/adaptive.py, which decides each look with `report.stats.paired_comparison`).

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
