"""Rendering the report's tables as text: the `report.md` markdown and the short terminal headline."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from orchestrator.report.load import Group, TrialIssue
from orchestrator.report.tables import ALPHA, CSV_FILES, MIN_PAIRS, MIN_SEEDS, POWER_TARGET, window_label
from orchestrator.stats import paired as stats


def slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("_") or "group"


class _Fmt:
    """Value formatting by the metric's kind (`stats.metric_kind`, from its name, never its values): a rate
    prints as a percentage and its differences in pp; nats and losses print as numbers with their unit."""

    def __init__(self, metric: str):
        self.kind = stats.metric_kind(metric)
        self.pct = self.kind == "rate"
        self.unit = " nats" if self.kind == "nats" else ""

    def value(self, x: float) -> str:
        if not math.isfinite(x):
            return "n/a"
        return f"{100 * x:.1f}%" if self.pct else f"{x:.4g}{self.unit}"

    def delta(self, x: float) -> str:
        if not math.isfinite(x):
            return "n/a"
        return f"{100 * x:+.2f}pp" if self.pct else f"{x:+.4g}{self.unit}"

    def interval(self, lo: float, hi: float) -> str:
        if not (math.isfinite(lo) and math.isfinite(hi)):
            return "[n/a]"
        if self.pct:
            return f"[{100 * lo:.1f}, {100 * hi:.1f}]"
        return f"[{lo:.4g}, {hi:.4g}]"

    def delta_interval(self, lo: float, hi: float) -> str:
        if not (math.isfinite(lo) and math.isfinite(hi)):
            return "[n/a]"
        if self.pct:
            return f"[{100 * lo:+.2f}, {100 * hi:+.2f}]"
        return f"[{lo:+.4g}, {hi:+.4g}]"


def _num(x: Any, digits: int = 3) -> str:
    if x is None:
        return "n/a"
    if isinstance(x, (int, np.integer)):
        return str(int(x))
    x = float(x)
    if math.isnan(x):
        return "n/a"
    if math.isinf(x):
        return "inf"
    if x == int(x) and abs(x) < 1e15:
        return f"{int(x):,}"
    return f"{x:.{digits}g}"


def _pval(p: float) -> str:
    return "n/a" if not math.isfinite(p) else (f"{p:.3f}" if p >= 0.001 else f"{p:.1e}")


def _md_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    def esc(s: str) -> str:
        return str(s).replace("|", "\\|")

    lines = ["| " + " | ".join(map(esc, headers)) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(map(esc, r)) + " |" for r in rows]
    return "\n".join(lines)


def _text_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(str(h)), *(len(str(r[i])) for r in rows)) if rows else len(str(h))
              for i, h in enumerate(headers)]
    line = "  ".join(str(h).ljust(w) for h, w in zip(headers, widths, strict=True))
    out = [line, "  ".join("-" * w for w in widths)]
    out += ["  ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    return "\n".join(out)


def _summary_rows(tables: dict[str, pd.DataFrame], fmt: _Fmt, windows: list[tuple[int, int]]):
    step_rows = [[r.group, str(r.n_seeds), fmt.value(r["mean"]), fmt.value(r["std"])]
                 for _, r in tables["step_table"].iterrows()]
    auc = tables["auc"]
    auc_headers = ["Group"] + [f"Steps {lo}-{hi}" for lo, hi in windows]
    auc_rows = []
    for label in tables["step_table"]["group"]:
        cells = [label]
        for lo, hi in windows:
            sel = auc[(auc.group == label) & (auc.lo == lo) & (auc.hi == hi)]
            if not len(sel) or not sel.iloc[0].n_seeds:
                cells.append("n/a")
                continue
            r = sel.iloc[0]
            ci = fmt.interval(r.ci_low, r.ci_high) if r.n_seeds >= MIN_SEEDS else "too few seeds"
            cells.append(f"{fmt.value(r['mean'])} {ci} (n={r.n_seeds})")
        auc_rows.append(cells)
    delta_rows = [[r.group, r.baseline, r.measure, str(r.n_pairs), fmt.delta(r.delta),
                   "too few seeds" if r.n_pairs < MIN_PAIRS else "zero variance" if r.zero_variance else
                   fmt.delta_interval(r.ci_low, r.ci_high), _pval(r.p_value), _pval(r.p_holm), r.mark]
                  for _, r in tables["deltas"].iterrows()]
    return step_rows, (auc_headers, auc_rows), delta_rows


STEP_HEADERS = ["Group", "Seeds", "Mean", "Std"]
DELTA_HEADERS = ["Comparison", "Against", "Measure", "Pairs", "Delta", "95% CI", "p", "p (Holm)", "*"]


def _deltas_section(deltas: pd.DataFrame, baseline: Group | None, rows: list[list[str]]) -> list[str]:
    sizes = ", ".join(f"{f}: {int(n)}" for f, n in deltas.groupby("family", sort=False)["family_size"].first().items())
    md = ["", f"## Paired deltas (baseline `{baseline.label if baseline else 'n/a'}`, contrasts, main effects)", "",
          "Paired by seed (only seeds every group of the comparison has); delta = comparison - against. "
          "95% CI: the paired t interval of this one comparison. p: paired t-test (scipy ttest_rel). "
          f"**`*`: Holm-adjusted p < {ALPHA} within the measure's family** (the family is every comparison of one "
          f"measure in this table; tests per family: {sizes or 'none'}), so a CI can exclude zero without a `*`. "
          f"Below {MIN_PAIRS} pairs no CI, p or `*` (too few seeds); paired differences that are all equal (zero "
          "variance) have no test and never a `*` (they count in their family as p = 1). Main effects: a level "
          "against the reference level, averaged over the other factor's levels, per seed.", ""]
    md += [_md_table(DELTA_HEADERS, rows)] if rows else ["No comparison (a single group)."]
    notes = [f"- {r.group} vs {r.baseline}, {r.measure}: {r.note}" for _, r in deltas.iterrows()
             if r.zero_variance]
    return md + (["", *notes] if notes else [])


def _power_section(power: pd.DataFrame, fmt: _Fmt, effect: float | None) -> list[str]:
    md = ["", "## Power analysis", ""]
    if effect is None:
        return md + ["No effect of interest given (`report: {effect_of_interest: X}` in the campaign or "
                     "`report --effect X`, in the metric's units): the report does not size seeds from the observed "
                     "effect (post-hoc power says nothing the p-value does not). The minimum detectable effect at the "
                     "current seeds is in `power.csv`."]
    rows = [[r.group, r.measure, str(r.n_pairs), fmt.delta(r.sd_diff).lstrip("+"), _num(r.alpha, 2),
             "n/a" if not math.isfinite(r.power_now) else f"{r.power_now:.0%}", _num(r.seeds_per_arm),
             _num(r.generations_per_arm), fmt.delta(r.mde_at_current_seeds).lstrip("+")]
            for _, r in power.iterrows()]
    md += [f"For the effect of interest {fmt.delta(effect).lstrip('+')} (never the observed effect): paired "
           f"two-sided t-test at the family's Bonferroni level alpha = {ALPHA} / tests in the measure's family "
           f"(Holm's first step; statsmodels TTestPower), from the observed sd of paired differences (none below "
           f"{MIN_PAIRS} pairs). Power now: at the current pairs; seeds/arm: for power {POWER_TARGET:.0%}; "
           "generations per arm = seeds x steps (step + 1 for a step value, hi + 1 for an AUC window) x problems x "
           "rollouts per step; MDE: the smallest effect the current pairs detect with that power.", ""]
    return md + ([_md_table(["Comparison", "Measure", "Pairs", "SD diff", "Alpha", "Power now", "Seeds/arm",
                             "Generations/arm", "MDE now"], rows)] if rows else ["No comparison."])


@dataclass
class Scope:
    """What the report is about, stated in its header and used throughout: the campaign (`campaign.json`'s
    meta), the metric, the step of the step-k table (None: no data), the baseline group, the effect of interest
    of the power table, and the trials (all of them, those with data, those missing or short)."""

    meta: dict
    metric: str
    step: int | None
    baseline: Group | None
    effect: float | None
    issues: list[TrialIssue]
    n_trials: int
    n_started: int


@dataclass
class AucWindows:
    """The AUC windows as the tables computed them: those some run reached, those skipped (no run reaches both
    ends), and whether a run's missing interior step was bridged (`report.auc_interpolate`)."""

    reached: list[tuple[int, int]]
    skipped: list[tuple[int, int]]
    interpolate: bool = False


def render(scope: Scope, tables: dict[str, pd.DataFrame], auc: AucWindows, figures: list[Path], out_dir: Path,
           notes: list[str], extra: Sequence[str] = ()) -> tuple[str, str]:
    """The `report.md` markdown and the terminal headline. `figures` are linked relative to `out_dir`; `extra`:
    the sections of sections.py, after the mechanistic diagnostic."""
    meta, metric, k, baseline = scope.meta, scope.metric, scope.step, scope.baseline
    issues, windows, skipped = scope.issues, auc.reached, auc.skipped
    fmt = _Fmt(metric)
    step_rows, (auc_headers, auc_rows), delta_rows = _summary_rows(tables, fmt, windows)
    name = meta.get("name", "campaign")
    where = f"step {k}" if k is not None else "no step (no trial has data yet)"
    md = [f"# Campaign report: {name}", ""]
    if meta.get("campaign_id"):
        md.append(f"Campaign id: `{meta['campaign_id']}`  ")
    md += [f"Metric: `{metric}`. Step-k table taken at **{where}**. Trials: {scope.n_trials} in the campaign, "
           f"{scope.n_started} with data, {len(issues)} missing or short."]
    md += ["", "## Missing or short trials", ""]
    md += [f"- `{i.name}`: {i.reason}" for i in issues] or ["None: every trial has all its planned steps."]
    md += ["", f"## Step-{k if k is not None else 'k'} table", "",
           "Mean and standard deviation (ddof=1) across seeds of each group.", "",
           _md_table(STEP_HEADERS, step_rows)]
    md += ["", "## Area under the learning curve", "",
           "Normalized trapezoidal AUC per run (mean metric over the window), group mean with a 95% t CI over "
           f"seeds (none below {MIN_SEEDS} seeds; clipped to [0, 1] for a rate; the BCa bootstrap CI is in "
           "auc.csv for reference).", ""]
    md += [_md_table(auc_headers, auc_rows)] if windows else ["No window is reached by any run."]
    if skipped:
        md += ["", "Skipped windows (no run reaches both ends): "
               + ", ".join(f"steps {lo}-{hi}" for lo, hi in skipped) + "."]
    md += ["", "A run needs a value at both ends of a window and at every step it logs the metric at inside it; "
           + ("a missing interior step is bridged linearly (report.auc_interpolate)." if auc.interpolate else
              "a run missing an interior step is dropped (set report.auc_interpolate to bridge it).")]
    dropped = tables["auc_dropped"]
    dropped = dropped[[(lo, hi) in set(windows) for lo, hi in zip(dropped.lo, dropped.hi, strict=True)]]
    if len(dropped):
        md += ["", "Runs dropped from a window (`auc_dropped.csv`):", ""]
        md += [f"- `{r.trial}`, steps {r.window}: {r.reason}" for _, r in dropped.iterrows()]
    md += _deltas_section(tables["deltas"], baseline, delta_rows)
    md += _power_section(tables["power"], fmt, scope.effect)
    md += ["", "## SEPA", ""]
    lam = tables["sepa_lambda_max"]
    if len(lam):
        md += [_md_table(["Group", "Runs", "Max lambda", "At step", "Last step"],
                         [[r.group, str(r.n_runs), f"{r.max_lambda:.4g}", str(r.at_step), str(r.last_step)]
                          for _, r in lam.iterrows()])]
    else:
        md += ["No SEPA group with a logged lambda."]
    md += ["", "## Mechanistic diagnostic", ""]
    mech = tables["mechanistic"]
    if len(mech):
        md += ["Variance of the per-token uncertainty before vs after the token stages, execution vs planning "
               "tokens (metrics: per-run mean over steps of the batch variances, then mean over runs; tokens: "
               "population variance of the pooled npz samples). N: step rows (metrics) or tokens (npz).", "",
               _md_table(["Group", "Source", "Kind", "Token class", "N", "Var before", "Var after", "Reduction"],
                         [[r.group, r.source, r.kind, r.token_class, _num(r.n), _num(r.var_before, 4),
                           _num(r.var_after, 4),
                           "n/a" if not math.isfinite(r.variance_reduction_pct)
                           else f"{r.variance_reduction_pct:.1f}%"] for _, r in mech.iterrows()])]
    else:
        md += ["No SEPA group with uncertainty diagnostics."]
    if notes:
        md += ["", "Notes:", *[f"- {n}" for n in notes]]
    md += list(extra)  # sections.py: paired design / distance from baseline, surprisal vs entropy
    md += ["", "## Figures", ""]
    md += [f"![{p.stem}]({p.relative_to(out_dir) if p.is_relative_to(out_dir) else p})" for p in figures] or ["None."]
    md += ["", "Tables: " + ", ".join(f"`{t}.csv`" for t in CSV_FILES) + "."]

    head = [f"{name}: {metric} at {where}" + (f"; baseline {baseline.label}" if baseline else "")]
    if issues:
        head.append(f"missing/short ({len(issues)}): " + "; ".join(map(str, issues)))
    head += ["", _text_table(STEP_HEADERS, step_rows)]
    if windows:
        head += ["", _text_table(auc_headers, auc_rows)]
    if skipped:
        head.append("skipped windows: " + ", ".join(window_label(w) for w in skipped))
    if delta_rows:
        head += ["", _text_table(DELTA_HEADERS, delta_rows)]
    return "\n".join(md) + "\n", "\n".join(head)
