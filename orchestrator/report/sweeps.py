"""The report's sweep panels (seed 004's Figure 3): the metric's final value and its learning-curve AUC, with CIs
over seeds, against the swept value.

Axes: with several conditions the x axis is the condition (e.g. the RV-filter top-p values written as conditions
`nofilter`, `rv1.0`, ... because each also sets include_zero) and each sweep point is a line (FrozenLake's
success_rate); with one condition every sweep key is its own panel (the entropy or KL coefficient) and the other
keys are the lines. The section appears for campaigns with a sweep or an agentic task.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from orchestrator.report import stats
from orchestrator.report.load import _fmt_value, _Group

COLUMNS = ["panel", "x", "series", "n_seeds", "final_mean", "final_ci_low", "final_ci_high", "auc_mean",
           "auc_ci_low", "auc_ci_high"]
AGENTIC = ("frozen_lake", "sokoban")


def applies(groups: Sequence[_Group]) -> bool:
    runs = [r for g in groups for r in g.runs]
    return len(groups) > 1 and (any(g.sweep for g in groups) or any(
        (r.config.get("task") or {}).get("name") in AGENTIC for r in runs))


def _points(groups: Sequence[_Group]) -> list[tuple[str, str, str, _Group]]:
    """(panel, x, series, group) for every group."""
    conditions = list(dict.fromkeys(g.condition for g in groups))
    out = []
    for g in groups:
        if len(conditions) > 1:
            series = ", ".join(f"{k}={_fmt_value(v)}" for k, v in g.sweep.items()) or "all"
            out.append(("condition", g.condition, series, g))
        else:
            for key, value in g.sweep.items():
                others = ", ".join(f"{k}={_fmt_value(v)}" for k, v in g.sweep.items() if k != key) or "all"
                out.append((key, _fmt_value(value), others, g))
    return out


def _run_values(group: _Group, metric: str) -> tuple[list[float], list[float]]:
    """Per seed: the metric's last logged value, and its normalised AUC over the steps the run logged it."""
    finals, aucs = [], []
    for r in group.runs:
        steps, values = r.series(metric)
        if not steps.size:
            continue
        finals.append(float(values[-1]))
        aucs.append(stats.normalized_auc(steps, values, (int(steps[0]), int(steps[-1])))
                    if steps[-1] > steps[0] else float(values[0]))
    return finals, aucs


def sweep_table(groups: Sequence[_Group], metric: str) -> pd.DataFrame:
    bounds = stats.metric_bounds(metric)
    rows = []
    for panel, x, series, g in _points(groups):
        finals, aucs = _run_values(g, metric)
        f_lo, f_hi = stats.group_ci(finals, bounds=bounds)
        a_lo, a_hi = stats.group_ci(aucs, bounds=bounds)
        rows.append({"panel": panel, "x": x, "series": series, "n_seeds": len(finals),
                     "final_mean": float(np.mean(finals)) if finals else math.nan, "final_ci_low": f_lo,
                     "final_ci_high": f_hi, "auc_mean": float(np.nanmean(aucs)) if aucs else math.nan,
                     "auc_ci_low": a_lo, "auc_ci_high": a_hi})
    return pd.DataFrame(rows, columns=COLUMNS)


def markdown(table: pd.DataFrame, metric: str) -> list[str]:
    if table.empty:
        return []
    lines = ["", "## Sweeps: final value and AUC against the swept value", "",
             f"`{metric}` per swept value: the last logged value and the normalised AUC over the run, mean over "
             f"seeds with a 95% t interval (clipped to the metric's range; none below {stats.MIN_SEEDS} seeds).", ""]
    for panel, part in table.groupby("panel", sort=False):
        lines += [f"**{panel}**", "", "| x | series | seeds | final | final 95% CI | AUC | AUC 95% CI |",
                  "|---|---|---|---|---|---|---|"]
        for _, r in part.iterrows():
            def ci(lo, hi):
                return "too few seeds" if not math.isfinite(lo) else f"[{lo:.3f}, {hi:.3f}]"

            lines.append(f"| {r.x} | {r.series} | {r.n_seeds} | {r.final_mean:.3f} | "
                         f"{ci(r.final_ci_low, r.final_ci_high)} | {r.auc_mean:.3f} | {ci(r.auc_ci_low, r.auc_ci_high)} |")
        lines.append("")
    return lines


def figure(table: pd.DataFrame, path: Path | str, metric: str) -> Path | None:
    """One row per panel, two columns (final, AUC); x categorical in campaign order, one line per series."""
    if table.empty:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = list(dict.fromkeys(table.panel))
    fig, axes = plt.subplots(len(panels), 2, figsize=(10, 3.4 * len(panels)), squeeze=False)
    for row, panel in enumerate(panels):
        part = table[table.panel == panel]
        xs = list(dict.fromkeys(part.x))
        for col, (what, label) in enumerate((("final", "final"), ("auc", "AUC over the run"))):
            ax = axes[row][col]
            for series, s in part.groupby("series", sort=False):
                pos = [xs.index(x) for x in s.x]
                mean = s[f"{what}_mean"].to_numpy()
                lo, hi = s[f"{what}_ci_low"].to_numpy(), s[f"{what}_ci_high"].to_numpy()
                err = np.where(np.isfinite(lo), [mean - lo, hi - mean], 0.0)
                ax.errorbar(pos, mean, yerr=err, marker="o", capsize=3, label=series)
            ax.set_xticks(range(len(xs)), xs, rotation=30)
            ax.set_xlabel(panel)
            ax.set_ylabel(f"{metric} ({label})")
            if stats.metric_bounds(metric):
                ax.set_ylim(-0.02, 1.02)
            ax.grid(alpha=0.3)
        axes[row][0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return Path(path)
