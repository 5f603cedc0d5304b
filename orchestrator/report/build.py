"""Campaign report: read a campaign directory, compute the paper's tables, write markdown, CSVs and PNGs.

This module holds the entry point `build_report`, its options `ReportOptions` and its result `Report`. The
parts: `load` (reading the campaign directory), `tables` (the tables and their CSV columns), `claims/` (the
comparisons' families and which test is primary), `sections/` (the sections after the main tables), `render/`
(markdown, terminal text and PNGs) and `orchestrator.stats` (the statistics).

Units of comparison are groups (condition + sweep values); the runs of a group differ only in seed and are
the replicates. Paired comparisons pair runs by seed. The campaign may still be running or partly failed:
missing and short trials are listed and everything is computed from the data that exists.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from orchestrator import storage as store
from orchestrator.campaign.sections import CONTRAST, AdaptiveSeeds, parse_contrast
from orchestrator.report.claims.comparisons import all_specs
from orchestrator.report.claims.primary import (
    SequentialPrimary,
    choose_primary,
    choose_primary_trend,
    measure_label,
    sequential_primary,
    window_of,
)
from orchestrator.report.load import CampaignFiles, Group, TrialIssue, load
from orchestrator.report.render import figures as figs
from orchestrator.report.render.markdown import AucWindows, Scope, render, slug
from orchestrator.report.sections import examples, offline_eval, sweeps
from orchestrator.report.sections.extra import extra_sections
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
    `<campaign_dir>/report/`; required for a URI). figures: False skips the PNGs. primary: the primary measure
    (`report.primary`: auc_LO_HI or final; None: auc_0_15, else the widest AUC window, else final), the one family
    with a `*` (its window is computed even when `windows` leaves it out). primary_sweep: in a campaign with a
    sweep the one primary test is the trend of the primary measure over a sweep (`report.primary_sweep`:
    condition / key / series, default the first; `primary.choose_primary_trend`), and every delta is exploratory.
    adaptive: the campaign's adaptive seeds; their stop's decision on its contrast, recomputed, is then the
    primary result (`primary.sequential_primary`).
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
    primary: str | None = None
    primary_sweep: Any = None
    adaptive: AdaptiveSeeds | None = None


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


def _events(files: CampaignFiles) -> list[dict]:
    """The campaign's events.jsonl lines (none when it has none)."""
    import json

    if not files.is_file(store.EVENTS_FILE):
        return []
    out = []
    for line in files.read_text(store.EVENTS_FILE).splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue  # a partly written last line
    return out


def _mark_sequential(deltas: pd.DataFrame, seq: SequentialPrimary, label: str | None) -> pd.DataFrame:
    """The stop's contrast on the stop's measure (`label`; None: not in the table) is the primary row: its `*` is
    the stop's claim (recomputed), and its pairs, delta, interval and p are the last look's (the repeated CI at
    confidence 1 - level, p against that level; no fixed-sample p or Holm p beside a sequential `*`); every other
    row is exploratory."""
    other, base = CONTRAST.match(seq.cfg.contrast).groups()
    deltas = deltas.copy()
    row = (deltas["measure"] == label) & (deltas["baseline"] == base) & (
        (deltas["group"] == other) | (deltas["group"] == f"{other}-{base}"))
    deltas.loc[row, "role"] = "primary (sequential)"
    deltas.loc[row, "mark"] = "*" if seq.decision == "claim" else ""
    if seq.result is not None and row.any():
        r = seq.result
        deltas.loc[row, ["n_pairs", "delta", "ci_low", "ci_high", "p_value"]] = [r["pairs"], r["delta"], r["lo"],
                                                                                r["hi"], r["p"]]
        deltas.loc[row, "seeds"] = " ".join(map(str, range(r["seeds"])))
        deltas.loc[row, "ci_excludes_zero"] = bool(r["claimed"])
        deltas.loc[row, "p_holm"] = math.nan
        deltas.loc[row, "note"] = (f"sequential: look {seq.look} of {len(seq.looks)}, repeated CI at confidence "
                                   f"1 - {r['level']:.3g}, p against the look's level {r['level']:.3g}")
    return deltas


def _not_needed(issues: list[TrialIssue], runs: list, seq: SequentialPrimary) -> list[TrialIssue]:
    """Trials of seeds past a finished adaptive stop never ran by design: said so, not as missing."""
    if seq.decision not in ("claim", "stop at max") or seq.result is None:
        return issues
    seed_of = {r.name: r.seed for r in runs}
    why = f"not run: the adaptive stop ended the campaign at {seq.result['seeds']} seeds ({seq.decision})"
    return [TrialIssue(i.name, why) if seed_of.get(i.name, -1) >= seq.result["seeds"] and i.reason.startswith(
        "not started") else i for i in issues]


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
    asked = opts.adaptive.measure if opts.adaptive else opts.primary
    if asked and window_of(asked) and window_of(asked) not in windows:
        windows.append(window_of(asked))  # the primary measure is always computed
    if opts.adaptive is not None and tuple(CONTRAST.match(opts.adaptive.contrast).groups()) not in pairs:
        pairs.append(tuple(CONTRAST.match(opts.adaptive.contrast).groups()))
    step_tab, step_values = step_table(groups, metric, k)
    auc, auc_runs, auc_dropped, auc_values, reached, skipped = auc_tables(groups, metric, windows,
                                                                          interpolate=opts.interpolate)
    measures = []
    if k is not None:
        measures.append((f"step {k}", k + 1, step_values))
    measures += [(f"AUC {window_label(w)}", w[1] + 1, auc_values[w]) for w in reached]
    primary, why = choose_primary(asked, reached, k)
    sequential = None
    if opts.adaptive is not None:
        events = _events(CampaignFiles(campaign_dir))
        sequential = sequential_primary(groups, opts.adaptive, opts.adaptive.metric or default_metric(groups), events,
                                        interpolate=opts.interpolate)
    trend = None if sequential is not None or not sweeps.applies(groups) else choose_primary_trend(
        groups, opts.primary_sweep, primary, k, {name: values for name, _, values in measures})
    deltas, power = comparisons(groups, all_specs(groups, base, pairs), measures, metric=metric, effect=opts.effect,
                                primary=None if sequential or trend else primary) if base is not None \
        else (pd.DataFrame(columns=COLUMNS["deltas"]), pd.DataFrame(columns=COLUMNS["power"]))
    if sequential is not None:
        last = max((r.config.get("steps") or 0 for r in runs), default=0) - 1
        same = sequential.metric == metric and (window_of(opts.adaptive.measure) is not None or k == last)
        # the table's row is the stop's own measure only on the stop's metric (and `final` only at the last step)
        deltas = _mark_sequential(deltas, sequential, measure_label(opts.adaptive.measure, k) if same else None)
        issues = _not_needed(issues, runs, sequential)
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
                                                        interpolate=opts.interpolate, primary_trend=trend)
    tables.update(extra_tables)
    files = CampaignFiles(campaign_dir)
    extra_md += examples.markdown(files, examples.campaign_trials(files))
    offline_tables, offline_md = offline_eval.section(files, groups, base, pairs, out_dir)  # `eval`'s CSVs
    tables.update(offline_tables)
    extra_md += offline_md

    written = _figures(groups, metric, tables, reached, lambda_curves, token_samples, out_dir) \
        if opts.figures else []
    scope = Scope(meta, metric, k, base, opts.effect, issues, len(runs), sum(r.started for r in runs),
                  primary=(primary, why), sequential=sequential, trend=trend)
    markdown, headline = render(scope, tables, AucWindows(reached, skipped, opts.interpolate), written, out_dir,
                                notes, extra=extra_md)
    written += extra_figs
    (out_dir / "report.md").write_text(markdown)
    return Report(markdown=markdown, headline=headline, tables=tables, figures=written, missing=issues,
                  out_dir=out_dir, metric=metric, step=k, baseline=base.label if base else None,
                  groups=[g.label for g in groups], skipped_windows=skipped, windows=windows)
