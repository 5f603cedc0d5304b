"""Report figures. Each function takes plain arrays / dicts and a path, writes one PNG and returns the path.

Figures are drawn on a bare `matplotlib.figure.Figure` with the Agg canvas, so no pyplot state or global
backend switch is involved (safe inside Ray workers, notebooks and threads).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from orchestrator.stats.paired import MIN_SEEDS, clip_interval, metric_bounds, t_interval

Curve = tuple[Sequence[float] | np.ndarray, Sequence[float] | np.ndarray]  # (steps, values) of one run

EXEC_COLOR, PLAN_COLOR = "tab:blue", "tab:orange"


def new_figure(width: float, height: float, ncols: int = 1) -> tuple[Figure, list]:
    fig = Figure(figsize=(width, height), dpi=110, layout="constrained")
    FigureCanvasAgg(fig)
    axes = [fig.add_subplot(1, ncols, i + 1) for i in range(ncols)]
    return fig, axes


def save(fig: Figure, path: Path | str) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png")
    return path


def mean_band(runs: Sequence[Curve], confidence: float = 0.95, *, bounds: tuple[float, float] | None = None,
              min_n: int = MIN_SEEDS) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per step across runs: `(steps, mean, ci_low, ci_high, n)`. The band is the t interval of the mean
    across runs (seeds) present at that step, clipped to `bounds` (a rate's band stays in [0, 1]); NaN where
    fewer than `min_n` runs have the step (no interval is claimed from fewer seeds)."""
    by_step: dict[float, list[float]] = {}
    for steps, values in runs:
        for s, v in zip(np.asarray(steps, float), np.asarray(values, float), strict=True):
            if math.isfinite(v):
                by_step.setdefault(float(s), []).append(float(v))
    steps = np.array(sorted(by_step), dtype=float)
    mean = np.full(steps.size, math.nan)
    lo, hi, n = mean.copy(), mean.copy(), np.zeros(steps.size, dtype=int)
    for i, s in enumerate(steps):
        v = np.asarray(by_step[s])
        n[i], mean[i] = v.size, float(np.mean(v))
        if v.size >= max(2, min_n):
            lo[i], hi[i] = clip_interval(*t_interval(v, confidence=confidence), bounds)
    return steps, mean, lo, hi, n


FAINT_BELOW = 5  # groups with fewer seeds also show each seed's curve


def learning_curves(curves: Mapping[str, Sequence[Curve]], path: Path | str, *, metric: str = "metric",
                    title: str | None = None, confidence: float = 0.95,
                    bounds: tuple[float, float] | None | str = "auto") -> Path:
    """One line per group (mean across its runs at each step) with a `confidence` t band across seeds (from
    `MIN_SEEDS` seeds on). A group with fewer than `FAINT_BELOW` seeds also draws each seed's curve faintly.
    `bounds`: the band's range; "auto" takes (0, 1) for a rate / pass@k / success metric (by its name).

    `curves` maps a group label to its runs, each run a `(steps, values)` pair."""
    if bounds == "auto":
        bounds = metric_bounds(metric)
    fig, (ax,) = new_figure(7.5, 4.5)
    for i, (label, runs) in enumerate(curves.items()):
        steps, mean, lo, hi, n = mean_band(runs, confidence, bounds=bounds)
        if steps.size == 0:
            continue
        color = f"C{i % 10}"
        if len(runs) < FAINT_BELOW:
            for run_steps, run_values in runs:
                ax.plot(run_steps, run_values, color=color, alpha=0.3, linewidth=0.7)
        ax.plot(steps, mean, color=color, marker="o" if steps.size < 3 else None, ms=3,
                label=f"{label} (n={int(n.max())})")
        ok = np.isfinite(lo)
        if ok.any():
            ax.fill_between(steps, np.where(ok, lo, mean), np.where(ok, hi, mean), color=color, alpha=0.18,
                            linewidth=0)
    ax.set_xlabel("step")
    ax.set_ylabel(metric)
    faint = any(len(r) < FAINT_BELOW for r in curves.values())
    ax.set_title(title or f"{metric}: mean across seeds, {confidence:.0%} t band (a group with >= {MIN_SEEDS} seeds)"
                 + ("; faint: single seeds" if faint else ""), fontsize=9)
    ax.grid(alpha=0.3)
    if ax.lines:
        ax.legend(fontsize=7, loc="best")
    return save(fig, path)


def auc_forest(intervals: Mapping[str, Mapping[str, tuple[float, float, float]]], path: Path | str, *,
               metric: str = "metric", title: str | None = None) -> Path:
    """Forest plot of normalized AUC: one panel per window, one row per group with `mean [low, high]`.

    `intervals` maps a window label (e.g. "steps 0-10") to `{group label: (mean, ci_low, ci_high)}`."""
    windows = list(intervals)
    fig, axes = new_figure(max(6.0, 4.2 * len(windows)), 1.2 + 0.45 * max(
        (len(v) for v in intervals.values()), default=1), ncols=max(1, len(windows)))
    for ax, window in zip(axes, windows, strict=False):
        rows = list(intervals[window].items())
        ypos = np.arange(len(rows))[::-1]
        for y, (i, (_, (mean, lo, hi))) in zip(ypos, enumerate(rows), strict=True):
            color = f"C{i % 10}"
            if math.isfinite(lo) and math.isfinite(hi):
                ax.hlines(y, lo, hi, color=color, linewidth=2)
            ax.plot([mean], [y], "o", color=color)
        ax.set_yticks(ypos, [label for label, _ in rows], fontsize=8)
        ax.set_title(window, fontsize=10)
        ax.set_xlabel(f"normalized AUC of {metric}")
        ax.grid(axis="x", alpha=0.3)
        if rows:
            ax.set_ylim(-0.7, len(rows) - 0.3)
    fig.suptitle(title or f"Normalized AUC per group\nmean and 95% t CI over seeds (a group with >= {MIN_SEEDS} seeds)", fontsize=10)
    return save(fig, path)


def sepa_lambda_curves(curves: Mapping[str, Sequence[Curve]], path: Path | str, *,
                       title: str | None = None) -> Path:
    """SEPA lambda per step for each group (mean across runs, min-max range shaded).

    `curves` maps a group label to its runs' `(steps, lambda)` pairs."""
    fig, (ax,) = new_figure(7.0, 4.0)
    for i, (label, runs) in enumerate(curves.items()):
        by_step: dict[float, list[float]] = {}
        for steps, values in runs:
            for s, v in zip(np.asarray(steps, float), np.asarray(values, float), strict=True):
                if math.isfinite(v):
                    by_step.setdefault(float(s), []).append(float(v))
        if not by_step:
            continue
        steps = np.array(sorted(by_step))
        vals = [np.asarray(by_step[s]) for s in steps]
        color = f"C{i % 10}"
        ax.plot(steps, [v.mean() for v in vals], color=color, label=label)
        ax.fill_between(steps, [v.min() for v in vals], [v.max() for v in vals], color=color, alpha=0.15,
                        linewidth=0)
    ax.set_xlabel("step")
    ax.set_ylabel("SEPA lambda")
    ax.set_ylim(bottom=0.0)
    ax.set_title(title or "SEPA lambda (mean across seeds, min-max shaded)")
    ax.grid(alpha=0.3)
    if ax.lines:
        ax.legend(fontsize=7, loc="best")
    return save(fig, path)


def _var(x: np.ndarray) -> float:
    return float(np.var(x)) if x.size else math.nan


def uncertainty_histograms(exec_before: np.ndarray, plan_before: np.ndarray, exec_after: np.ndarray,
                           plan_after: np.ndarray, path: Path | str, *, kind: str = "surprisal",
                           title: str | None = None, bins: int = 60) -> Path:
    """The paper's two-panel diagnostic: (a) per-token uncertainty before the token stages, (b) after;
    execution (blue) and planning (orange) tokens overlaid as density histograms on shared bins up to the
    pooled 99.5th percentile, with each class's count and variance (over all its tokens) in the legend."""
    arrays = [np.asarray(a, dtype=float).ravel() for a in (exec_before, plan_before, exec_after, plan_after)]
    arrays = [a[np.isfinite(a)] for a in arrays]
    pooled = np.concatenate(arrays) if any(a.size for a in arrays) else np.zeros(1)
    lo, hi = float(np.min(pooled)), float(np.quantile(pooled, 0.995))
    if not hi > lo:
        hi = lo + 1.0
    edges = np.linspace(lo, hi, bins + 1)
    fig, axes = new_figure(10.0, 3.8, ncols=2)
    panels = (("(a) before", arrays[0], arrays[1]), ("(b) after", arrays[2], arrays[3]))
    for ax, (name, ex, pl) in zip(axes, panels, strict=True):
        for data, color, label in ((ex, EXEC_COLOR, "execution"), (pl, PLAN_COLOR, "planning")):
            if data.size:
                ax.hist(data, bins=edges, density=True, alpha=0.55, color=color,
                        label=f"{label} (n={data.size}, var={_var(data):.3g})")
        ax.set_title(name)
        ax.set_xlabel(f"per-token {kind} (axis cut at the pooled 99.5th percentile)")
        ax.set_ylabel("density")
        if ax.patches:
            ax.legend(fontsize=7)
    fig.suptitle(title or f"{kind} before vs after the token stages", fontsize=10)
    return save(fig, path)
