"""What the report compares, paired by seed: every group against the baseline, the campaign's contrasts
(`report: {contrasts: ["C4-C3"]}`), and for a factorial design (advantage x transform) the main effects.

Each comparison is a `Spec`: two weighted sums of groups, `other` and `base`; its per-seed value is
`sum_g w_g x_g(seed)` on each side over the seeds every group involved has, and the comparison is the paired
t-test of `other - base` (`stats.paired_comparison`). A main effect of a factor's level is the mean over the
other factor's levels of (cell at that level - cell at the reference level): one value per seed, so the seeds
stay paired.

`mark_families` applies Holm within each measure's family (every comparison of that measure) and sets the `*`
from the adjusted p-value in the primary measure's family only (orchestrator/report/claims/primary.py).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from orchestrator.report.load import Group
from orchestrator.stats import paired as stats

FACTORS = (("advantage", "advantage_mode"), ("transform", "transform_mode"))  # keys of the credit config


@dataclass(frozen=True)
class Spec:
    kind: str  # "vs baseline", "contrast", "main effect"
    label: str  # the `other` side as the table shows it
    base_label: str
    other: tuple[tuple[str, float], ...]  # (group label, weight)
    base: tuple[tuple[str, float], ...]

    def seeds(self, values: Mapping[str, Mapping[int, float]]) -> list[int]:
        """Seeds every group of both sides has a finite value for."""
        sets = [set(k for k, v in values.get(g, {}).items() if math.isfinite(v)) for g, _ in self.other + self.base]
        return sorted(set.intersection(*sets)) if sets else []

    def paired(self, values: Mapping[str, Mapping[int, float]]) -> tuple[list[int], np.ndarray, np.ndarray]:
        """(seeds, base per seed, other per seed)."""
        seeds = self.seeds(values)

        def side(terms):
            return np.array([sum(w * values[g][s] for g, w in terms) for s in seeds], dtype=float)

        return seeds, side(self.base), side(self.other)




def _key(g: Group) -> str:
    return g.sweep_text


def baseline_specs(groups: Sequence[Group], base: Group) -> list[Spec]:
    return [Spec("vs baseline", g.label, base.label, ((g.label, 1.0),), ((base.label, 1.0),))
            for g in groups if g is not base]


def contrast_specs(groups: Sequence[Group], pairs: Sequence[tuple[str, str]]) -> list[Spec]:
    """"A-B" at every sweep point where both conditions have a group."""
    out = []
    for a, b in pairs:
        for point in dict.fromkeys(_key(g) for g in groups):
            ga = next((g for g in groups if g.condition == a and _key(g) == point), None)
            gb = next((g for g in groups if g.condition == b and _key(g) == point), None)
            if ga is not None and gb is not None:
                label = f"{a}-{b}" + (f" [{point}]" if point else "")
                out.append(Spec("contrast", label, gb.label, ((ga.label, 1.0),), ((gb.label, 1.0),)))
    return out


def _level(g: Group, key: str) -> str | None:
    cfg = next((r.config for r in g.runs if r.config), {})
    v = (cfg.get("credit") or {}).get(key)
    return None if v is None else (v if isinstance(v, str) else json.dumps(v))


def factorial_specs(groups: Sequence[Group]) -> list[Spec]:
    """Main effects of advantage and transform at each sweep point whose conditions cross them: the levels of
    transform every advantage level has (e.g. the lean campaign's C1, C4, C5, C8: {grpo, maxrl} x {none,
    gtpo_sepa}; C3 has no MaxRL twin and is left out). Each non-reference level (the reference is the first in
    campaign order) against the reference, averaged over the other factor's levels. None when a cell holds two
    conditions or either factor has fewer than two levels."""
    out = []
    for point in dict.fromkeys(_key(g) for g in groups):
        cells: dict[tuple[str, str], Group] = {}
        for g in (g for g in groups if _key(g) == point):
            lv = tuple(_level(g, key) for _, key in FACTORS)
            if None in lv or lv in cells:
                cells = {}
                break
            cells[lv] = g
        advs = list(dict.fromkeys(a for a, _ in cells))
        trans = [t for t in dict.fromkeys(t for _, t in cells) if all((a, t) in cells for a in advs)]
        if len(advs) < 2 or len(trans) < 2:
            continue
        suffix = f" [{point}]" if point else ""
        for f, (name, _) in enumerate(FACTORS):
            levels, others = (advs, trans) if f == 0 else (trans, advs)

            def cell(level, o, f=f, cells=cells):
                return cells[(level, o) if f == 0 else (o, level)].label

            w = 1.0 / len(others)
            for level in levels[1:]:
                label = f"main effect {name}: {level} - {levels[0]} (mean over {', '.join(others)}){suffix}"
                out.append(Spec("main effect", label, f"{name}={levels[0]}",
                                tuple((cell(level, o), w) for o in others),
                                tuple((cell(levels[0], o), w) for o in others)))
    return out


def all_specs(groups: Sequence[Group], base: Group, contrasts: Sequence[tuple[str, str]] = ()) -> list[Spec]:
    """Baseline comparisons, then contrasts and main effects; a contrast that repeats a baseline comparison
    (the same two groups) is kept once."""
    specs = baseline_specs(groups, base)
    seen = {(s.other, s.base) for s in specs}
    for s in contrast_specs(groups, contrasts) + factorial_specs(groups):
        if (s.other, s.base) not in seen:
            seen.add((s.other, s.base))
            specs.append(s)
    return specs


def family_marks(p_values: np.ndarray, zero_variance: np.ndarray, alpha: float) -> tuple[np.ndarray, np.ndarray]:
    """`(p_holm, marked)` for families along the last axis: Holm over the family's tests, where a zero-variance
    comparison counts as untestable (p = 1) and gets no adjusted p; NaN p-values (too few pairs) are not tests.
    `marked`: adjusted p < alpha."""
    zero = np.asarray(zero_variance, dtype=bool)
    p = np.where(zero, 1.0, np.asarray(p_values, dtype=float))
    adj = np.where(zero, math.nan, stats.holm(p))
    return adj, np.nan_to_num(adj, nan=1.0) < alpha


def mark_families(deltas: pd.DataFrame, alpha: float, primary: str | None = None) -> pd.DataFrame:
    """`family_marks` within each measure's family (every comparison of that measure): adds `family`,
    `family_size` (tests counted by Holm), `role` ("primary" for the family of the measure `primary`, else
    "exploratory"), `p_holm` and `mark` ("*" or ""; only in the primary family: one familywise rate, one family)."""
    deltas = deltas.copy()
    deltas["family"] = deltas["measure"]
    deltas["p_holm"] = math.nan
    deltas["family_size"] = 0
    deltas["role"] = np.where(deltas["measure"] == primary, "primary", "exploratory")
    deltas["mark"] = ""
    for family, idx in deltas.groupby("family", sort=False).groups.items():
        part = deltas.loc[idx]
        zero = part["zero_variance"].to_numpy(bool)
        adj, marked = family_marks(part["p_value"].to_numpy(float), zero, alpha)
        deltas.loc[idx, "p_holm"] = adj
        deltas.loc[idx, "family_size"] = int((np.isfinite(part["p_value"].to_numpy(float)) | zero).sum())
        deltas.loc[idx, "mark"] = np.where(marked & (family == primary), "*", "")
    return deltas
