"""The report's sweep section (seed 004's Figure 3): the metric's final value and its learning-curve AUC against
the swept value, with CIs over seeds, a paired trend test over the swept values and paired deltas against the
first value.

Seeds are shared across swept values (the same seed at every value), so the analysis is paired: per seed, the
least-squares slope of the measure over the swept values (`numpy.polyfit`; x is the value where every value is
a number, else its position in the sweep list), and a one-sample t-test of the slopes (`scipy.stats.ttest_1samp`)
is the trend test; per swept value, `stats.paired_comparison` against the first value. "Final" is the value at
one common step, the report's step k (`tables.choose_step`: the latest step every started trial reached), and
the AUC runs from the metric's first logged step to k, so every run is measured at the same point.

Panels for the figure: with several conditions the x axis is the condition and each sweep point a line; with one
condition every sweep key is its own panel (numeric axis where its values are numbers) and the other keys are
the lines. Trend and per-value tests run for every condition, swept key (with two or more values) and
combination of the other keys.

One primary test per report: in a campaign with a sweep it is one trend (`PrimaryTrend`): the trend of the
report's primary measure (`report.primary`) over the swept values of one condition, key and series
(`report.primary_sweep`, default the first in campaign order), tested at 5% and the only row with a `*`.
Every other trend and every per-value delta is exploratory: p and p (Holm) shown (Holm over the trend tests of
one measure, or over the per-value deltas of one series and measure), never a `*`. (A `*` per family put one in
16% of no-effect sweep reports.)
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from scipy import stats as sps

from orchestrator.report.claims.comparisons import family_marks
from orchestrator.report.claims.primary import PrimaryTrend, sweep_series
from orchestrator.report.load import Group, fmt_value
from orchestrator.stats import paired as stats

COLUMNS = ["panel", "x", "x_value", "series", "n_seeds", "step", "final_mean", "final_ci_low", "final_ci_high",
           "auc_mean", "auc_ci_low", "auc_ci_high"]
TREND_COLUMNS = ["condition", "key", "series", "measure", "role", "x_kind", "values", "n_seeds", "seeds",
                 "slope_mean", "ci_low", "ci_high", "p_value", "p_holm", "mark", "note"]
DELTA_COLUMNS = ["condition", "key", "series", "measure", "role", "x", "against", "n_pairs", "delta", "ci_low",
                 "ci_high", "p_value", "p_holm", "mark", "note"]
AGENTIC = ("frozen_lake", "sokoban")
ALPHA = 0.05


def applies(groups: Sequence[Group]) -> bool:
    runs = [r for g in groups for r in g.runs]
    return len(groups) > 1 and (any(g.sweep for g in groups) or any(
        (r.config.get("task") or {}).get("name") in AGENTIC for r in runs))


def _is_number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def _points(groups: Sequence[Group]) -> list[tuple[str, Any, str, Group]]:
    """(panel, x value, series, group) for every group."""
    conditions = list(dict.fromkeys(g.condition for g in groups))
    out = []
    for g in groups:
        if len(conditions) > 1:
            series = ", ".join(f"{k}={fmt_value(v)}" for k, v in g.sweep.items()) or "all"
            out.append(("condition", g.condition, series, g))
        else:
            for key, value in g.sweep.items():
                others = ", ".join(f"{k}={fmt_value(v)}" for k, v in g.sweep.items() if k != key) or "all"
                out.append((key, value, others, g))
    return out


def run_measures(group: Group, metric: str, step: int | None, interpolate: bool = False) -> dict[str, dict]:
    """{"final": {seed: value at `step`}, "auc": {seed: normalised AUC from the first logged step to `step`}};
    runs without a value there are left out (the AUC's reasons are the main AUC table's)."""
    final, auc = {}, {}
    if step is None:
        return {"final": final, "auc": auc}
    for r in group.runs:
        s, v = r.series(metric)
        if not s.size:
            continue
        x = r.value_at(metric, step)
        if math.isfinite(x):
            final[r.seed] = x
        grid = r.planned_steps(metric)
        lo = int(grid[0]) if grid is not None and grid.size else int(s[0])
        if step > lo:
            a, _ = stats.window_auc(s, v, (lo, step), grid=grid, interpolate=interpolate)
            if math.isfinite(a):
                auc[r.seed] = a
    return {"final": final, "auc": auc}


def sweep_table(groups: Sequence[Group], metric: str, step: int | None, interpolate: bool = False) -> pd.DataFrame:
    bounds = stats.metric_bounds(metric)
    rows = []
    for panel, x, series, g in _points(groups):
        m = run_measures(g, metric, step, interpolate)
        finals, aucs = list(m["final"].values()), list(m["auc"].values())
        f_lo, f_hi = stats.group_ci(finals, bounds=bounds)
        a_lo, a_hi = stats.group_ci(aucs, bounds=bounds)
        rows.append({"panel": panel, "x": fmt_value(x), "x_value": float(x) if _is_number(x) else math.nan,
                     "series": series, "n_seeds": len(finals), "step": step,
                     "final_mean": float(np.mean(finals)) if finals else math.nan, "final_ci_low": f_lo,
                     "final_ci_high": f_hi, "auc_mean": float(np.mean(aucs)) if aucs else math.nan,
                     "auc_ci_low": a_lo, "auc_ci_high": a_hi})
    return pd.DataFrame(rows, columns=COLUMNS)


def _trend(xs: np.ndarray, per_value: list[dict[int, float]]) -> dict:
    """Per-seed least-squares slope over the swept values (seeds present at every value), t-tested."""
    seeds = sorted(set.intersection(*(set(v) for v in per_value)))
    row = {"n_seeds": len(seeds), "seeds": " ".join(map(str, seeds)), "slope_mean": math.nan, "ci_low": math.nan,
           "ci_high": math.nan, "p_value": math.nan, "note": ""}
    if not seeds:
        row["note"] = "no seed has every swept value"
        return row
    y = np.array([[v[s] for s in seeds] for v in per_value])  # [values, seeds]
    slopes = np.polyfit(xs, y, 1)[0]
    row["slope_mean"] = float(np.mean(slopes))
    if len(seeds) < stats.MIN_PAIRS:
        row["note"] = f"too few seeds ({len(seeds)}; {stats.MIN_PAIRS} needed for a test)"
    elif stats.is_constant(slopes):
        row["note"] = "zero variance: every seed has the same slope; no test"
    else:
        res = sps.ttest_1samp(slopes, 0.0)
        ci = res.confidence_interval(0.95)
        row.update(ci_low=float(ci.low), ci_high=float(ci.high), p_value=float(res.pvalue))
    return row


def _holm_in(df: pd.DataFrame, by: list[str]) -> pd.DataFrame:
    """p (Holm) within each family of exploratory rows (never a `*`); the primary row: its own p, and `*` when
    p < ALPHA (one test, the report's one claim)."""
    df = df.copy()
    df["p_holm"], df["mark"] = math.nan, ""
    zero = df["note"].str.startswith("zero variance").to_numpy(bool)
    df["_zero"] = zero
    explore = df[df["role"] != "primary"]
    for _, part in explore.groupby(by, sort=False):
        idx = part.index
        adj, _ = family_marks(df.loc[idx, "p_value"].to_numpy(float), df.loc[idx, "_zero"].to_numpy(bool), ALPHA)
        df.loc[idx, "p_holm"] = adj
    main = (df["role"] == "primary").to_numpy(bool)
    df.loc[main, "p_holm"] = df.loc[main, "p_value"]
    df.loc[main & (np.nan_to_num(df["p_value"].to_numpy(float), nan=1.0) < ALPHA) & ~zero, "mark"] = "*"
    return df.drop(columns="_zero")


def trend_tables(groups: Sequence[Group], metric: str, step: int | None, interpolate: bool = False,
                 primary: PrimaryTrend | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(trend tests, per-value paired deltas against the first value) for every sweep series and measure: the
    final value and the AUC to step k (named as the primary measure where it is that), and the primary measure
    where it is neither. `primary`'s row is the
    one with role "primary"; every other row is exploratory."""
    trend_rows, delta_rows = [], []
    bounds = stats.delta_bounds(metric)
    series = sweep_series(groups)
    measured = {g.label: run_measures(g, metric, step, interpolate) for *_, pts in series for _, g in pts}
    auc_label = f"AUC to step {step}"
    extra = primary is not None and primary.values is not None
    if extra and all(_same(m["auc"], primary.values.get(label, {})) for label, m in measured.items()):
        auc_label, extra = primary.measure, False  # the AUC to step k is the primary measure: one row, its name
    for cond, key, others, pts in series:
        values = [v for v, _ in pts]
        numeric = all(_is_number(v) for v in values)
        xs = np.array([float(v) for v in values] if numeric else range(len(values)), dtype=float)
        measures = [measured[g.label] for _, g in pts]
        kinds = [(f"final (step {step})", [m["final"] for m in measures]),
                 (auc_label, [m["auc"] for m in measures])]
        if extra:
            kinds.append((primary.measure, [primary.values.get(g.label, {}) for _, g in pts]))
        for label, per_value in kinds:
            role = "primary" if primary is not None and (cond, key, others, label) == (
                primary.condition, primary.key, primary.series, primary.measure) else "exploratory"
            trend_rows.append({"condition": cond, "key": key, "series": others, "measure": label, "role": role,
                               "x_kind": "value" if numeric else "position in the sweep list",
                               "values": ", ".join(fmt_value(v) for v in values), **_trend(xs, per_value)})
            first = per_value[0]
            for v, other in zip(values[1:], per_value[1:], strict=True):
                seeds = sorted(set(first) & set(other))
                c = stats.paired_comparison([first[s] for s in seeds], [other[s] for s in seeds], bounds=bounds,
                                            bootstrap=False)
                delta_rows.append({"condition": cond, "key": key, "series": others, "measure": label,
                                   "role": "exploratory", "x": fmt_value(v), "against": fmt_value(values[0]),
                                   "n_pairs": c.n, "delta": c.delta, "ci_low": c.ci_low, "ci_high": c.ci_high,
                                   "p_value": c.p_value, "note": c.note})
    trend = pd.DataFrame(trend_rows, columns=[c for c in TREND_COLUMNS if c not in ("p_holm", "mark")])
    deltas = pd.DataFrame(delta_rows, columns=[c for c in DELTA_COLUMNS if c not in ("p_holm", "mark")])
    trend = _holm_in(trend, ["measure"]) if len(trend) else pd.DataFrame(columns=TREND_COLUMNS)
    deltas = (_holm_in(deltas, ["condition", "key", "series", "measure"]) if len(deltas)
              else pd.DataFrame(columns=DELTA_COLUMNS))
    return trend[TREND_COLUMNS], deltas[DELTA_COLUMNS]


def _same(a: dict[int, float], b: dict[int, float]) -> bool:
    """The same seeds with the same values (to rounding)."""
    return a.keys() == b.keys() and all(math.isclose(a[k], b[k], rel_tol=1e-12, abs_tol=1e-15) for k in a)


def _ci(lo: float, hi: float, fmt: str = "{:.3f}") -> str:
    return "n/a" if not math.isfinite(lo) else f"[{fmt.format(lo)}, {fmt.format(hi)}]"


def markdown(table: pd.DataFrame, trend: pd.DataFrame, deltas: pd.DataFrame, metric: str) -> list[str]:
    if table.empty:
        return []
    step = table.step.iloc[0]
    lines = ["", "## Sweeps: final value and AUC against the swept value", "",
             f"`{metric}` per swept value: its value at step {step} (the step every started trial reached) and the "
             f"normalised AUC from the first logged step to step {step}, mean over seeds with a 95% t interval "
             f"(clipped to the metric's range; none below {stats.MIN_SEEDS} seeds).", ""]
    for panel, part in table.groupby("panel", sort=False):
        lines += [f"**{panel}**", "", "| x | series | seeds | final | final 95% CI | AUC | AUC 95% CI |",
                  "|---|---|---|---|---|---|---|"]
        for _, r in part.iterrows():
            def ci(lo, hi):
                return "too few seeds" if not math.isfinite(lo) else f"[{lo:.3f}, {hi:.3f}]"

            lines.append(f"| {r.x} | {r.series} | {r.n_seeds} | {r.final_mean:.3f} | "
                         f"{ci(r.final_ci_low, r.final_ci_high)} | {r.auc_mean:.3f} | {ci(r.auc_ci_low, r.auc_ci_high)} |")
        lines.append("")
    if len(trend):
        lines += ["**Trend over the swept values** (paired by seed: per seed the least-squares slope of the measure "
                  "over the values, or over their positions where they are not numbers; one-sample t-test of the "
                  f"slopes). Role primary: the report's one primary test, `*` where p < {ALPHA}; every other row is "
                  "exploratory: p, and p (Holm) over the exploratory trend tests of the same measure, never a `*`.",
                  "", "| condition | key | series | measure | role | x | seeds | mean slope | 95% CI | p | p (Holm) | * |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for _, r in trend.iterrows():
            slope = "n/a" if not math.isfinite(r.slope_mean) else f"{r.slope_mean:+.4g}"
            lines.append(f"| {r.condition} | {r.key} | {r.series} | {r.measure} | {r.role} | {r.x_kind} | "
                         f"{r.n_seeds} | {slope} | {_ci(r.ci_low, r.ci_high, '{:+.4g}') if not r.note else r.note} | "
                         f"{_p(r.p_value)} | {_p(r.p_holm)} | {r.mark} |")
        lines.append("")
    if len(deltas):
        lines += ["**Per value against the first value** (paired by seed; exploratory: p, and p (Holm) within the "
                  "series and measure, never a `*`).", "",
                  "| condition | key | series | measure | value - first | pairs | delta | 95% CI | p | p (Holm) |",
                  "|---|---|---|---|---|---|---|---|---|---|"]
        for _, r in deltas.iterrows():
            ci = r.note or _ci(r.ci_low, r.ci_high, "{:+.4g}")
            delta = "n/a" if not math.isfinite(r.delta) else f"{r.delta:+.4g}"
            lines.append(f"| {r.condition} | {r.key} | {r.series} | {r.measure} | {r.x} - {r.against} | {r.n_pairs} | "
                         f"{delta} | {ci} | {_p(r.p_value)} | {_p(r.p_holm)} |")
        lines.append("")
    return lines


def _p(p: float) -> str:
    return "n/a" if not math.isfinite(p) else (f"{p:.3f}" if p >= 0.001 else f"{p:.1e}")


def figure(table: pd.DataFrame, path: Path | str, metric: str) -> Path | None:
    """One row per panel, two columns (final, AUC); x numeric where the panel's values are numbers, else
    categorical in campaign order; one line per series."""
    from orchestrator.report.render.figures import new_figure, save

    if table.empty:
        return None
    panels = list(dict.fromkeys(table.panel))
    fig, _ = new_figure(10.0, 3.4 * len(panels), ncols=0)
    axes = fig.subplots(len(panels), 2, squeeze=False)
    step = table.step.iloc[0]
    for row, panel in enumerate(panels):
        part = table[table.panel == panel]
        numeric = bool(np.isfinite(part.x_value.to_numpy(float)).all())
        xs = list(dict.fromkeys(part.x))
        for col, (what, label) in enumerate((("final", f"step {step}"), ("auc", f"AUC to step {step}"))):
            ax = axes[row][col]
            for series, s in part.groupby("series", sort=False):
                pos = s.x_value.to_numpy(float) if numeric else np.array([xs.index(x) for x in s.x], dtype=float)
                mean = s[f"{what}_mean"].to_numpy(float)
                lo, hi = s[f"{what}_ci_low"].to_numpy(float), s[f"{what}_ci_high"].to_numpy(float)
                err = np.where(np.isfinite(lo), [mean - lo, hi - mean], 0.0)
                ax.errorbar(pos, mean, yerr=err, marker="o", capsize=3, label=series)
            if not numeric:
                ax.set_xticks(range(len(xs)), xs, rotation=30)
            elif (pos_x := part.x_value[part.x_value > 0]).size and pos_x.max() >= 100 * pos_x.min():
                ax.set_xscale("symlog", linthresh=float(pos_x.min()))  # values over decades (0, 1e-3, 1e-2, ...)
            ax.set_xlabel(panel)
            ax.set_ylabel(f"{metric} ({label})")
            if stats.metric_bounds(metric):
                ax.set_ylim(-0.02, 1.02)
            ax.grid(alpha=0.3)
        axes[row][0].legend(fontsize=8)
    return save(fig, path)
