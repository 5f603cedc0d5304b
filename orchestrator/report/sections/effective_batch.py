"""The report's effective-batch section: did the conditions train on comparable amounts of signal?

Steps are equal across conditions, signal is not: without rollout.fill a condition trains on the groups whose
rewards are not all equal, so its batch shrinks (or grows) as it gets better at the task, and differently per
condition. Per group (condition + sweep values) the table gives, as the mean over seeds of each run's mean over
steps, the groups sampled, informative (rewards not all equal, finite), trained (`train/groups_kept`), the tokens
in the loss, the share of samples that hit the length limit and the refill rounds. A warning line names the
measures of what the learner saw (trained tokens, trained groups: without a refill and under
rollout.skip_uninformative these are the informative ones) whose group means differ by more than `MARGIN`
(relative to the largest): a confound the reader of the comparisons must know about. The figure plots informative
groups sampled and groups trained per step by group (mean over seeds).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from orchestrator.report.load import Group

# column -> metrics.jsonl key
KEYS = {"groups_sampled": "train/groups_sampled", "groups_informative": "train/groups_informative",
        "groups_trained": "train/groups_kept", "tokens_trained": "train/tokens_trained",
        "overlong_share": "train/overlong_share", "fill_rounds": "train/fill_rounds"}
COLUMNS = ["group", "condition", "n_seeds", *KEYS]
# what the learner saw; informative groups *sampled* may differ under a refill while the trained ones agree
WARNED = {"tokens_trained": "trained tokens", "groups_trained": "trained groups"}
MARGIN = 0.10  # relative spread of the group means beyond which the report warns
PANELS = {KEYS["groups_informative"]: "informative groups sampled", KEYS["groups_trained"]: "groups trained"}


def _run_means(g: Group, key: str) -> list[float]:
    return [float(v.mean()) for v in (r.series(key)[1] for r in g.runs if r.started) if v.size]


def table(groups: Sequence[Group]) -> pd.DataFrame:
    """One row per group with any effective-batch key: the mean over seeds of each run's mean over steps (NaN
    where no run logged the key)."""
    rows = []
    for g in groups:
        means = {col: _run_means(g, key) for col, key in KEYS.items()}
        if not any(means.values()):
            continue
        rows.append({"group": g.label, "condition": g.condition, "n_seeds": max(len(m) for m in means.values()),
                     **{col: float(np.mean(m)) if m else float("nan") for col, m in means.items()}})
    return pd.DataFrame(rows, columns=COLUMNS)


def spread(df: pd.DataFrame, col: str) -> float:
    """(max - min) / max of the groups' means in `col` (NaN with fewer than two groups or a max of 0)."""
    x = df[col].dropna().to_numpy(float) if len(df) else np.zeros(0)
    if x.size < 2 or x.max() <= 0:
        return float("nan")
    return float((x.max() - x.min()) / x.max())


def warning(df: pd.DataFrame, margin: float = MARGIN) -> str | None:
    """The warning line when the groups' trained tokens or informative groups differ by more than `margin`."""
    over = []
    for col, name in WARNED.items():
        s = spread(df, col)
        if s > margin:
            lo, hi = df.loc[df[col].idxmin()], df.loc[df[col].idxmax()]
            over.append(f"{name} differ by {s:.0%} ({lo.group} {lo[col]:.4g} vs {hi.group} {hi[col]:.4g} per step)")
    if not over:
        return None
    return ("**Warning: unequal effective batch.** " + "; ".join(over) + f" (more than {margin:.0%}): the "
            "conditions trained on different amounts of signal, which confounds their comparison at equal steps. "
            "`rollout.fill.groups` trains every condition on the same number of usable groups.")


def markdown(df: pd.DataFrame) -> list[str]:
    if not len(df):
        return []
    md = ["", "## Effective batch", "",
          "Per group, the mean over seeds of each run's mean per step: groups sampled, informative (rewards not "
          "all equal), trained, tokens in the loss, the share of samples cut at the length limit and the refill "
          "rounds (`rollout.fill`, `rollout.overlong`).", "",
          "| group | seeds | sampled | informative | trained | tokens trained | overlong share | fill rounds |",
          "|---|---|---|---|---|---|---|---|"]

    def f(x: float, fmt: str = "{:.2f}") -> str:
        return "n/a" if not np.isfinite(x) else fmt.format(x)

    for _, r in df.iterrows():
        md.append(f"| {r.group} | {r.n_seeds} | {f(r.groups_sampled)} | {f(r.groups_informative)} | "
                  f"{f(r.groups_trained)} | {f(r.tokens_trained, '{:.0f}')} | {f(r.overlong_share, '{:.1%}')} | "
                  f"{f(r.fill_rounds)} |")
    warn = warning(df)
    md += ["", warn] if warn else ["", f"The groups' trained tokens and trained groups agree within {MARGIN:.0%}."]
    return md


def _per_step(g: Group, key: str) -> dict[int, list[float]]:
    out: dict[int, list[float]] = {}
    for r in g.runs:
        for s, v in zip(*r.series(key), strict=True):
            out.setdefault(int(s), []).append(float(v))
    return out


def figure(groups: Sequence[Group], path: Path | str) -> Path | None:
    """Informative groups sampled and groups trained per step, one line per group (mean over seeds, min-max
    shaded); None when no run logged them."""
    from matplotlib.ticker import MaxNLocator

    from orchestrator.report.render.figures import new_figure, save

    if not any(_per_step(g, key) for g in groups for key in PANELS):
        return None
    fig, axes = new_figure(11.0, 4.0, ncols=len(PANELS))
    for ax, (key, title) in zip(axes, PANELS.items(), strict=True):
        for i, g in enumerate(groups):
            per_step = _per_step(g, key)
            if not per_step:
                continue
            steps = sorted(per_step)
            vals = [np.asarray(per_step[s]) for s in steps]
            ax.plot(steps, [v.mean() for v in vals], color=f"C{i % 10}", marker="o" if len(steps) < 12 else None,
                    ms=3, label=g.label)
            ax.fill_between(steps, [v.min() for v in vals], [v.max() for v in vals], color=f"C{i % 10}",
                            alpha=0.12, linewidth=0)
        ax.set_xlabel("step")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_ylabel(title)
        ax.set_title(f"{title} per step (mean over seeds, min-max shaded)", fontsize=10)
        ax.grid(alpha=0.3)
        if ax.get_lines():
            ax.legend(fontsize=7)
        else:  # the runs log the other panel's metric only (hand-written or older metrics files)
            ax.text(0.5, 0.5, "logged by no run", transform=ax.transAxes, ha="center", va="center", color="0.4")
    return save(fig, path)
