"""The report's surprisal-vs-entropy section: how much of the per-token surprisal variance is the policy's own
uncertainty (entropy) and how much is sampling noise (surprisal - entropy), for execution and planning tokens,
and how much of the execution variance SEPA removes is noise.

Reads the learner's `credit/decomp_*` metrics (see `workers.credit.decomposition`): per step and token class
the token count n and the class's moments. Moments pool over steps (and runs) weighted by tokens
(`numpy.average(weights=n)`: the within-step sums of squares over all the class's tokens), and a share is a ratio
of pooled sums, `sum n Cov(S, N) / sum n Var(S)`, never a mean of per-step ratios (with a few near-deterministic
planning tokens a step's Var(S) is close to zero and its ratio anything). The varentropy estimator
`E[Var(N)] / (E[Var(H)] + E[Var(N)])` (on-policy, Var(N) estimates the mean varentropy) is bounded in [0, 1] and
given beside it. A share is NaN where the class has fewer than `MIN_TOKENS` tokens (per run, or per step for the
per-step table). Per group: the mean of the runs' pooled values with a 95% t interval over runs.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from orchestrator.report.load import Group, Run
from orchestrator.stats import paired as stats

PREFIX = "credit/decomp_"
MIN_TOKENS = 30  # fewer tokens of a class give no share (planning tokens can be rare)
MOMENTS = ("surprisal_var", "entropy_var", "noise_var", "cov", "entropy_part", "noise_part")
REMOVAL = ("surprisal_var_after", "removed", "removed_entropy", "removed_noise")
SHARES = ("noise_share", "noise_share_varentropy", "removed_noise_share")
STEP_COLUMNS = ["group", "step", "token_class", "n_runs", "tokens"] + list(MOMENTS) + list(REMOVAL) + list(SHARES)
SUMMARY_COLUMNS = (["group", "token_class", "n_runs", "n_steps", "tokens"] + list(MOMENTS) + list(REMOVAL)
                   + list(SHARES) + ["noise_share_ci_low", "noise_share_ci_high", "removed_noise_share_ci_low",
                                     "removed_noise_share_ci_high"])
CSV_FILES = ("decomposition_steps", "decomposition")


def _nanmean(x: Sequence[float]) -> float:
    """`numpy.nanmean`, NaN (without a warning) when nothing is finite."""
    x = np.asarray(x, dtype=float)
    return float(np.nanmean(x)) if np.isfinite(x).any() else math.nan


def _ratio(num: float, den: float) -> float:
    return num / den if math.isfinite(num) and math.isfinite(den) and den > 0 else math.nan


def pooled(n: np.ndarray, parts: dict[str, np.ndarray]) -> dict[str, float]:
    """Token-weighted moments of one class over rows (steps, or runs at a step) and the shares as ratios of
    pooled sums. `n`: tokens per row; `parts`: moment name -> per-row value (NaN where not logged; the removal
    parts only on SEPA steps). Shares are NaN below `MIN_TOKENS` tokens in all."""
    out: dict[str, float] = {}
    for k, v in parts.items():
        ok = np.isfinite(v) & (n > 0)
        out[k] = float(np.average(v[ok], weights=n[ok])) if ok.any() else math.nan
    enough = float(np.sum(n)) >= MIN_TOKENS
    get = out.get
    out["noise_share"] = _ratio(get("noise_part", math.nan), get("surprisal_var", math.nan)) if enough else math.nan
    out["noise_share_varentropy"] = (_ratio(get("noise_var", math.nan), get("entropy_var", math.nan)
                                            + get("noise_var", math.nan)) if enough else math.nan)
    out["removed_noise_share"] = (_ratio(get("removed_noise", math.nan), get("removed", math.nan))
                                  if enough and "removed" in parts else math.nan)
    return out


def _run_rows(r: Run, cls: str, keys: Sequence[str]) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]:
    """(steps, tokens per step, {part: values per step}) of one run and class."""
    steps, n = r.series(f"{PREFIX}{cls}_n")
    parts = {}
    for k in keys:
        s, v = r.series(f"{PREFIX}{cls}_{k}")
        parts[k] = np.array([v[s == x][-1] if np.any(s == x) else math.nan for x in steps])
    return steps, n, parts


def decomposition_tables(groups: Sequence[Group]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(per-step table pooled over the group's runs, per-group summary over runs) of the `credit/decomp_*`
    metrics; `tokens` is the class's tokens per step (steps) or per run (summary)."""
    step_rows, summary_rows = [], []
    for g in groups:
        runs = [r for r in g.runs if r.started and f"{PREFIX}exec_surprisal_var" in r.data]
        if not runs:
            continue
        for cls in ("exec", "plan"):
            keys = list(MOMENTS) + (list(REMOVAL) if cls == "exec" else [])
            per_run = [_run_rows(r, cls, keys) for r in runs]
            all_steps = sorted({int(x) for steps, _, _ in per_run for x in steps})
            if not all_steps:
                continue
            for s in all_steps:
                at = [(n[steps == s], {k: v[steps == s] for k, v in parts.items()}) for steps, n, parts in per_run
                      if np.any(steps == s)]
                n = np.concatenate([a for a, _ in at])
                row = pooled(n, {k: np.concatenate([p[k] for _, p in at]) for k in keys})
                step_rows.append({"group": g.label, "step": s, "token_class": cls, "n_runs": len(at),
                                  "tokens": float(n.sum()), **row})
            runs_pooled = [pooled(n, parts) for _, n, parts in per_run]
            summary = {"group": g.label, "token_class": cls, "n_runs": len(runs), "n_steps": len(all_steps),
                       "tokens": float(np.mean([n.sum() for _, n, _ in per_run]))}
            for k in list(keys) + list(SHARES):
                summary[k] = _nanmean([p.get(k, math.nan) for p in runs_pooled])
            for k in ("noise_share", "removed_noise_share"):
                summary[f"{k}_ci_low"], summary[f"{k}_ci_high"] = stats.group_ci(
                    [p.get(k, math.nan) for p in runs_pooled], bounds=None)
            summary_rows.append(summary)
    return (pd.DataFrame(step_rows, columns=STEP_COLUMNS), pd.DataFrame(summary_rows, columns=SUMMARY_COLUMNS))


def _pct(x: float) -> str:
    return "n/a" if not math.isfinite(x) else f"{100 * x:.1f}%"


def _g(x: float) -> str:
    return "n/a" if not math.isfinite(x) else f"{x:.4g}"


def _share(x: float, lo: float, hi: float) -> str:
    return _pct(x) + (f" [{100 * lo:.1f}, {100 * hi:.1f}]" if math.isfinite(lo) else "")


def markdown(summary: pd.DataFrame) -> list[str]:
    """The report section (markdown lines)."""
    md = ["", "## Surprisal vs entropy (sampling noise)", ""]
    if not len(summary):
        return md + ["No trial logged `credit/decomp_*` (set `credit.log_decomposition: true`)."]
    md += ["Per token, surprisal S = entropy H (the policy's own uncertainty over the full vocabulary) + noise "
           "N = S - H (which token the sampler happened to draw). Over a token class, exactly "
           "Var(S) = Var(H) + Var(N) + 2 Cov(H, N) = Cov(S, H) + Cov(S, N); *noise share* = Cov(S, N) / Var(S) as a "
           "ratio of token-weighted sums over the run's steps (not a mean of per-step ratios); *varentropy "
           "estimator* = Var(N) / (Var(H) + Var(N)), bounded in [0, 1]. SEPA pools execution surprisal linearly, so "
           "the variance it removes splits the same way (*removed, noise share*; steps with lambda > 0). Moments "
           f"(nats^2): token-weighted over steps, mean over runs; shares: mean over runs with a 95% t interval over "
           f"runs (from {stats.MIN_SEEDS} runs), n/a where a run has fewer than {MIN_TOKENS} tokens of the class. "
           "Tokens: per run, all steps.", "",
           "| Group | Class | Tokens | Var(S) | Var(H) | Var(N) | 2Cov(H,N) | Noise share [95% CI] | "
           "Varentropy estimator | Removed by SEPA | Removed: noise share [95% CI] |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]
    for _, r in summary.iterrows():
        ex = r.token_class == "exec"
        removed = r.get("removed", math.nan) if ex else math.nan
        rem_share = (_share(r.removed_noise_share, r.removed_noise_share_ci_low, r.removed_noise_share_ci_high)
                     if ex else "n/a")
        md.append(f"| {r.group} | {'execution' if ex else 'planning'} | {r.tokens:,.0f} | {_g(r.surprisal_var)} | "
                  f"{_g(r.entropy_var)} | {_g(r.noise_var)} | {_g(2 * r['cov'])} | "
                  f"{_share(r.noise_share, r.noise_share_ci_low, r.noise_share_ci_high)} | "
                  f"{_pct(r.noise_share_varentropy)} | {_g(removed)} | {rem_share} |")
    ex = summary[summary.token_class == "exec"]
    if len(ex):
        rem = ex.removed_noise_share.to_numpy(float)
        line = (f"Across groups, {_pct(_nanmean(ex.noise_share))} of the execution-token surprisal variance is "
                "sampling noise rather than the policy's own uncertainty")
        if np.isfinite(rem).any():
            line += f"; of the execution variance SEPA removes, {_pct(_nanmean(rem))} is noise"
        md += ["", line + "."]
    return md


def figure(steps: pd.DataFrame, path: Path | str) -> Path | None:
    """Three panels across training: (a) execution-token noise share per group (planning dashed), (b) the
    execution surprisal variance split into entropy part and noise part (all groups pooled), (c) for SEPA groups,
    the variance removed per step split into entropy and noise parts."""
    from orchestrator.report.render.figures import new_figure, save

    if not len(steps):
        return None
    fig, (a, b, c) = new_figure(15.0, 4.2, ncols=3)
    for i, (label, df) in enumerate(steps.groupby("group", sort=False)):
        color = f"C{i % 10}"
        ex, pl = df[df.token_class == "exec"], df[df.token_class == "plan"]
        a.plot(ex.step, ex.noise_share, color=color, label=f"{label} execution")
        if len(pl) and np.isfinite(pl.noise_share.to_numpy(float)).any():
            a.plot(pl.step, pl.noise_share, color=color, ls="--", alpha=0.7, label=f"{label} planning")
    a.axhline(1.0, color="grey", lw=0.6)
    a.axhline(0.0, color="grey", lw=0.6)
    a.set_title(f"(a) noise share of surprisal variance, Cov(S, S-H) / Var(S)\n(pooled over runs; steps with >= "
                f"{MIN_TOKENS} tokens of the class)", fontsize=10)
    a.set_xlabel("step")
    a.set_ylabel("share")
    a.legend(fontsize=6)
    a.grid(alpha=0.3)
    ex = steps[steps.token_class == "exec"].groupby("step")[["surprisal_var", "entropy_part", "noise_part"]].mean()
    b.stackplot(ex.index, ex.entropy_part.clip(lower=0), ex.noise_part.clip(lower=0),
                labels=["entropy part Cov(S, H)", "noise part Cov(S, S-H)"], colors=["tab:green", "tab:red"],
                alpha=0.6)
    b.plot(ex.index, ex.surprisal_var, color="k", lw=1.2, label="Var(S)")
    b.set_title("(b) execution-token surprisal variance\n(mean over groups)", fontsize=10)
    b.set_xlabel("step")
    b.set_ylabel("variance (nats^2)")
    b.legend(fontsize=7)
    b.grid(alpha=0.3)
    sepa = steps[(steps.token_class == "exec") & np.isfinite(steps.removed.to_numpy(float))]
    if len(sepa):
        for i, (label, df) in enumerate(sepa.groupby("group", sort=False)):
            color = f"C{i % 10}"
            c.plot(df.step, df.removed_noise, color=color, label=f"{label}: noise removed")
            c.plot(df.step, df.removed_entropy, color=color, ls=":", label=f"{label}: entropy removed")
        c.legend(fontsize=6)
    else:
        c.text(0.5, 0.5, "no SEPA step with lambda > 0", ha="center", va="center", transform=c.transAxes)
    c.set_title("(c) execution variance removed by SEPA\nsplit into noise and entropy parts", fontsize=10)
    c.set_xlabel("step")
    c.set_ylabel("variance removed (nats^2)")
    c.grid(alpha=0.3)
    return save(fig, path)
