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

from orchestrator.report.claims.primary import PrimaryTrend, SequentialPrimary
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


SEQUENTIAL = "primary (sequential)"  # the role of the adaptive stop's row in the deltas table


def _summary_rows(tables: dict[str, pd.DataFrame], fmt: _Fmt, windows: list[tuple[int, int]],
                  level: float | None = None):
    """Rows of the step-k, AUC and deltas tables; `level`: the adaptive stop's last look's level, shown in the
    stop's row in place of a Holm p (its CI and p are the look's own)."""
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
    delta_rows = [[r.group, r.baseline, r.measure, r.role, str(r.n_pairs), fmt.delta(r.delta),
                   "too few seeds" if r.n_pairs < MIN_PAIRS else "zero variance" if r.zero_variance else
                   fmt.delta_interval(r.ci_low, r.ci_high) + (" (repeated)" if level is not None and
                                                              r.role == SEQUENTIAL else ""), _pval(r.p_value),
                   f"level {level:.3g}" if level is not None and r.role == SEQUENTIAL else _pval(r.p_holm), r.mark]
                  for _, r in tables["deltas"].iterrows()]
    return step_rows, (auc_headers, auc_rows), delta_rows


STEP_HEADERS = ["Group", "Seeds", "Mean", "Std"]
DELTA_HEADERS = ["Comparison", "Against", "Measure", "Role", "Pairs", "Delta", "95% CI", "p", "p (Holm)", "*"]


def _family_text(deltas: pd.DataFrame, scope: Scope) -> str:
    """What the familywise 5% covers, in one sentence."""
    if scope.sequential is not None:
        s = scope.sequential
        return (f"The familywise {ALPHA:.0%} covers one test: the adaptive stop's contrast {s.cfg.contrast} on "
                f"{s.cfg.measure} over all its looks (see Primary result); every other comparison is exploratory.")
    name, why = scope.primary
    if scope.trend is not None:
        t = scope.trend
        return (f"Primary test: {t.text()} ({t.why}; measure: {why}), tested at {ALPHA:.0%}, the only `*` in this "
                "report (section Sweeps). Every other comparison, the paired deltas and the other sweep tests, is "
                "exploratory: p and p (Holm) shown, never a `*`.")
    if name is None:
        return f"No primary measure ({why}): no comparison carries a `*`; every delta is exploratory."
    n = int(deltas.loc[deltas["role"] == "primary", "family_size"].max()) if (deltas["role"] == "primary").any() else 0
    covers = (f"covers its {n} comparison{'s' if n > 1 else ''} only" if n else
              f"covers no comparison: none has the {MIN_PAIRS} seed pairs a test needs, so none carries a `*`")
    return (f"Primary measure: **{name}** ({why}). The familywise {ALPHA:.0%} (Holm) {covers}; every other measure "
            "is exploratory (its p (Holm) is within its own measure, never a `*`).")


def _deltas_section(deltas: pd.DataFrame, baseline: Group | None, rows: list[list[str]], scope: Scope) -> list[str]:
    sizes = ", ".join(f"{f}: {int(n)}" for f, n in deltas.groupby("family", sort=False)["family_size"].first().items())
    star = ("**`*`: the adaptive stop's claim** on the primary row, whose pairs, delta, CI and p are the stop's last "
            "look's: the repeated CI (the t interval at confidence 1 - the look's level) and the p the stop compared "
            "with that level (shown in the p (Holm) column)" if scope.sequential is not None else
            "**no `*` in this table**: the report's one primary test is the sweep's trend (section Sweeps), so every "
            "row here is exploratory" if scope.trend is not None else
            f"**`*`: Holm-adjusted p < {ALPHA} within the primary measure's family** (every comparison of that "
            "measure), so a CI can exclude zero without a `*`")
    md = ["", f"## Paired deltas (baseline `{baseline.label if baseline else 'n/a'}`, contrasts, main effects)", "",
          _family_text(deltas, scope), "",
          "Paired by seed (only seeds every group of the comparison has); delta = comparison - against. "
          "95% CI: the paired t interval of this one comparison. p: paired t-test (scipy ttest_rel); p (Holm): "
          f"adjusted within the measure's family (tests per family: {sizes or 'none'}). {star}. Role: primary or "
          f"exploratory. Below {MIN_PAIRS} pairs no CI, p or `*` (too few seeds); paired differences that are all "
          "equal (zero variance) have no test and never a `*` (they count in their family as p = 1). Main effects: "
          "a level against the reference level, averaged over the other factor's levels, per seed.", ""]
    md += [_md_table(DELTA_HEADERS, rows)] if rows else ["No comparison (a single group)."]
    notes = [f"- {r.group} vs {r.baseline}, {r.measure}: {r.note}" for _, r in deltas.iterrows()
             if r.zero_variance]
    return md + (["", *notes] if notes else [])


def _sequential_section(s: SequentialPrimary, fmt: _Fmt) -> list[str]:
    """The adaptive design and the stop's own decision, the campaign's primary result."""
    md = ["", "## Primary result (sequential design)", "",
          f"Adaptive seeds: contrast **{s.cfg.contrast}** on **{s.cfg.measure}** of `{s.metric}`, looks after "
          f"{', '.join(map(str, s.looks))} seeds per condition; O'Brien-Fleming-type alpha spending of "
          f"{s.cfg.alpha} over the looks, each look's paired t-test at its level calibrated for the t reference "
          "(orchestrator/stats/sequential.py), so the whole procedure claims an effect that is not there in "
          f"{s.cfg.alpha:.0%} of campaigns. The interval is the look's repeated confidence interval (the t interval "
          "at confidence 1 - level); it is the primary result, and every other comparison in this report is "
          "exploratory.", ""]
    if s.result is None:
        return md + ["No look yet (events.jsonl has no `look` line): no primary result."]
    r = s.result
    md += [_md_table(["Look", "Seeds", "Pairs", "Delta", "Repeated CI", "p", "Level", "Decision"],
                     [[f"{s.look} of {len(s.looks)}", str(r["seeds"]), str(r["pairs"]), fmt.delta(r["delta"]),
                       fmt.delta_interval(r["lo"], r["hi"]), _pval(r["p"]), f"{r['level']:.3g}", s.decision]])]
    if not s.agrees:
        lg = s.logged or {}
        md += ["", f"**Warning:** the stop logged `{lg.get('decision')}` at {lg.get('seeds')} seeds (delta "
                   f"{fmt.delta(lg.get('delta', math.nan))}, p {_pval(lg.get('p', math.nan))}); the data now gives the "
                   "row above (trials changed since, or the report's AUC settings differ from the campaign's)."]
    return md


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
           f"(Holm's first step; power: the noncentral t, statsmodels TTestPower), from the observed sd of paired differences (none below "
           f"{MIN_PAIRS} pairs). Power now: at the current pairs; seeds/arm: for power {POWER_TARGET:.0%}; "
           "generations per arm = seeds x steps (step + 1 for a step value, hi + 1 for an AUC window) x problems x "
           "rollouts per step. MDE now: the effect the current pairs detect with that power over the campaigns that "
           "state it: the observed sd at a few seeds is below the true sd more often than above, so the MDE is solved "
           "for the power averaged over the sd's sampling distribution (chi2), not for the power at the observed sd "
           "(which an effect of that size reaches in only 62-64% of campaigns at 3-4 seeds); power now and seeds/arm "
           "use the observed sd as it is.", ""]
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
    primary: tuple[str | None, str] = (None, "")  # (the primary measure's name, why it is the primary)
    sequential: SequentialPrimary | None = None  # adaptive seeds: the stop's result, recomputed
    trend: PrimaryTrend | None = None  # a campaign with a sweep: its one primary test


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
    seq = scope.sequential
    level = seq.result["level"] if seq is not None and seq.result is not None else None
    step_rows, (auc_headers, auc_rows), delta_rows = _summary_rows(tables, fmt, windows, level)
    name = meta.get("name", "campaign")
    where = f"step {k}" if k is not None else "no step (no trial has data yet)"
    md = [f"# Campaign report: {name}", ""]
    if meta.get("campaign_id"):
        md.append(f"Campaign id: `{meta['campaign_id']}`  ")
    md += [f"Metric: `{metric}`. Step-k table taken at **{where}**. Trials: {scope.n_trials} in the campaign, "
           f"{scope.n_started} with data, {len(issues)} missing or short.", "",
           _family_text(tables["deltas"], scope)]
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
    if scope.sequential is not None:
        md += _sequential_section(scope.sequential, fmt)
    md += _deltas_section(tables["deltas"], baseline, delta_rows, scope)
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

    head = [f"{name}: {metric} at {where}" + (f"; baseline {baseline.label}" if baseline else ""),
            _family_text(tables["deltas"], scope).replace("**", "")]
    if scope.sequential is not None and scope.sequential.result is not None:
        q = scope.sequential
        head.append(f"primary (sequential): {q.cfg.contrast} {q.cfg.measure} look {q.look}: delta "
                    f"{fmt.delta(q.result['delta'])} {fmt.delta_interval(q.result['lo'], q.result['hi'])} "
                    f"p {_pval(q.result['p'])} vs {q.result['level']:.3g}: {q.decision}")
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
