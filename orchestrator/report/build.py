"""Campaign report: read a campaign directory, compute the paper's tables, write markdown, CSVs and PNGs.

This module holds the entry point `build_report`, its options `ReportOptions` and its result `Report`. The
parts: `load` (reading the campaign directory), `tables` (the tables and their CSV columns), `render`
(markdown and terminal text), `stats` (the statistics) and `figures` (the PNGs).

Units of comparison are groups (condition + sweep values); the runs of a group differ only in seed and are
the replicates. Paired comparisons pair runs by seed. The campaign may still be running or partly failed:
missing and short trials are listed and everything is computed from the data that exists.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from orchestrator import storage as store
from orchestrator.campaign.sections import parse_contrast
from orchestrator.report import examples
from orchestrator.report import figures as figs
from orchestrator.report.comparisons import all_specs
from orchestrator.report.load import CampaignFiles, Group, TrialIssue, load
from orchestrator.report.render import AucWindows, Scope, render, slug
from orchestrator.report.sections import extra_sections
from orchestrator.report.tables import (
    COLUMNS,
    CSV_FILES,
    auc_tables,
    choose_step,
    comparisons,
    default_metric,
    default_windows,
    mechanistic,
    sepa_tables,
    step_table,
    window_label,
)

__all__ = ["CSV_FILES", "Report", "ReportOptions", "TrialIssue", "build_report"]


@dataclass
class Report:
    """What `build_report` computed and wrote.

    markdown: the full `report.md` text; headline: a short plain-text summary for a terminal (step-k table,
    AUC table, deltas); tables: name -> DataFrame (the CSVs, keyed by file stem); figures: PNG paths written;
    missing: trials missing or short, with the reason.
    """

    markdown: str
    headline: str
    tables: dict[str, pd.DataFrame]
    figures: list[Path]
    missing: list[TrialIssue]
    out_dir: Path
    metric: str
    step: int | None  # the step the step-k table was taken at (None: no data)
    baseline: str | None  # baseline group label
    groups: list[str] = field(default_factory=list)
    skipped_windows: list[tuple[int, int]] = field(default_factory=list)
    windows: list[tuple[int, int]] = field(default_factory=list)  # the AUC windows asked for


def _contrast_pairs(contrasts: Sequence[str | tuple[str, str]], conditions: list[str]) -> list[tuple[str, str]]:
    out = []
    for c in contrasts:
        pair = tuple(c) if not isinstance(c, str) else parse_contrast(c, conditions)
        if pair is None or len(pair) != 2 or not set(pair) <= set(conditions):
            raise ValueError(f"contrast {c!r} must be 'A-B' with two conditions of the campaign: "
                             + ", ".join(conditions))
        out.append(pair)
    return out


@dataclass(frozen=True)
class ReportOptions:
    """What a reader chooses about a report (`report` on the command line, the campaign's `report:` block);
    every field has a default, so `build_report(campaign_dir)` is the default report.

    metric: default `eval/success` (agentic campaigns), else `eval/pass@1` when any trial logged it, else
    `train/correct_rate`; only rows carrying the key are used. step: the step of the step-k table; default the
    latest step every started trial reached (for an eval metric absent there, the latest eval step <= k common
    to all runs). windows: AUC windows `(lo, hi)` (default `tables.default_windows`, from the metric's logging
    cadence); a window no run covers is skipped, and every run dropped from a window is listed with the reason.
    interpolate: bridge a run's missing interior step instead of dropping it. baseline: a group label or a
    condition name (its first group); default the first group of the first condition. effect: the effect of
    interest in the metric's units, for the power table (none: no seeds-per-arm). contrasts: "A-B" condition
    pairs compared beside the baseline. out_dir: where the report is written (default
    `<campaign_dir>/report/`; required for a URI). figures: False skips the PNGs.
    """

    metric: str | None = None
    step: int | None = None
    windows: Sequence[tuple[int, int]] | None = None
    baseline: str | None = None
    out_dir: Path | None = None
    figures: bool = True
    effect: float | None = None
    contrasts: Sequence[str | tuple[str, str]] = ()
    interpolate: bool = False


def _baseline(groups: list[Group], baseline: str | None) -> Group | None:
    """The baseline group: `baseline` as a group label or a condition (its first group), default the first."""
    if not groups:
        return None
    if baseline is None:
        return groups[0]
    base = next((g for g in groups if g.label == baseline), None) or next(
        (g for g in groups if g.condition == baseline), None)
    if base is None:
        raise ValueError(f"baseline {baseline!r} is neither a group nor a condition; groups: "
                         + ", ".join(g.label for g in groups))
    return base


def _figures(groups: list[Group], metric: str, tables: dict[str, pd.DataFrame], reached: list[tuple[int, int]],
             lambda_curves: dict, token_samples: dict, out_dir: Path) -> list[Path]:
    """The PNGs: learning curves, the AUC forest, SEPA lambda curves, uncertainty histograms (in that order)."""
    written: list[Path] = []
    auc = tables["auc"]
    curves = {g.label: [r.series(metric) for r in g.runs if r.started and r.series(metric)[0].size]
              for g in groups}
    curves = {label: c for label, c in curves.items() if c}
    if curves:
        written.append(figs.learning_curves(curves, out_dir / "learning_curves.png", metric=metric))
    if len(auc) and auc["n_seeds"].sum():
        intervals = {f"steps {window_label(w)}": {r.group: (r["mean"], r.ci_low, r.ci_high)
                                                 for _, r in auc[(auc.lo == w[0]) & (auc.hi == w[1])].iterrows()
                                                 if r.n_seeds}
                     for w in reached}
        written.append(figs.auc_forest(intervals, out_dir / "auc_forest.png", metric=metric))
    if lambda_curves:
        written.append(figs.sepa_lambda_curves(lambda_curves, out_dir / "sepa_lambda.png"))
    for label, (tok, kind) in token_samples.items():
        written.append(figs.uncertainty_histograms(
            tok["exec_before"], tok["plan_before"], tok["exec_after"], tok["plan_after"],
            out_dir / f"uncertainty_hist_{slug(label)}.png", kind=kind, title=f"{label}: {kind}"))
    return written


def build_report(campaign_dir: Path | str, options: ReportOptions | None = None) -> Report:
    """Read `campaign_dir` (a path, or a URI read through pyarrow.fs) and write `report.md`, the CSV tables
    and PNG figures into `options.out_dir` (see `ReportOptions` for every choice and its default)."""
    opts = options or ReportOptions()
    out_dir = opts.out_dir
    if "://" in str(campaign_dir):  # a URI (s3://, gs://, any pyarrow filesystem): read in place, write locally
        if out_dir is None:
            raise ValueError(f"{campaign_dir} is a URI: give out_dir, a local directory for the report")
    else:
        campaign_dir = Path(campaign_dir)
    out_dir = Path(out_dir) if out_dir is not None else campaign_dir / store.REPORT_DIR
    meta, groups, issues = load(campaign_dir)
    runs = [r for g in groups for r in g.runs]
    metric = opts.metric or default_metric(groups)
    k = choose_step(runs, metric, opts.step)
    base = _baseline(groups, opts.baseline)

    pairs = _contrast_pairs(opts.contrasts, list(dict.fromkeys(g.condition for g in groups)))
    windows = [(int(lo), int(hi)) for lo, hi in
               (default_windows(runs, metric) if opts.windows is None else opts.windows)]
    step_tab, step_values = step_table(groups, metric, k)
    auc, auc_runs, auc_dropped, auc_values, reached, skipped = auc_tables(groups, metric, windows,
                                                                          interpolate=opts.interpolate)
    measures = []
    if k is not None:
        measures.append((f"step {k}", k + 1, step_values))
    measures += [(f"AUC {window_label(w)}", w[1] + 1, auc_values[w]) for w in reached]
    deltas, power = comparisons(groups, all_specs(groups, base, pairs), measures, metric=metric,
                                effect=opts.effect) if base is not None else (
        pd.DataFrame(columns=COLUMNS["deltas"]), pd.DataFrame(columns=COLUMNS["power"]))
    sepa, sepa_max, lambda_curves = sepa_tables(groups)
    mech, token_samples, notes = mechanistic(campaign_dir, groups)
    if any(r.started for r in runs) and not any(r.series(metric)[0].size for r in runs):
        notes.insert(0, f"metric `{metric}` was not found in any trial's metrics.jsonl")
    tables = {"step_table": step_tab, "auc": auc, "auc_runs": auc_runs, "auc_dropped": auc_dropped,
              "deltas": deltas, "power": power,
              "sepa_lambda": sepa, "sepa_lambda_max": sepa_max, "mechanistic": mech}

    out_dir.mkdir(parents=True, exist_ok=True)
    for name in CSV_FILES:
        tables[name].to_csv(out_dir / f"{name}.csv", index=False)

    extra_tables, extra_md, extra_figs = extra_sections(groups, base, metric, out_dir, opts.figures, step=k,
                                                        interpolate=opts.interpolate)
    tables.update(extra_tables)
    files = CampaignFiles(campaign_dir)
    extra_md += examples.markdown(files, examples.campaign_trials(files))

    written = _figures(groups, metric, tables, reached, lambda_curves, token_samples, out_dir) \
        if opts.figures else []
    scope = Scope(meta, metric, k, base, opts.effect, issues, len(runs), sum(r.started for r in runs))
    markdown, headline = render(scope, tables, AucWindows(reached, skipped, opts.interpolate), written, out_dir,
                                notes, extra=extra_md)
    written += extra_figs
    (out_dir / "report.md").write_text(markdown)
    return Report(markdown=markdown, headline=headline, tables=tables, figures=written, missing=issues,
                  out_dir=out_dir, metric=metric, step=k, baseline=base.label if base else None,
                  groups=[g.label for g in groups], skipped_windows=skipped, windows=windows)
