"""The report's paired-design section: common random numbers, and how far each condition's trajectory has moved
from the baseline's, step by step.

Trials of a campaign that share a seed share the prompt order (the task cursor is seeded by the trial seed) and
the sampling seeds (a pure function of seed, step and worker; eval has its own): common random numbers. At step 0
every condition samples from the same initial policy, so its rollouts, and every metric of that step computed
before the update, are identical across conditions; they differ from step 1 on only through what the credit
assignment did to the policy. Paired differences by seed therefore isolate the condition's effect.

`distance_table` gives, per group, metric and step, the paired difference to the baseline (mean over the seeds
both have, with min and max) and the mean absolute difference; `crn_check` tests the step-0 identity: bit for bit,
except for runs sampled on a shared pool's GPU engines without batch-invariant kernels (`batch_variant`), whose
step-0 values may differ by batch composition within STEP0_TOLERANCE.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import pandas as pd

from orchestrator.report.load import Group
from orchestrator.report.sections import isolation

COLUMNS = ["group", "baseline", "metric", "step", "n_pairs", "mean_diff", "min_diff", "max_diff", "mean_abs_diff"]
CSV_FILES = ("trajectory_distance",)


def distance_table(groups: Sequence[Group], base: Group | None, metrics: Sequence[str]) -> pd.DataFrame:
    """Paired differences (group - baseline, same seed) per step, for every non-baseline group and metric."""
    rows = []
    if base is None:
        return pd.DataFrame(rows, columns=COLUMNS)
    base_runs = {r.seed: r for r in base.runs if r.started}
    for g in groups:
        if g is base:
            continue
        for metric in metrics:
            diffs: dict[int, list[float]] = {}
            for r in g.runs:
                b = base_runs.get(r.seed)
                if not r.started or b is None:
                    continue
                s1, v1 = r.series(metric)
                s0, v0 = b.series(metric)
                common, i1, i0 = np.intersect1d(s1, s0, return_indices=True)
                for s, d in zip(common, v1[i1] - v0[i0], strict=True):
                    diffs.setdefault(int(s), []).append(float(d))
            for s in sorted(diffs):
                d = np.asarray(diffs[s])
                rows.append({"group": g.label, "baseline": base.label, "metric": metric, "step": s,
                             "n_pairs": int(d.size), "mean_diff": float(d.mean()), "min_diff": float(d.min()),
                             "max_diff": float(d.max()), "mean_abs_diff": float(np.abs(d).mean())})
    return pd.DataFrame(rows, columns=COLUMNS)


# The step-0 difference across conditions accepted for runs whose shared engines are not batch-invariant (GPU
# engines, `resources.shared_base.batch_invariant` off): absolute, on the step-0 correct rate. Such kernels move a
# log-prob by rounding (~1e-3 relative in bf16), which changes a sampled token only where the seeded draw lies that
# close to a boundary of the token's CDF; the sample then continues differently and may be scored otherwise, so a
# difference comes in whole samples (1 / (prompts_per_step x n) each), not as a small relative change: a relative
# 1e-3 would accept none. 0.05 accepts 3 samples of a 64-sample step flipping. A stated value, not measured (no GPU
# was lent to this project): the report names it wherever it was used.
STEP0_TOLERANCE = 0.05


class CrnCheck(NamedTuple):
    checked: int  # seeds with at least two conditions at step 0
    same: int  # of them, identical bit for bit
    within: int  # of them, not identical but within STEP0_TOLERANCE (engines not batch-invariant)
    bad: list[str]  # the others: "seed s: label=value, ..."


def batch_variant(config: dict[str, Any]) -> bool:
    """Whether a run (its trial config) sampled on a shared pool's GPU engines without vLLM's batch-invariant
    kernels, so its samples may depend on which other slots' requests shared its batch. CPU engines (worker_gpus
    0) and batch_invariant engines give each slot what a separate engine would: identity is required of them."""
    r = config.get("resources") if isinstance(config, dict) else None
    shared = r.get("shared_base") if isinstance(r, dict) else None
    return (isinstance(shared, dict) and not shared.get("batch_invariant", False)
            and float(r.get("worker_gpus") or 0.0) > 0.0)


def crn_check(groups: Sequence[Group], metric: str = "train/correct_rate") -> CrnCheck:
    """Step-0 identity across conditions sharing a seed: bit for bit, or within STEP0_TOLERANCE when any of the
    seed's runs is `batch_variant`."""
    by_seed: dict[int, list[tuple[str, float]]] = {}
    loose: set[int] = set()
    for g in groups:
        for r in g.runs:
            v = r.value_at(metric, 0) if r.started else math.nan
            if math.isfinite(v):
                by_seed.setdefault(r.seed, []).append((g.label, v))
                if batch_variant(r.config):
                    loose.add(r.seed)
    checked = same = within = 0
    bad = []
    for seed, vals in sorted(by_seed.items()):
        if len(vals) < 2:
            continue
        checked += 1
        spread = max(v for _, v in vals) - min(v for _, v in vals)
        if spread == 0.0:
            same += 1
        elif seed in loose and spread <= STEP0_TOLERANCE:
            within += 1
        else:
            beyond = f" (beyond the stated tolerance {STEP0_TOLERANCE:g})" if seed in loose else ""
            bad.append(f"seed {seed}: " + ", ".join(f"{label}={v:.4g}" for label, v in vals) + beyond)
    return CrnCheck(checked, same, within, bad)


def markdown(table: pd.DataFrame, groups: Sequence[Group], base: Group | None, metrics: Sequence[str]) -> list[str]:
    md = ["", "## Paired design and distance from the baseline", "",
          "Conditions that share a seed share the prompt order and the sampling seeds (common random numbers): "
          "a paired design, which is why the deltas above pair runs by seed. At step 0 every condition samples from "
          "the same initial policy, so step-0 rollouts are identical across conditions; afterwards they differ only "
          "through what each condition's credit assignment did to the policy."]
    checked, same, within, bad = crn_check(groups)
    if checked:
        md += ["", f"Check: step-0 `train/correct_rate` is identical across conditions for {same} of {checked} "
                   "seeds (bit for bit)"
               + (f"; within the stated tolerance {STEP0_TOLERANCE:g} (engines not batch-invariant) for {within}"
                  if within else "")
               + ("." if not bad else "; differing: " + "; ".join(bad) + ".")]
    md += isolation.markdown(groups)
    if base is None or not len(table):
        return md + ["", "No paired trajectories (a single group or no shared seeds)."]
    md += ["", f"Paired difference to `{base.label}` (same seed), mean over seeds, at selected steps "
               "(full table: `trajectory_distance.csv`, figure: `trajectory_distance.png`).", ""]
    for metric in metrics:
        sub = table[table.metric == metric]
        if not len(sub):
            continue
        steps = sorted(sub.step.unique())
        shown = sorted({steps[0], steps[len(steps) // 2], steps[-1]} | ({steps[1]} if len(steps) > 1 else set()))
        md += [f"`{metric}`:", "", "| Group | " + " | ".join(f"step {s}" for s in shown) + " |",
               "|---|" + "---|" * len(shown)]
        for label, df in sub.groupby("group", sort=False):
            cells = []
            for s in shown:
                hit = df[df.step == s]
                cells.append("n/a" if not len(hit) else f"{hit.iloc[0].mean_diff:+.3f}")
            md.append(f"| {label} | " + " | ".join(cells) + " |")
        md.append("")
    return md


def figure(table: pd.DataFrame, path: Path | str, metrics: Sequence[str]) -> Path | None:
    """One panel per metric: mean paired difference to the baseline per step (min-max over seeds shaded)."""
    from orchestrator.report.render.figures import new_figure, save

    metrics = [m for m in metrics if (table.metric == m).any()] if len(table) else []
    if not metrics:
        return None
    fig, axes = new_figure(6.5 * len(metrics), 4.0, ncols=len(metrics))
    base = table.baseline.iloc[0]
    for ax, metric in zip(axes, metrics, strict=True):
        sub = table[table.metric == metric]
        for i, (label, df) in enumerate(sub.groupby("group", sort=False)):
            color = f"C{(i + 1) % 10}"
            ax.plot(df.step, df.mean_diff, color=color, marker="o" if len(df) < 8 else None, ms=3,
                    label=f"{label} (pairs={int(df.n_pairs.max())})")
            ax.fill_between(df.step, df.min_diff, df.max_diff, color=color, alpha=0.12, linewidth=0)
        ax.axhline(0.0, color="k", lw=0.8)
        ax.set_xlabel("step")
        ax.set_ylabel(f"{metric} - {base} (same seed)")
        ax.set_title(f"{metric}: distance from {base}\nmean paired difference, min-max over seeds", fontsize=10)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    return save(fig, path)
