"""The report's tables, computed from the loaded runs: the step-k table, the AUC tables (with every run dropped
from a window and why), the paired comparisons (baseline, contrasts, main effects; `comparisons`) with their
power analysis for the effect of interest, the SEPA lambda tables and the mechanistic diagnostic; also the
metric keys, statistics settings and CSV columns they use.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from orchestrator.report.claims.comparisons import Spec, mark_families
from orchestrator.report.load import Group, Run, load_tokens
from orchestrator.stats import paired as stats
from orchestrator.stats import power

TRAIN_METRIC, EVAL_METRIC, ENV_METRIC = "train/correct_rate", "eval/pass@1", "eval/success"
LAMBDA_KEY = "credit/sepa_lambda"
UNCERTAINTY_KINDS = ("surprisal", "entropy", "varentropy")
TOKEN_CLASSES = (("execution", "exec"), ("planning", "plan"))
CONFIDENCE, N_RESAMPLES, BOOT_SEED = 0.95, 10_000, 0
MIN_SEEDS, MIN_PAIRS = stats.MIN_SEEDS, stats.MIN_PAIRS
POWER_TARGET, ALPHA = 0.8, 0.05

COLUMNS: dict[str, list[str]] = {
    "step_table": ["group", "condition", "sweep", "metric", "step", "n_seeds", "mean", "std", "min", "max"],
    "auc": ["group", "condition", "sweep", "metric", "window", "lo", "hi", "n_seeds", "mean", "ci_low",
            "ci_high", "std", "ci_boot_low", "ci_boot_high"],
    "auc_runs": ["trial", "group", "seed", "window", "lo", "hi", "auc"],
    "auc_dropped": ["trial", "group", "seed", "window", "lo", "hi", "reason"],
    "deltas": ["kind", "group", "baseline", "measure", "family", "family_size", "role", "n_pairs", "seeds", "delta",
               "ci_low", "ci_high", "ci_excludes_zero", "zero_variance", "mark", "p_value", "p_holm", "note",
               "ci_boot_low", "ci_boot_high"],
    "power": ["kind", "group", "baseline", "measure", "n_pairs", "effect_of_interest", "sd_diff", "effect_size_dz",
              "alpha", "power_target", "power_now", "seeds_per_arm", "steps", "generations_per_step",
              "generations_per_arm", "current_generations_per_arm", "mde_at_current_seeds", "note"],
    "sepa_lambda": ["group", "step", "n_runs", "lambda_mean", "lambda_min", "lambda_max"],
    "sepa_lambda_max": ["group", "n_runs", "max_lambda", "at_step", "last_step"],
    "mechanistic": ["group", "source", "kind", "token_class", "n", "mean_before", "mean_after", "var_before",
                    "var_after", "variance_reduction_pct"],
}
CSV_FILES = ("step_table", "auc", "auc_runs", "auc_dropped", "deltas", "power", "sepa_lambda", "sepa_lambda_max",
             "mechanistic")


def default_metric(groups: Sequence[Group]) -> str:
    """eval/success for agentic campaigns, else eval/pass@1 when any trial logged it, else train/correct_rate."""
    if any(r.series(ENV_METRIC)[0].size for g in groups for r in g.runs):
        return ENV_METRIC
    for g in groups:
        for r in g.runs:
            if r.series(EVAL_METRIC)[0].size:
                return EVAL_METRIC
    return TRAIN_METRIC


def _is_sparse(runs: Sequence[Run], metric: str) -> bool:
    """Whether the metric is logged on only some steps (an eval metric)."""
    if metric.startswith("eval/"):
        return True
    return any(r.started and r.series(metric)[0].size < r.n_rows for r in runs)


def choose_step(runs: Sequence[Run], metric: str, step: int | None) -> int | None:
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


def step_table(groups: Sequence[Group], metric: str, k: int | None) -> tuple[pd.DataFrame, dict]:
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


def window_label(w: tuple[int, int]) -> str:
    return f"{w[0]}-{w[1]}"


def _grid(runs: Sequence[Run], metric: str) -> np.ndarray:
    """The steps `metric` is logged at: the union of the runs' planned steps (from their configs), else of the
    steps any run logged it at."""
    planned = [p for r in runs if (p := r.planned_steps(metric)) is not None]
    if planned:
        return np.unique(np.concatenate(planned))
    logged = [r.series(metric)[0] for r in runs if r.started]
    return np.unique(np.concatenate(logged)) if logged else np.zeros(0)


def default_windows(runs: Sequence[Run], metric: str) -> list[tuple[int, int]]:
    """AUC windows from the metric's logging cadence: from its first step to its last planned step, and to the
    logged step nearest two thirds of the way (an eval every 5 steps over 16 steps: 0-10 and 0-15)."""
    grid = _grid(runs, metric)
    if grid.size < 2:
        return []
    lo, hi = int(grid[0]), int(grid[-1])
    inner = grid[(grid > lo) & (grid < hi)]
    if not inner.size:
        return [(lo, hi)]
    mid = int(inner[np.argmin(np.abs(inner - (lo + 2 * (hi - lo) / 3)))])
    return [(lo, mid), (lo, hi)]


def auc_tables(groups: Sequence[Group], metric: str, windows: Sequence[tuple[int, int]], *,
                interpolate: bool = False):
    """Per run and window the normalized AUC, or the reason the run was dropped from the window (auc_dropped);
    per group the mean with a t CI over seeds. A run missing a step of its planned logging grid inside the
    window is dropped unless `interpolate`."""
    run_rows, group_rows, dropped, per_seed, skipped, reached = [], [], [], {}, [], []
    bounds = stats.metric_bounds(metric)  # the AUC of a rate is a rate
    fallback = _grid([r for g in groups for r in g.runs], metric)
    for w in windows:
        lo, hi = int(w[0]), int(w[1])
        values = {}
        for g in groups:
            values[g.label] = {}
            for r in g.runs:
                where = {"trial": r.name, "group": g.label, "seed": r.seed, "window": window_label((lo, hi)),
                         "lo": lo, "hi": hi}
                if not r.started:
                    dropped.append({**where, "reason": "no data (not started or no metrics.jsonl)"})
                    continue
                s, v = r.series(metric)
                if not s.size:
                    dropped.append({**where, "reason": f"never logged {metric}"})
                    continue
                grid = r.planned_steps(metric)
                auc, why = stats.window_auc(s, v, (lo, hi), grid=fallback if grid is None else grid,
                                            interpolate=interpolate)
                if math.isfinite(auc):
                    values[g.label][r.seed] = auc
                    run_rows.append({**where, "auc": auc})
                else:
                    dropped.append({**where, "reason": why})
        if not any(values[g.label] for g in groups):
            skipped.append((lo, hi))
            continue
        reached.append((lo, hi))
        per_seed[(lo, hi)] = values
        for g in groups:
            x = np.array(list(values[g.label].values()), dtype=float)
            ci = stats.group_ci(x, confidence=CONFIDENCE, bounds=bounds)  # NaN below MIN_SEEDS seeds
            boot = (stats.clip_interval(*stats.bootstrap_ci(x, confidence=CONFIDENCE, n_resamples=N_RESAMPLES,
                                                            seed=BOOT_SEED), bounds)
                    if x.size >= MIN_SEEDS else (math.nan, math.nan))
            group_rows.append({"group": g.label, "condition": g.condition, "sweep": g.sweep_text,
                               "metric": metric, "window": window_label((lo, hi)), "lo": lo, "hi": hi,
                               "n_seeds": int(x.size), "mean": float(np.mean(x)) if x.size else math.nan,
                               "ci_low": ci[0], "ci_high": ci[1], "std": _sd(x), "ci_boot_low": boot[0],
                               "ci_boot_high": boot[1]})
    return (pd.DataFrame(group_rows, columns=COLUMNS["auc"]), pd.DataFrame(run_rows, columns=COLUMNS["auc_runs"]),
            pd.DataFrame(dropped, columns=COLUMNS["auc_dropped"]), per_seed, reached, skipped)


def _power_row(spec: Spec, cmp: stats.PairedComparison, name: str, steps_used: int, gps: float,
               effect: float | None, alpha: float) -> dict:
    """Power for the effect of interest (never the observed effect) at the family's Bonferroni level `alpha`
    (Holm's first step), from the observed sd of paired differences; nothing below `MIN_PAIRS` pairs or at zero
    variance. The MDE is `power.stated_mde`: detected with `POWER_TARGET` over the campaigns that state it, the
    observed sd's own sampling error included (the plug-in MDE at the observed sd was detected in 62-64% at 3-4
    seeds)."""
    ok = cmp.n >= MIN_PAIRS and math.isfinite(cmp.sd_diff) and not cmp.zero_variance
    eff = float(effect) if effect is not None else math.nan
    dz = eff / cmp.sd_diff if ok and cmp.sd_diff > 0 else math.nan
    n_arm = power.seeds_for_power(eff, cmp.sd_diff, alpha, POWER_TARGET) if ok and effect is not None else math.nan
    n_arm = max(n_arm, MIN_PAIRS) if math.isfinite(n_arm) else n_arm  # the report claims nothing below
    note = cmp.note or ("" if effect is not None else
                                         "no effect of interest (report.effect_of_interest or --effect)")
    return {"kind": spec.kind, "group": spec.label, "baseline": spec.base_label, "measure": name,
            "n_pairs": cmp.n, "effect_of_interest": eff, "sd_diff": cmp.sd_diff, "effect_size_dz": dz,
            "alpha": alpha, "power_target": POWER_TARGET,
            "power_now": power.paired_t_power(cmp.n, dz, alpha) if math.isfinite(dz) else math.nan,
            "seeds_per_arm": n_arm, "steps": steps_used, "generations_per_step": gps,
            "generations_per_arm": power.generations_per_arm(n_arm, steps_used, gps, 1.0),
            "current_generations_per_arm": power.generations_per_arm(cmp.n, steps_used, gps, 1.0),
            "mde_at_current_seeds": power.stated_mde(cmp.n, cmp.sd_diff, alpha, POWER_TARGET) if ok else math.nan,
            "note": note}


def comparisons(groups: Sequence[Group], specs: Sequence[Spec], measures: list[tuple[str, int, dict]],
                 metric: str | None = None, *, effect: float | None = None, bootstrap: bool = True,
                 primary: str | None = None):
    """Deltas and power rows for every comparison `spec` and measure. `measures`: (name, steps consumed to
    reach the measure, {group label: {seed: value}}). `metric` (its name) clips the CIs of a bounded metric's
    differences to [-1, 1]. The `*` is Holm within the family of the measure named `primary` (none: no `*`);
    the other measures are exploratory (`comparisons.mark_families`). Below
    `MIN_PAIRS` pairs, or at zero variance, a delta has no CI, p-value or mark and says why."""
    delta_rows, power_rows = [], []
    bounds = stats.delta_bounds(metric) if metric else None
    gps_of = {g.label: next((r.generations_per_step for r in g.runs if math.isfinite(r.generations_per_step)),
                            math.nan) for g in groups}
    results = []
    for spec in specs:
        gps = gps_of.get(spec.other[0][0], math.nan)
        for name, steps_used, values in measures:
            seeds, b, o = spec.paired(values)
            cmp = stats.paired_comparison(b, o, confidence=CONFIDENCE, n_resamples=N_RESAMPLES, seed=BOOT_SEED,
                                          bounds=bounds, bootstrap=bootstrap)
            results.append((spec, name, steps_used, gps, cmp))
            delta_rows.append({"kind": spec.kind, "group": spec.label, "baseline": spec.base_label, "measure": name,
                               "n_pairs": cmp.n, "seeds": " ".join(map(str, seeds)), "delta": cmp.delta,
                               "ci_low": cmp.ci_low, "ci_high": cmp.ci_high, "ci_excludes_zero": cmp.excludes_zero,
                               "zero_variance": cmp.zero_variance, "p_value": cmp.p_value, "note": cmp.note,
                               "ci_boot_low": cmp.boot_low, "ci_boot_high": cmp.boot_high})
    deltas = pd.DataFrame(delta_rows, columns=[c for c in COLUMNS["deltas"]
                                               if c not in ("family", "family_size", "role", "mark", "p_holm")])
    deltas = mark_families(deltas, ALPHA, primary)[COLUMNS["deltas"]] if len(deltas) else pd.DataFrame(
        columns=COLUMNS["deltas"])
    size = dict(zip(deltas["family"], deltas["family_size"], strict=False)) if len(deltas) else {}
    for spec, name, steps_used, gps, cmp in results:
        alpha = ALPHA / max(1, int(size.get(name, 1)))
        power_rows.append(_power_row(spec, cmp, name, steps_used, gps, effect, alpha))
    return deltas, pd.DataFrame(power_rows, columns=COLUMNS["power"])


def sepa_tables(groups: Sequence[Group]) -> tuple[pd.DataFrame, pd.DataFrame, dict]:
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


def _detect_kind(group: Group) -> str | None:
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


def _reduction(before: float, after: float) -> float:
    return 100.0 * (1.0 - after / before) if math.isfinite(before) and before > 0 and math.isfinite(after) else math.nan


def mechanistic(campaign_dir: Path | str, groups: Sequence[Group]):
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
        tokens, n_files, problems = load_tokens(campaign_dir, g)
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
