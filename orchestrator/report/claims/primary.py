"""The report's primary result: which measure's family carries the `*` (`report.primary`); in a campaign with a
sweep, which trend over the swept values is the one primary test (`report.primary_sweep`, `PrimaryTrend`; tested
in orchestrator/report/sections/sweeps.py); and after adaptive seeds the sequential stop's own decision on its
contrast, recomputed from the data the way the stop computed it.

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
from typing import Any

import numpy as np

from orchestrator.campaign.sections import CONTRAST, DEFAULT_PRIMARY, MEASURE, AdaptiveSeeds, run_measure
from orchestrator.report.load import Group, fmt_value
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
        return measure_label(DEFAULT_PRIMARY, k), f"the default, {DEFAULT_PRIMARY}; set report.primary to change it"
    if reached:
        lo, hi = max(reached, key=lambda x: (x[1] - x[0], -x[0]))
        return f"AUC {lo}-{hi}", (f"the default {DEFAULT_PRIMARY} is reached by no run, so the widest AUC window "
                                  "is; set report.primary to choose")
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


def sweep_series(groups: Sequence[Group]) -> list[tuple[str, str, str, list[tuple[Any, Group]]]]:
    """(condition, key, other keys' values, [(value, group)] in sweep order) for every condition, swept key
    with at least two values, and combination of the other keys."""
    out = []
    for cond in dict.fromkeys(g.condition for g in groups):
        mine = [g for g in groups if g.condition == cond and g.sweep]
        for key in dict.fromkeys(k for g in mine for k in g.sweep):
            lines: dict[str, list[tuple[Any, Group]]] = {}
            for g in mine:
                others = ", ".join(f"{k}={fmt_value(v)}" for k, v in g.sweep.items() if k != key) or "all"
                lines.setdefault(others, []).append((g.sweep.get(key), g))
            out += [(cond, key, others, pts) for others, pts in lines.items() if len(pts) >= 2]
    return out


@dataclass(frozen=True)
class PrimaryTrend:
    """A sweep campaign's one primary test: the trend of `measure` (the report's name of the primary measure) over
    `key`'s values in `condition`'s series `series`. values: {group label: {seed: value}} of that measure (None:
    it is the step-k value, the sweep's own "final"); why: where the choice came from."""

    condition: str
    key: str
    series: str
    measure: str
    values: dict[str, dict[int, float]] | None
    why: str

    def text(self) -> str:
        series = "" if self.series == "all" else f", series {self.series}"
        return f"the trend of **{self.measure}** over `{self.key}` in condition {self.condition}{series}"


def choose_primary_trend(groups: Sequence[Group], declared: Any, measure: str | None, step: int | None,
                         values: dict[str, dict[str, dict[int, float]]]) -> PrimaryTrend | None:
    """The primary trend of a campaign with a sweep (None: no sweep with two values, or no primary measure).
    `declared`: `report.primary_sweep` (condition / key / series, each optional: unset takes the first match in
    campaign order); `values`: {measure name: {group label: {seed: value}}} of the report's measures. Raises
    ValueError when the declaration matches no sweep series (listing them)."""
    series = sweep_series(groups)
    fields = {f: getattr(declared, f, None) if not isinstance(declared, dict) else declared.get(f)
              for f in ("condition", "key", "series")} if declared is not None else {}
    if not series or measure is None:
        if any(fields.values()):
            raise ValueError(f"report.primary_sweep: {_said(fields)}, but the campaign has no sweep of two or more "
                             "values (or no data yet)")
        return None
    pick = [t for t in series if all(v in (None, t[i]) for i, v in enumerate(fields.get(f) for f in
                                                                            ("condition", "key", "series")))]
    if not pick:
        raise ValueError(f"report.primary_sweep: {_said(fields)} matches no sweep; the campaign's: "
                         + "; ".join(f"condition {c}, key {k}, series {o}" for c, k, o, _ in series))
    cond, key, others, _ = pick[0]
    given = [f for f, v in fields.items() if v is not None]
    why = ("report.primary_sweep" if len(given) == 3 else
           ("report.primary_sweep (" + ", ".join(given) + "), the rest " if given else "the default: ")
           + "the first in campaign order (set report.primary_sweep to choose)") if len(series) > 1 or given else (
        "the campaign's one sweep")
    final = measure == f"step {step}"
    return PrimaryTrend(cond, key, others, f"final (step {step})" if final else measure,
                        None if final else values.get(measure, {}), why)


def _said(fields: dict) -> str:
    return ", ".join(f"{f} {v}" for f, v in fields.items() if v is not None) or "(none)"
