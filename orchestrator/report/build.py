"""Campaign report: read a campaign directory, compute the paper's tables, write markdown, CSVs and PNGs.

Layout read (see `build_report`):
    <campaign_dir>/campaign.json
    <campaign_dir>/trials/<trial>/metrics.jsonl
    <campaign_dir>/trials/<trial>/uncertainty/step_<k>.npz    (optional; SEPA conditions)

Units of comparison are groups (condition + sweep values); the runs of a group differ only in seed and are
the replicates. Paired comparisons pair runs by seed. The campaign may still be running or partly failed:
missing and short trials are listed and everything is computed from the data that exists.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import pandas as pd

from orchestrator.report import figures as figs
from orchestrator.report import stats

TRAIN_METRIC, EVAL_METRIC = "train/correct_rate", "eval/pass@1"
LAMBDA_KEY = "credit/sepa_lambda"
UNCERTAINTY_KINDS = ("surprisal", "entropy", "varentropy")
TOKEN_CLASSES = (("execution", "exec"), ("planning", "plan"))
CONFIDENCE, N_RESAMPLES, BOOT_SEED = 0.95, 10_000, 0
POWER_TARGET, ALPHA = 0.8, 0.05

COLUMNS: dict[str, list[str]] = {
    "step_table": ["group", "condition", "sweep", "metric", "step", "n_seeds", "mean", "std", "min", "max"],
    "auc": ["group", "condition", "sweep", "metric", "window", "lo", "hi", "n_seeds", "mean", "ci_low",
            "ci_high", "std"],
    "auc_runs": ["trial", "group", "seed", "window", "lo", "hi", "auc"],
    "deltas": ["group", "baseline", "measure", "n_pairs", "seeds", "delta", "ci_low", "ci_high",
               "ci_excludes_zero", "mark", "p_value", "p_holm"],
    "power": ["group", "baseline", "measure", "n_pairs", "effect", "sd_diff", "effect_size_dz", "alpha",
              "power", "seeds_per_arm", "steps", "generations_per_step", "generations_per_arm",
              "current_generations_per_arm", "mde_at_current_seeds"],
    "sepa_lambda": ["group", "step", "n_runs", "lambda_mean", "lambda_min", "lambda_max"],
    "sepa_lambda_max": ["group", "n_runs", "max_lambda", "at_step", "last_step"],
    "mechanistic": ["group", "source", "kind", "token_class", "n", "mean_before", "mean_after", "var_before",
                    "var_after", "variance_reduction_pct"],
}
CSV_FILES = ("step_table", "auc", "auc_runs", "deltas", "power", "sepa_lambda", "sepa_lambda_max", "mechanistic")


class TrialIssue(NamedTuple):
    """A trial that is missing (not started, no metrics) or short (fewer rows than its planned steps)."""

    name: str
    reason: str

    def __str__(self) -> str:
        return f"{self.name}: {self.reason}"


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


# --- reading the campaign -------------------------------------------------------------------------------------


@dataclass
class _Run:
    name: str
    condition: str
    seed: int
    sweep: dict[str, Any]
    config: dict[str, Any]
    group: str = ""
    data: dict[str, np.ndarray] | None = None  # column -> float array over the rows (sorted by "step")
    _cache: dict[str, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict, repr=False)

    @property
    def started(self) -> bool:
        return self.data is not None and self.data["step"].size > 0

    @property
    def n_rows(self) -> int:
        return int(self.data["step"].size) if self.data is not None else 0

    def series(self, key: str) -> tuple[np.ndarray, np.ndarray]:
        """(steps, values) of the rows where `key` is present and finite."""
        if not self.started or key not in self.data:
            return np.zeros(0), np.zeros(0)
        if key not in self._cache:
            col = self.data[key]
            ok = np.isfinite(col)
            self._cache[key] = (self.data["step"][ok], col[ok])
        return self._cache[key]

    def value_at(self, key: str, step: int) -> float:
        s, v = self.series(key)
        hit = np.flatnonzero(s == step)
        return float(v[hit[-1]]) if hit.size else math.nan

    @property
    def last_step(self) -> int | None:
        return int(self.data["step"][-1]) if self.started else None

    @property
    def generations_per_step(self) -> float:
        try:
            r = self.config["rollout"]
            return float(r["prompts_per_step"]) * float(r["n"])
        except (KeyError, TypeError, ValueError):
            return math.nan


@dataclass
class _Group:
    label: str
    condition: str
    sweep: dict[str, Any]
    uses_sepa: bool
    runs: list[_Run] = field(default_factory=list)

    @property
    def sweep_text(self) -> str:
        return ", ".join(f"{k}={_fmt_value(v)}" for k, v in self.sweep.items())


def _short_key(key: str) -> str:
    return ".".join(key.split(".")[-2:])


def _fmt_value(v: Any) -> str:
    return json.dumps(v) if isinstance(v, (list, dict)) else str(v)


def _uses_sepa(config: dict[str, Any]) -> bool:
    mode = (config.get("credit") or {}).get("transform_mode", "none")
    if isinstance(mode, str):
        return "sepa" in mode
    return any("sepa" in str(stage) for stage in (mode or []))


def _as_float(v: Any) -> float:
    if isinstance(v, bool):
        return float(v)
    if isinstance(v, (int, float)):
        return float(v)
    return math.nan


def _read_metrics(path: Path) -> tuple[dict[str, np.ndarray] | None, int]:
    """Numeric columns of a metrics.jsonl (rows sorted by step, the last row wins on a repeated step; NaN
    where a row lacks the key or holds a non-number) and the count of lines that could not be parsed (e.g. a
    partly written last line of a running trial)."""
    rows: dict[int, dict] = {}
    bad = 0
    with path.open() as fh:
        for line in fh:
            line = line.strip()
            if not line:
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                bad += 1
                continue
            if isinstance(row, dict) and isinstance(row.get("step"), (int, float)):
                rows[int(row["step"])] = row
            else:
                bad += 1
    if not rows:
        return None, bad
    steps = sorted(rows)
    keys = {k for row in rows.values() for k in row}
    data = {k: np.array([_as_float(rows[s].get(k)) for s in steps]) for k in keys}
    data["step"] = np.array(steps, dtype=float)
    return data, bad


def _load(campaign_dir: Path) -> tuple[dict[str, Any], list[_Group], list[TrialIssue]]:
    meta = json.loads((campaign_dir / "campaign.json").read_text())
    trials = meta.get("trials") or []
    any_sweep = any(t.get("sweep") for t in trials)
    groups: dict[tuple, _Group] = {}
    issues: list[TrialIssue] = []
    for t in trials:
        cond, sweep = str(t["condition"]), dict(t.get("sweep") or {})
        config = dict(t.get("config") or {})
        key = (cond, tuple(sorted((k, json.dumps(v, sort_keys=True)) for k, v in sweep.items())))
        if key not in groups:
            label = cond
            if any_sweep and sweep:
                # the last two key segments keep labels short (the full paths are in the `sweep` column)
                label = f"{cond} [{', '.join(f'{_short_key(k)}={_fmt_value(v)}' for k, v in sweep.items())}]"
            groups[key] = _Group(label, cond, sweep, _uses_sepa(config))
        run = _Run(str(t["name"]), cond, int(t.get("seed", 0)), sweep, config, groups[key].label)
        groups[key].runs.append(run)
        tdir = campaign_dir / "trials" / run.name
        planned = config.get("steps")
        if not tdir.is_dir():
            issues.append(TrialIssue(run.name, "not started (no trial directory)"))
            continue
        mpath = tdir / "metrics.jsonl"
        if not mpath.is_file():
            issues.append(TrialIssue(run.name, "no metrics.jsonl"))
            continue
        run.data, bad = _read_metrics(mpath)
        note = f"; {bad} unreadable line(s) skipped" if bad else ""
        if run.data is None:
            issues.append(TrialIssue(run.name, f"metrics.jsonl has no rows{note}"))
        elif isinstance(planned, int) and run.n_rows < planned:
            issues.append(TrialIssue(run.name, f"short: {run.n_rows} of {planned} planned steps "
                                               f"(last step {run.last_step}){note}"))
        elif bad:
            issues.append(TrialIssue(run.name, f"{bad} unreadable line(s) skipped"))
    return meta, list(groups.values()), issues


# --- computing the tables -------------------------------------------------------------------------------------


def _default_metric(groups: Sequence[_Group]) -> str:
    for g in groups:
        for r in g.runs:
            if r.series(EVAL_METRIC)[0].size:
                return EVAL_METRIC
    return TRAIN_METRIC


def _is_sparse(runs: Sequence[_Run], metric: str) -> bool:
    """Whether the metric is logged on only some steps (an eval metric)."""
    if metric.startswith("eval/"):
        return True
    return any(r.started and r.series(metric)[0].size < r.n_rows for r in runs)


def _choose_step(runs: Sequence[_Run], metric: str, step: int | None) -> int | None:
    """The step of the step-k table. Default k: the latest step every started trial reached. For a sparse
    (eval) metric absent at exactly k in some run, the latest step <= k present in the most runs (= common to
    all runs when such a step exists)."""
    started = [r for r in runs if r.started]
    if not started:
        return None
    k = min(r.last_step for r in started) if step is None else int(step)
    with_metric = [r for r in started if r.series(metric)[0].size]
    if not with_metric or not _is_sparse(started, metric):
        return k
    if all(k in set(r.series(metric)[0].astype(int)) for r in with_metric):
        return k
    counts: dict[int, int] = {}
    for r in with_metric:
        for s in set(r.series(metric)[0].astype(int)):
            if s <= k:
                counts[s] = counts.get(s, 0) + 1
    if not counts:
        return k
    return max(counts, key=lambda s: (counts[s], s))


def _sd(x: np.ndarray) -> float:
    return float(np.std(x, ddof=1)) if x.size >= 2 else math.nan


def _step_table(groups: Sequence[_Group], metric: str, k: int | None) -> tuple[pd.DataFrame, dict]:
    rows, per_seed = [], {}
    for g in groups:
        vals = {r.seed: r.value_at(metric, k) for r in g.runs if r.started and k is not None}
        vals = {s: v for s, v in vals.items() if math.isfinite(v)}
        per_seed[g.label] = vals
        x = np.array(list(vals.values()), dtype=float)
        rows.append({"group": g.label, "condition": g.condition, "sweep": g.sweep_text, "metric": metric,
                     "step": k, "n_seeds": int(x.size), "mean": float(np.mean(x)) if x.size else math.nan,
                     "std": _sd(x), "min": float(np.min(x)) if x.size else math.nan,
                     "max": float(np.max(x)) if x.size else math.nan})
    return pd.DataFrame(rows, columns=COLUMNS["step_table"]), per_seed


def _window_label(w: tuple[int, int]) -> str:
    return f"{w[0]}-{w[1]}"


def _auc_tables(groups: Sequence[_Group], metric: str, windows: Sequence[tuple[int, int]]):
    run_rows, group_rows, per_seed, skipped, reached = [], [], {}, [], []
    for w in windows:
        lo, hi = int(w[0]), int(w[1])
        values = {}
        for g in groups:
            values[g.label] = {}
            for r in g.runs:
                if not r.started:
                    continue
                s, v = r.series(metric)
                auc = stats.normalized_auc(s, v, (lo, hi)) if s.size else math.nan
                if math.isfinite(auc):
                    values[g.label][r.seed] = auc
                    run_rows.append({"trial": r.name, "group": g.label, "seed": r.seed,
                                     "window": _window_label((lo, hi)), "lo": lo, "hi": hi, "auc": auc})
        if not any(values[g.label] for g in groups):
            skipped.append((lo, hi))
            continue
        reached.append((lo, hi))
        per_seed[(lo, hi)] = values
        for g in groups:
            x = np.array(list(values[g.label].values()), dtype=float)
            ci = stats.bootstrap_ci(x, confidence=CONFIDENCE, n_resamples=N_RESAMPLES, seed=BOOT_SEED)
            group_rows.append({"group": g.label, "condition": g.condition, "sweep": g.sweep_text,
                               "metric": metric, "window": _window_label((lo, hi)), "lo": lo, "hi": hi,
                               "n_seeds": int(x.size), "mean": float(np.mean(x)) if x.size else math.nan,
                               "ci_low": ci[0], "ci_high": ci[1], "std": _sd(x)})
    return (pd.DataFrame(group_rows, columns=COLUMNS["auc"]), pd.DataFrame(run_rows, columns=COLUMNS["auc_runs"]),
            per_seed, reached, skipped)


def _comparisons(groups: Sequence[_Group], base: _Group, measures: list[tuple[str, int, dict]]):
    """Deltas and power rows for every non-baseline group and measure. `measures`: (name, steps consumed to
    reach the measure, {group label: {seed: value}})."""
    delta_rows, power_rows = [], []
    for g in groups:
        if g is base:
            continue
        gps = next((r.generations_per_step for r in g.runs if math.isfinite(r.generations_per_step)), math.nan)
        for name, steps_used, values in measures:
            b, o = values.get(base.label, {}), values.get(g.label, {})
            seeds = sorted(set(b) & set(o))
            cmp = stats.paired_comparison([b[s] for s in seeds], [o[s] for s in seeds], confidence=CONFIDENCE,
                                          n_resamples=N_RESAMPLES, seed=BOOT_SEED)
            delta_rows.append({"group": g.label, "baseline": base.label, "measure": name, "n_pairs": cmp.n,
                               "seeds": " ".join(map(str, seeds)), "delta": cmp.delta, "ci_low": cmp.ci_low,
                               "ci_high": cmp.ci_high, "ci_excludes_zero": cmp.excludes_zero,
                               "mark": "*" if cmp.excludes_zero else "", "p_value": cmp.p_value,
                               "p_holm": math.nan})
            n_arm = stats.seeds_for_power(cmp.delta, cmp.sd_diff, ALPHA, POWER_TARGET) if cmp.n >= 2 else math.nan
            dz = abs(cmp.delta) / cmp.sd_diff if cmp.n >= 2 and cmp.sd_diff > 0 else math.nan
            power_rows.append({
                "group": g.label, "baseline": base.label, "measure": name, "n_pairs": cmp.n,
                "effect": cmp.delta, "sd_diff": cmp.sd_diff, "effect_size_dz": dz, "alpha": ALPHA,
                "power": POWER_TARGET, "seeds_per_arm": n_arm, "steps": steps_used, "generations_per_step": gps,
                "generations_per_arm": stats.generations_per_arm(n_arm, steps_used, gps, 1.0),
                "current_generations_per_arm": stats.generations_per_arm(cmp.n, steps_used, gps, 1.0),
                "mde_at_current_seeds": stats.minimum_detectable_effect(cmp.n, cmp.sd_diff, ALPHA, POWER_TARGET)
                if cmp.n >= 2 else math.nan,
            })
    deltas = pd.DataFrame(delta_rows, columns=COLUMNS["deltas"])
    if len(deltas):
        deltas["p_holm"] = stats.holm(deltas["p_value"].to_numpy(dtype=float))
    return deltas, pd.DataFrame(power_rows, columns=COLUMNS["power"])


def _sepa_tables(groups: Sequence[_Group]) -> tuple[pd.DataFrame, pd.DataFrame, dict]:
    rows, max_rows, curves = [], [], {}
    for g in groups:
        if not g.uses_sepa:
            continue
        runs = [r.series(LAMBDA_KEY) for r in g.runs if r.started]
        runs = [(s, v) for s, v in runs if s.size]
        if not runs:
            continue
        curves[g.label] = runs
        steps = np.concatenate([s for s, _ in runs])
        vals = np.concatenate([v for _, v in runs])
        for s in np.unique(steps):
            v = vals[steps == s]
            rows.append({"group": g.label, "step": int(s), "n_runs": int(v.size), "lambda_mean": float(v.mean()),
                         "lambda_min": float(v.min()), "lambda_max": float(v.max())})
        i = int(np.argmax(vals))
        max_rows.append({"group": g.label, "n_runs": len(runs), "max_lambda": float(vals[i]),
                         "at_step": int(steps[vals == vals[i]].min()), "last_step": int(steps.max())})
    return (pd.DataFrame(rows, columns=COLUMNS["sepa_lambda"]),
            pd.DataFrame(max_rows, columns=COLUMNS["sepa_lambda_max"]), curves)


def _detect_kind(group: _Group) -> str | None:
    """The uncertainty kind of a group's `credit/exec_<kind>_var` metrics (config's kind preferred)."""
    cols = set()
    for r in group.runs:
        if r.started:
            cols.update(r.data)
    preferred = (group.runs[0].config.get("credit") or {}).get("uncertainty_kind") if group.runs else None
    for kind in ([preferred] if preferred else []) + list(UNCERTAINTY_KINDS):
        if f"credit/exec_{kind}_var" in cols:
            return kind
    for c in sorted(cols):
        m = re.fullmatch(r"credit/exec_(\w+?)_var", c)
        if m:
            return m.group(1)
    return None


def _load_tokens(campaign_dir: Path, group: _Group) -> tuple[dict[str, np.ndarray], int, list[str]]:
    parts: dict[str, list[np.ndarray]] = {k: [] for k in ("exec_before", "exec_after", "plan_before", "plan_after")}
    n_files, problems = 0, []
    for r in group.runs:
        udir = campaign_dir / "trials" / r.name / "uncertainty"
        if not udir.is_dir():
            continue
        for path in sorted(udir.glob("step_*.npz")):
            try:
                with np.load(path) as z:
                    arrays = {k: np.asarray(z[k], dtype=float).ravel() for k in parts if k in z.files}
            except Exception as exc:  # a file being written, or corrupt: skip it, say so
                problems.append(f"{r.name}/{path.name}: unreadable ({type(exc).__name__})")
                continue
            n_files += 1
            for k, a in arrays.items():
                parts[k].append(a[np.isfinite(a)])
    return ({k: np.concatenate(v) if v else np.zeros(0) for k, v in parts.items()}, n_files, problems)


def _reduction(before: float, after: float) -> float:
    return 100.0 * (1.0 - after / before) if math.isfinite(before) and before > 0 and math.isfinite(after) else math.nan


def _mechanistic(campaign_dir: Path, groups: Sequence[_Group]):
    rows, samples, notes = [], {}, []
    for g in groups:
        if not g.uses_sepa:
            continue
        kind = _detect_kind(g)
        if kind is not None:
            for cls, short in TOKEN_CLASSES:
                per_run = {}
                for when in ("", "_after"):
                    var_key, mean_key = f"credit/{short}_{kind}_var{when}", f"credit/{short}_{kind}_mean{when}"
                    vs = [r.series(var_key)[1] for r in g.runs if r.started]
                    ms = [r.series(mean_key)[1] for r in g.runs if r.started]
                    per_run[when] = (np.array([v.mean() for v in vs if v.size]),
                                     np.array([m.mean() for m in ms if m.size]), sum(v.size for v in vs))
                vb, mb, n = per_run[""]
                va, ma, _ = per_run["_after"]
                if not vb.size and not va.size:
                    continue
                var_b = float(vb.mean()) if vb.size else math.nan
                var_a = float(va.mean()) if va.size else math.nan
                rows.append({"group": g.label, "source": "metrics (mean over steps)", "kind": kind,
                             "token_class": cls, "n": n, "mean_before": float(mb.mean()) if mb.size else math.nan,
                             "mean_after": float(ma.mean()) if ma.size else math.nan, "var_before": var_b,
                             "var_after": var_a, "variance_reduction_pct": _reduction(var_b, var_a)})
        tokens, n_files, problems = _load_tokens(campaign_dir, g)
        notes.extend(problems)
        if n_files and any(a.size for a in tokens.values()):
            samples[g.label] = (tokens, kind or "uncertainty")
            for cls, short in TOKEN_CLASSES:
                b, a = tokens[f"{short}_before"], tokens[f"{short}_after"]
                var_b = float(np.var(b)) if b.size else math.nan
                var_a = float(np.var(a)) if a.size else math.nan
                rows.append({"group": g.label, "source": f"tokens ({n_files} npz files)", "kind": kind or "",
                             "token_class": cls, "n": int(b.size),
                             "mean_before": float(b.mean()) if b.size else math.nan,
                             "mean_after": float(a.mean()) if a.size else math.nan,
                             "var_before": var_b, "var_after": var_a,
                             "variance_reduction_pct": _reduction(var_b, var_a)})
    return pd.DataFrame(rows, columns=COLUMNS["mechanistic"]), samples, notes


# --- rendering ------------------------------------------------------------------------------------------------


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("_") or "group"


class _Fmt:
    """Value formatting: metrics that are rates (all values in [0, 1]) print as percentages / pp."""

    def __init__(self, values: np.ndarray):
        v = values[np.isfinite(values)]
        self.pct = bool(v.size) and bool(np.all((v >= 0.0) & (v <= 1.0)))

    def value(self, x: float) -> str:
        if not math.isfinite(x):
            return "n/a"
        return f"{100 * x:.1f}%" if self.pct else f"{x:.4g}"

    def delta(self, x: float) -> str:
        if not math.isfinite(x):
            return "n/a"
        return f"{100 * x:+.2f}pp" if self.pct else f"{x:+.4g}"

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
            cells.append(f"{fmt.value(r['mean'])} {fmt.interval(r.ci_low, r.ci_high)} (n={r.n_seeds})")
        auc_rows.append(cells)
    delta_rows = [[r.group, r.measure, str(r.n_pairs), fmt.delta(r.delta),
                   fmt.delta_interval(r.ci_low, r.ci_high) + (" *" if r.ci_excludes_zero else ""),
                   _pval(r.p_value), _pval(r.p_holm)] for _, r in tables["deltas"].iterrows()]
    return step_rows, (auc_headers, auc_rows), delta_rows


STEP_HEADERS = ["Group", "Seeds", "Mean", "Std"]
DELTA_HEADERS = ["Group", "Measure", "Pairs", "Delta", "95% CI", "p", "p (Holm)"]


def _render(meta: dict, metric: str, k: int | None, baseline: _Group | None, tables: dict[str, pd.DataFrame],
            issues: list[TrialIssue], windows: list[tuple[int, int]], skipped: list[tuple[int, int]],
            figures: list[Path], out_dir: Path, notes: list[str], n_trials: int,
            n_started: int) -> tuple[str, str]:
    metric_values = np.concatenate([tables["step_table"]["mean"].to_numpy(float),
                                    tables["auc"]["mean"].to_numpy(float)])
    fmt = _Fmt(metric_values)
    step_rows, (auc_headers, auc_rows), delta_rows = _summary_rows(tables, fmt, windows)
    name = meta.get("name", "campaign")
    where = f"step {k}" if k is not None else "no step (no trial has data yet)"
    md = [f"# Campaign report: {name}", ""]
    if meta.get("campaign_id"):
        md.append(f"Campaign id: `{meta['campaign_id']}`  ")
    md += [f"Metric: `{metric}`. Step-k table taken at **{where}**. Trials: {n_trials} in the campaign, "
           f"{n_started} with data, {len(issues)} missing or short."]
    md += ["", "## Missing or short trials", ""]
    md += [f"- `{i.name}`: {i.reason}" for i in issues] or ["None: every trial has all its planned steps."]
    md += ["", f"## Step-{k if k is not None else 'k'} table", "",
           "Mean and standard deviation (ddof=1) across seeds of each group.", "",
           _md_table(STEP_HEADERS, step_rows)]
    md += ["", "## Area under the learning curve", "",
           "Normalized trapezoidal AUC per run (mean metric over the window), group mean with a 95% percentile "
           "bootstrap CI over seeds.", ""]
    md += [_md_table(auc_headers, auc_rows)] if windows else ["No window is reached by any run."]
    if skipped:
        md += ["", "Skipped windows (no run reaches both ends): "
               + ", ".join(f"steps {lo}-{hi}" for lo, hi in skipped) + "."]
    md += ["", f"## Paired deltas against the baseline `{baseline.label if baseline else 'n/a'}`", "",
           "Paired by seed (only seeds both groups have). `*`: the 95% bootstrap CI excludes zero (needs at "
           "least two pairs). p: paired t-test; Holm-adjusted over all comparisons in this table.", ""]
    md += [_md_table(DELTA_HEADERS, delta_rows)] if delta_rows else ["No comparison (a single group)."]
    power_rows = [[r.group, r.measure, str(r.n_pairs), fmt.delta(r.effect), fmt.delta(r.sd_diff).lstrip("+"),
                   _num(r.seeds_per_arm), _num(r.generations_per_arm), _num(r.current_generations_per_arm),
                   fmt.delta(r.mde_at_current_seeds).lstrip("+")] for _, r in tables["power"].iterrows()]
    md += ["", "## Power analysis", "",
           f"Paired two-sided t-test, alpha {ALPHA}, power {POWER_TARGET:.0%}, exact noncentral t. Seeds per "
           "arm for the observed effect and sd of paired differences; generations per arm = seeds x steps "
           "(step + 1 for a step value, hi + 1 for an AUC window) x problems x rollouts per step; MDE: the "
           "minimum detectable effect at the current number of pairs.", ""]
    md += [_md_table(["Group", "Measure", "Pairs", "Effect", "SD diff", "Seeds/arm", "Generations/arm",
                      "Current generations/arm", "MDE now"], power_rows)] if power_rows else ["No comparison."]
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
        head.append("skipped windows: " + ", ".join(_window_label(w) for w in skipped))
    if delta_rows:
        head += ["", _text_table(DELTA_HEADERS, delta_rows)]
    return "\n".join(md) + "\n", "\n".join(head)


# --- entry point ----------------------------------------------------------------------------------------------


def build_report(campaign_dir: Path, *, metric: str | None = None, step: int | None = None,
                 windows: Sequence[tuple[int, int]] = ((0, 10), (0, 15)), baseline: str | None = None,
                 out_dir: Path | None = None, figures: bool = True) -> Report:
    """Read `campaign_dir` and write `report.md`, the CSV tables and PNG figures into `out_dir`
    (default `<campaign_dir>/report/`).

    metric: default `eval/pass@1` when any trial logged it, else `train/correct_rate`; only rows carrying the
    key are used. step: the step of the step-k table; default the latest step every started trial reached
    (for an eval metric absent there, the latest eval step <= k common to all runs). windows: AUC windows
    `(lo, hi)`; a window no run covers is skipped. baseline: a group label or a condition name (its first
    group); default the first group of the first condition. figures: False skips the PNGs.
    """
    campaign_dir = Path(campaign_dir)
    out_dir = Path(out_dir) if out_dir is not None else campaign_dir / "report"
    meta, groups, issues = _load(campaign_dir)
    runs = [r for g in groups for r in g.runs]
    metric = metric or _default_metric(groups)
    k = _choose_step(runs, metric, step)

    base = None
    if groups:
        if baseline is None:
            base = groups[0]
        else:
            base = next((g for g in groups if g.label == baseline), None) or next(
                (g for g in groups if g.condition == baseline), None)
            if base is None:
                raise ValueError(f"baseline {baseline!r} is neither a group nor a condition; groups: "
                                 + ", ".join(g.label for g in groups))

    step_table, step_values = _step_table(groups, metric, k)
    auc, auc_runs, auc_values, reached, skipped = _auc_tables(groups, metric, [tuple(w) for w in windows])
    measures = []
    if k is not None:
        measures.append((f"step {k}", k + 1, step_values))
    measures += [(f"AUC {_window_label(w)}", w[1] + 1, auc_values[w]) for w in reached]
    deltas, power = _comparisons(groups, base, measures) if base is not None else (
        pd.DataFrame(columns=COLUMNS["deltas"]), pd.DataFrame(columns=COLUMNS["power"]))
    sepa, sepa_max, lambda_curves = _sepa_tables(groups)
    mech, token_samples, notes = _mechanistic(campaign_dir, groups)
    if any(r.started for r in runs) and not any(r.series(metric)[0].size for r in runs):
        notes.insert(0, f"metric `{metric}` was not found in any trial's metrics.jsonl")
    tables = {"step_table": step_table, "auc": auc, "auc_runs": auc_runs, "deltas": deltas, "power": power,
              "sepa_lambda": sepa, "sepa_lambda_max": sepa_max, "mechanistic": mech}

    out_dir.mkdir(parents=True, exist_ok=True)
    for name in CSV_FILES:
        tables[name].to_csv(out_dir / f"{name}.csv", index=False)

    written: list[Path] = []
    if figures:
        curves = {g.label: [r.series(metric) for r in g.runs if r.started and r.series(metric)[0].size]
                  for g in groups}
        curves = {label: c for label, c in curves.items() if c}
        if curves:
            written.append(figs.learning_curves(curves, out_dir / "learning_curves.png", metric=metric))
        if len(auc) and auc["n_seeds"].sum():
            intervals = {f"steps {_window_label(w)}": {r.group: (r["mean"], r.ci_low, r.ci_high)
                                                     for _, r in auc[(auc.lo == w[0]) & (auc.hi == w[1])].iterrows()
                                                     if r.n_seeds}
                         for w in reached}
            written.append(figs.auc_forest(intervals, out_dir / "auc_forest.png", metric=metric))
        if lambda_curves:
            written.append(figs.sepa_lambda_curves(lambda_curves, out_dir / "sepa_lambda.png"))
        for label, (tok, kind) in token_samples.items():
            written.append(figs.uncertainty_histograms(
                tok["exec_before"], tok["plan_before"], tok["exec_after"], tok["plan_after"],
                out_dir / f"uncertainty_hist_{_slug(label)}.png", kind=kind, title=f"{label}: {kind}"))

    markdown, headline = _render(meta, metric, k, base, tables, issues, reached, skipped, written, out_dir,
                                 notes, len(runs), sum(r.started for r in runs))
    (out_dir / "report.md").write_text(markdown)
    return Report(markdown=markdown, headline=headline, tables=tables, figures=written, missing=issues,
                  out_dir=out_dir, metric=metric, step=k, baseline=base.label if base else None,
                  groups=[g.label for g in groups], skipped_windows=skipped)
