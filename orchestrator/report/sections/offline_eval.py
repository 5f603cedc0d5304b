"""The report's offline-evaluation section: what `python -m orchestrator eval` wrote (trials/<trial>/eval/<set>.csv,
orchestrator/evaluate/offline.py), per group, and compared paired by seed like the in-training measures.

Each (set, checkpoint step, n, k, temperature) is its own measure (`<set> pass@1 @ checkpoint S`), compared with
the report's comparisons (every group against the baseline, the contrasts, the main effects: comparisons.py);
Holm runs within each measure's family and no family is primary (exploratory: the `*` stays with the report's
primary measure).
"""

from __future__ import annotations

import io
import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from orchestrator import storage as store
from orchestrator.report.claims.comparisons import all_specs
from orchestrator.report.load import CampaignFiles, Group
from orchestrator.report.tables import comparisons
from orchestrator.tracking.names import OFFLINE_EVAL

SETTING = ["set", "checkpoint_step", "eval_step", "n", "k", "temperature"]
SUMMARY_COLUMNS = ["group", *SETTING, "n_seeds", *(f"{m}_{s}" for m in OFFLINE_EVAL for s in ("mean", "std"))]
CSV_FILES = ("offline_eval", "offline_eval_deltas")


def load_rows(files: CampaignFiles, groups: Sequence[Group]) -> tuple[pd.DataFrame, list[str]]:
    """Every trial's offline-evaluation rows with its group and seed, and the files that could not be read."""
    frames, problems = [], []
    for g in groups:
        for r in g.runs:
            folder = f"{store.TRIALS_DIR}/{r.name}/{store.EVAL_DIR}"
            for name in files.files(folder, "", ".csv"):
                try:
                    df = pd.read_csv(io.BytesIO(files.read_bytes(f"{folder}/{name}")))
                    missing = [c for c in (*SETTING, *OFFLINE_EVAL) if c not in df.columns]
                    if missing:
                        raise ValueError(f"no column {', '.join(missing)}")
                except (ValueError, OSError, pd.errors.ParserError) as exc:
                    problems.append(f"{r.name}/{store.EVAL_DIR}/{name}: unreadable ({exc})")
                    continue
                frames.append(df.assign(group=g.label, seed=r.seed, trial=r.name))
    return (pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=[*SETTING, "group", "seed"]),
            problems)


def _label(setting: tuple, varied: set[str]) -> str:
    s = dict(zip(SETTING, setting, strict=True))
    extra = ", ".join(f"{c} {s[c]}" for c in ("n", "k", "temperature") if c in varied)
    return f"{s['set']} {{m}} @ checkpoint {s['checkpoint_step']}" + (f" ({extra})" if extra else "")


def tables(rows: pd.DataFrame, groups: Sequence[Group], base: Group | None,
           pairs: Sequence[tuple[str, str]] = ()) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(per group and setting: seeds, mean and sd of each measure; the paired deltas of every measure)."""
    if not len(rows):
        return pd.DataFrame(columns=SUMMARY_COLUMNS), pd.DataFrame()
    settings = rows[SETTING].drop_duplicates().sort_values(SETTING)
    varied = {c for c in ("n", "k", "temperature") if rows.groupby(["set", "checkpoint_step"])[c].nunique().max() > 1}
    summary, measures = [], []
    order = {g.label: i for i, g in enumerate(groups)}
    for setting in settings.itertuples(index=False, name=None):
        part = rows[(rows[SETTING] == pd.Series(setting, index=SETTING)).all(axis=1)]
        for label, grp in sorted(part.groupby("group"), key=lambda x: order.get(x[0], math.inf)):
            row = {"group": label, **dict(zip(SETTING, setting, strict=True)), "n_seeds": int(grp["seed"].nunique())}
            for m in OFFLINE_EVAL:
                x = grp[m].to_numpy(float)
                row[f"{m}_mean"] = float(np.mean(x))
                row[f"{m}_std"] = float(np.std(x, ddof=1)) if x.size > 1 else math.nan
            summary.append(row)
        for m in OFFLINE_EVAL:
            values = {g: dict(zip(grp["seed"].astype(int), grp[m].astype(float), strict=True))
                      for g, grp in part.groupby("group")}
            measures.append((_label(setting, varied).format(m=m), int(setting[1]) + 1, values))
    deltas = pd.DataFrame()
    if base is not None and len(groups) > 1:
        deltas, _ = comparisons(groups, all_specs(groups, base, pairs), measures, metric="eval/pass@1", primary=None)
    return pd.DataFrame(summary, columns=SUMMARY_COLUMNS), deltas


def markdown(summary: pd.DataFrame, deltas: pd.DataFrame, problems: list[str]) -> list[str]:
    if not len(summary) and not problems:
        return []
    md = ["", "## Offline evaluation (`python -m orchestrator eval`)", "",
          "Each trial's checkpoint of step S evaluated on held-out sets afterwards (`trials/<trial>/eval/<set>.csv`): "
          "the policy the in-training evaluation of step S + 1 measured, with its seeds; on the task's own set "
          "(`default`) and the trial's `eval.sets` at the trial's eval settings, the same numbers as that "
          "evaluation. Mean over seeds (sd).", "",
          "| group | set | checkpoint | n | k | T | seeds | pass@1 | pass@k |", "|---|---|---|---|---|---|---|---|---|"]

    def f(m: float, s: float) -> str:
        return "n/a" if not math.isfinite(m) else f"{m:.3f}" + (f" ({s:.3f})" if math.isfinite(s) else "")

    for _, r in summary.iterrows():
        md.append(f"| {r.group} | {r.set} | {r.checkpoint_step} | {r.n} | {r.k} | {r.temperature:g} | {r.n_seeds} | "
                  f"{f(r['pass@1_mean'], r['pass@1_std'])} | {f(r['pass@k_mean'], r['pass@k_std'])} |")
    if len(deltas):
        md += ["", "Paired deltas (group - baseline, same seed; exploratory: Holm within each measure, no `*`):", "",
               "| comparison | measure | pairs | delta | CI | p (Holm) |", "|---|---|---|---|---|---|"]
        for _, r in deltas.iterrows():
            ci = (f"[{r.ci_low:+.3f}, {r.ci_high:+.3f}]" if math.isfinite(r.ci_low) else "n/a")
            p = f"{r.p_holm:.3g}" if math.isfinite(r.p_holm) else (r.note or "n/a")
            md.append(f"| {r.group} vs {r.baseline} | {r.measure} | {r.n_pairs} | "
                      f"{r.delta:+.3f} | {ci} | {p} |" if math.isfinite(r.delta) else
                      f"| {r.group} vs {r.baseline} | {r.measure} | {r.n_pairs} | n/a | n/a | {r.note or 'n/a'} |")
    md += [f"- {p}" for p in problems]
    md += ["", "Tables: " + ", ".join(f"`{t}.csv`" for t in CSV_FILES) + "."]
    return md


def section(files: CampaignFiles, groups: Sequence[Group], base: Group | None, pairs: Sequence[tuple[str, str]],
            out_dir: Path) -> tuple[dict[str, pd.DataFrame], list[str]]:
    """(its tables by CSV stem, written to `out_dir`; its markdown lines); nothing when no trial was evaluated."""
    rows, problems = load_rows(files, groups)
    if not len(rows) and not problems:
        return {}, []
    summary, deltas = tables(rows, groups, base, pairs)
    out = {"offline_eval": summary, "offline_eval_deltas": deltas}
    for name, df in out.items():
        df.to_csv(out_dir / f"{name}.csv", index=False)
    return out, markdown(summary, deltas, problems)
