"""The report's primary result: which measure's family carries the `*` (`report.primary`), and after adaptive seeds
the sequential stop's own decision on its contrast, recomputed from the data the way the stop computed it.

One familywise 5% covers one family: the comparisons of the primary measure (Holm over them). Every other measure's
deltas are exploratory: their Holm-adjusted p is within their own measure and they never carry a `*`. After an
adaptive-seeds campaign the primary result is the stop's: the contrast on the stop's measure, tested at the last
look's calibrated level (orchestrator/stats/sequential.py), with that look's repeated confidence interval (the
t interval at confidence 1 - level); every table row is exploratory except that contrast's row on that measure,
whose `*` is the stop's claim.

The stop (orchestrator/tune/adaptive.py) and this recomputation share every step: a run's measure is
`campaign.sections.run_measure` (the AUC on the run's planned logging grid, a run missing an interior step dropped
unless `interpolate`, as in the report's AUC table; `final` the value at the run's last planned step) and the
look's test is `stats.sequential.look_test`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from orchestrator.campaign.sections import CONTRAST, DEFAULT_PRIMARY, MEASURE, AdaptiveSeeds, run_measure
from orchestrator.report.load import Group
from orchestrator.stats.sequential import look_decision, look_test, nominal_alphas


def window_of(measure: str) -> tuple[int, int] | None:
    """(LO, HI) of `auc_LO_HI`; None for `final`."""
    m = MEASURE.match(measure)
    return None if m is None or m.group(2) is None else (int(m.group(2)), int(m.group(3)))


def measure_label(measure: str, k: int | None) -> str:
    """The report's name of a measure: `auc_0_15` -> "AUC 0-15", `final` -> "step k"."""
    w = window_of(measure)
    return f"AUC {w[0]}-{w[1]}" if w else f"step {k}"


def choose_primary(requested: str | None, reached: Sequence[tuple[int, int]], k: int | None) -> tuple[str | None,
                                                                                                    str]:
    """(the report's name of the primary measure or None, why). `requested` (report.primary) is used as given;
    None: auc_0_15 when some run reaches it, else the widest AUC window reached, else the step-k measure."""
    if requested is not None:
        w = window_of(requested)
        if w is None:
            return (f"step {k}", "report.primary: final (the step-k table)") if k is not None else (
                None, "report.primary: final, but no trial has data")
        if tuple(w) in {tuple(x) for x in reached}:
            return measure_label(requested, k), f"report.primary: {requested}"
        return None, f"report.primary: {requested}, but no run reaches both ends of steps {w[0]}-{w[1]}"
    w = window_of(DEFAULT_PRIMARY)
    if w in [tuple(x) for x in reached]:
        return measure_label(DEFAULT_PRIMARY, k), f"the default ({DEFAULT_PRIMARY}; set report.primary to change it)"
    if reached:
        lo, hi = max(reached, key=lambda x: (x[1] - x[0], -x[0]))
        return f"AUC {lo}-{hi}", (f"the default {DEFAULT_PRIMARY} is reached by no run, so the widest AUC window "
                                  "(set report.primary to choose)")
    if k is not None:
        return f"step {k}", f"the default {DEFAULT_PRIMARY} is reached by no run and no AUC window is: the step-k measure"
    return None, "no trial has data"


def seed_values(groups: Sequence[Group], measure: str, metric: str, *,
                interpolate: bool = False) -> dict[str, dict[int, float]]:
    """{group label: {seed: value}} of `measure` on `metric` (`campaign.sections.run_measure`, the stop's own
    computation) for every started run with a value (NaN dropped)."""
    out: dict[str, dict[int, float]] = {}
    for g in groups:
        out[g.label] = {}
        for r in g.runs:
            s, v = r.series(metric)
            value = run_measure(s, v, measure, r.planned_steps(metric), interpolate=interpolate)
            if math.isfinite(value):
                out[g.label][r.seed] = value
    return out


def look_result(groups: Sequence[Group], cfg: AdaptiveSeeds, metric: str, seeds: int, level: float, *,
                interpolate: bool = False) -> dict:
    """The contrast's `sequential.look_test` over seeds 0 .. seeds-1, as the stop made it."""
    other, base = CONTRAST.match(cfg.contrast).groups()
    values = seed_values(groups, cfg.measure, metric, interpolate=interpolate)
    pick = {c: next((values[g.label] for g in groups if g.condition == c), {}) for c in (other, base)}
    return {"seeds": seeds, **look_test([pick[base].get(s, math.nan) for s in range(seeds)],
                                        [pick[other].get(s, math.nan) for s in range(seeds)], level)}


@dataclass(frozen=True)
class SequentialPrimary:
    """The adaptive campaign's primary result as the report recomputes it. looks / levels: the design;
    look: the last look logged (1-based; 0: none yet); logged: its events.jsonl line; result: `look_result` at
    that look recomputed from the data; decision: recomputed; agrees: the recomputed decision and interval are the
    logged ones."""

    cfg: AdaptiveSeeds
    metric: str
    looks: list[int]
    levels: list[float]
    look: int
    logged: dict | None
    result: dict | None
    decision: str
    agrees: bool


def sequential_primary(groups: Sequence[Group], cfg: AdaptiveSeeds, metric: str, events: Sequence[dict], *,
                       interpolate: bool = False) -> SequentialPrimary:
    """The stop's primary result from the campaign's `look` events and its data."""
    looks = cfg.looks()
    levels = [float(x) for x in nominal_alphas(looks, cfg.alpha)]
    logged = [e for e in events if e.get("event") == "look"]
    if not logged:
        return SequentialPrimary(cfg, metric, looks, levels, 0, None, None, "no look yet", True)
    last = logged[-1]
    k = int(last["look"])
    result = look_result(groups, cfg, metric, looks[k - 1], levels[k - 1], interpolate=interpolate)
    made = look_decision(result, k == len(looks))
    same = all(np.isclose(result[x], last.get(x, math.nan), rtol=1e-9, equal_nan=True)
               for x in ("delta", "lo", "hi", "p", "level"))
    return SequentialPrimary(cfg, metric, looks, levels, k, last, result, made,
                             made == last.get("decision") and same and result["seeds"] == last.get("seeds"))
