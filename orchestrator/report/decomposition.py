"""The report's surprisal-vs-entropy section: how much of the per-token surprisal variance is the policy's own
uncertainty (entropy) and how much is sampling noise (surprisal - entropy), per step, for execution and planning
tokens, and how much of the execution variance SEPA removes is noise.

Reads the learner's `credit/decomp_*` metrics (see `workers.credit.decomposition`); groups without them are
skipped. Per step: mean over the group's runs; per group: mean over its steps and runs.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from orchestrator.report.load import _Group

PREFIX = "credit/decomp_"
MIN_TOKENS = 30  # a step's class moments from fewer tokens are too noisy to show (planning tokens can be rare)
PARTS = ("surprisal_var", "entropy_var", "noise_var", "cov", "entropy_part", "noise_part", "noise_share")
REMOVAL = ("surprisal_var_after", "removed", "removed_entropy", "removed_noise", "removed_noise_share")
STEP_COLUMNS = ["group", "step", "token_class", "n_runs", "tokens"] + list(PARTS) + list(REMOVAL)
SUMMARY_COLUMNS = ["group", "token_class", "n_runs", "n_steps", "tokens"] + list(PARTS) + list(REMOVAL)
CSV_FILES = ("decomposition_steps", "decomposition")


def _nanmean(x: np.ndarray) -> float:
    x = x[np.isfinite(x)]
    return float(x.mean()) if x.size else math.nan


def decomposition_tables(groups: Sequence[_Group]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(per-step table, per-group summary) of the `credit/decomp_*` metrics. A run's values at a step where its
    class had fewer than `MIN_TOKENS` tokens are left out (NaN); `tokens` is the mean token count per run."""
    step_rows, summary_rows = [], []
    for g in groups:
        runs = [r for r in g.runs if r.started and f"{PREFIX}exec_surprisal_var" in r.data]
        if not runs:
            continue
        for cls in ("exec", "plan"):
            keys = list(PARTS) + (list(REMOVAL) if cls == "exec" else [])
            per_key = {k: [r.series(f"{PREFIX}{cls}_{k}") for r in runs] for k in keys}
            counts = [dict(zip(*r.series(f"{PREFIX}{cls}_n"), strict=True)) for r in runs]
            for k in keys:  # drop steps with too few tokens of the class
                per_key[k] = [(st, np.where([counts[i].get(x, 0) >= MIN_TOKENS for x in st], v, np.nan))
                              for i, (st, v) in enumerate(per_key[k])]
            steps = sorted({int(s) for k in keys for st, _ in per_key[k] for s in st})
            if not steps:
                continue
            for s in steps:
                n = [c[s] for c in counts if s in c]
                row = {"group": g.label, "step": s, "token_class": cls, "n_runs": 0,
                       "tokens": float(np.mean(n)) if n else math.nan}
                for k in keys:
                    vals = np.array([v[st == s][-1] for st, v in per_key[k] if np.any(st == s)], dtype=float)
                    row[k] = _nanmean(vals)
                    row["n_runs"] = max(row["n_runs"], int(np.isfinite(vals).sum()))
                step_rows.append(row)
            summary = {"group": g.label, "token_class": cls, "n_runs": len(runs), "n_steps": len(steps),
                       "tokens": float(np.mean([sum(c.values()) for c in counts]))}
            for k in keys:  # mean over steps of each run, then over runs
                summary[k] = _nanmean(np.array([_nanmean(v) for _, v in per_key[k] if v.size], dtype=float))
            summary_rows.append(summary)
    return (pd.DataFrame(step_rows, columns=STEP_COLUMNS), pd.DataFrame(summary_rows, columns=SUMMARY_COLUMNS))


def _pct(x: float) -> str:
    return "n/a" if not math.isfinite(x) else f"{100 * x:.1f}%"


def _g(x: float) -> str:
    return "n/a" if not math.isfinite(x) else f"{x:.4g}"


def markdown(summary: pd.DataFrame) -> list[str]:
    """The report section (markdown lines)."""
    md = ["", "## Surprisal vs entropy (sampling noise)", ""]
    if not len(summary):
        return md + ["No trial logged `credit/decomp_*` (set `credit.log_decomposition: true`)."]
    md += ["Per token, surprisal S = entropy H (the policy's own uncertainty over the full vocabulary) + noise "
           "N = S - H (which token the sampler happened to draw). Over a token class, exactly "
           "Var(S) = Var(H) + Var(N) + 2 Cov(H, N) = Cov(S, H) + Cov(S, N); *noise share* = Cov(S, N) / Var(S). "
           "SEPA pools execution surprisal linearly, so the variance it removes splits the same way "
           "(*removed, noise share*; steps with lambda > 0). Mean over steps of each run, then over runs; steps where "
           f"a run had fewer than {MIN_TOKENS} tokens of the class are left out. Tokens: per run, all steps.", "",
           "| Group | Class | Tokens | Var(S) | Var(H) | Var(N) | 2Cov(H,N) | Noise share | Removed by SEPA | "
           "Removed: noise share |", "|---|---|---|---|---|---|---|---|---|---|"]
    for _, r in summary.iterrows():
        cls = "execution" if r.token_class == "exec" else "planning"
        removed = r.get("removed", math.nan) if r.token_class == "exec" else math.nan
        md.append(f"| {r.group} | {cls} | {r.tokens:,.0f} | {_g(r.surprisal_var)} | {_g(r.entropy_var)} | {_g(r.noise_var)} | "
                  f"{_g(2 * r['cov'])} | {_pct(r.noise_share)} | {_g(removed)} | "
                  f"{_pct(r.get('removed_noise_share', math.nan)) if r.token_class == 'exec' else 'n/a'} |")
    ex = summary[summary.token_class == "exec"]
    if len(ex):
        share = _nanmean(ex.noise_share.to_numpy(float))
        rem = ex[np.isfinite(ex.removed_noise_share.to_numpy(float))]
        line = (f"Across groups, {_pct(share)} of the execution-token surprisal variance is sampling noise "
                f"rather than the policy's own uncertainty")
        if len(rem):
            line += (f"; of the execution variance SEPA removes, {_pct(_nanmean(rem.removed_noise_share.to_numpy(float)))}"
                     " is noise")
        md += ["", line + "."]
    return md


def figure(steps: pd.DataFrame, path: Path | str) -> Path | None:
    """Three panels across training: (a) execution-token noise share per group (planning dashed), (b) the
    execution surprisal variance split into entropy part and noise part (all groups pooled), (c) for SEPA groups,
    the variance removed per step split into entropy and noise parts."""
    from orchestrator.report.figures import _new_figure, _save

    if not len(steps):
        return None
    fig, (a, b, c) = _new_figure(15.0, 4.2, ncols=3)
    for i, (label, df) in enumerate(steps.groupby("group", sort=False)):
        color = f"C{i % 10}"
        ex, pl = df[df.token_class == "exec"], df[df.token_class == "plan"]
        a.plot(ex.step, ex.noise_share, color=color, label=f"{label} execution")
        if len(pl) and np.isfinite(pl.noise_share.to_numpy(float)).any():
            a.plot(pl.step, pl.noise_share, color=color, ls="--", alpha=0.7, label=f"{label} planning")
    a.axhline(1.0, color="grey", lw=0.6)
    a.axhline(0.0, color="grey", lw=0.6)
    a.set_title(f"(a) noise share of surprisal variance, Cov(S, S-H) / Var(S)\n(steps with >= {MIN_TOKENS} tokens "
                "of the class)", fontsize=10)
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
    return _save(fig, path)
