"""The report's staleness section: for campaigns whose runs sampled ahead of the learner (`rollout.mode: async`,
docs/guides/staleness.md), what staleness did to the batch each arm trained on.

Per group (condition + sweep values): the share of trained tokens at each staleness (the histogram summed over
steps and seeds), their mean staleness, the mismatch KL (`mismatch/k3`, mean over steps), the groups dropped past
the bound (`discard`) and delayed in the queue per step, and the composition of what was trained against what
was offered by completion length: the mean trained completion length over the offered one (`len ratio`, 1 when
the trained batch is the offered one). The trained batch is the offered one less the groups admission dropped and
less the uninformative groups (rewards all equal) every mode leaves out, so a run that drops nothing is near 1,
not at it; the paired difference by seed against the synchronous arm (paced max_staleness 0, or a sync
condition), with its t interval, is what isolates admission. Runs that logged no `async/*` key (sync,
one_step_off) count as staleness 0 with nothing dropped or delayed only when another arm is async; their trained
length is their trained tokens over their kept groups' sequences (`train/tokens_trained` over
`train/groups_kept` x `rollout.n`: the same number `async/completion_len_trained` logs), so a sync arm and the
async paced k = 0 arm that trains the same batches get the same ratio.

The composition by problem difficulty and by task: every async row counts its offered and trained groups by
difficulty (`async/{offered,trained}_by_difficulty/{hard,easy}`: hard when the problem's pass rate is below one
half: the starting policy's, from `rollout.difficulty_samples` samples of each problem with the base model, the
same in every arm of a seed, where the trial measured it; else the group's own n samples' under the policy that
sampled it, which is older, so likelier hard, in a staler arm: the table's `hard by` says which) and, in a mixed
task, by member (`async/..._by_source/<label>`).
Per run, `hard ratio` is the hard groups' share of the trained groups over their share of the offered ones,
summed over the steps, and `<label> ratio` the same for each member: 1 when admission trained the offered mix,
below 1 when it trained fewer of them. Uninformative groups (all correct or all wrong) are offered and never
trained in any arm, so even the synchronous arm is off 1; the paired difference by seed against the synchronous
arm (with its t interval) is what admission did. A `mode: sync` arm logs no composition counts: use async with
max_staleness 0 (paced) as the synchronous arm to get these differences.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np
import pandas as pd

from orchestrator.report.load import Group, Run
from orchestrator.stats.paired import paired_comparison

HIST = re.compile(r"^async/staleness_tokens_(\d+)$")
SOURCE = re.compile(r"^async/offered_by_source/(.+)$")


def applies(groups: Sequence[Group]) -> bool:
    """Whether any run sampled ahead (logged the async rows)."""
    return any(r.started and "async/groups_offered" in r.data for g in groups for r in g.runs)


def _sum(run: Run, key: str) -> float:
    return float(run.series(key)[1].sum())


def _mean(run: Run, key: str) -> float:
    v = run.series(key)[1]
    return float(v.mean()) if v.size else float("nan")


def _trained_len(run: Run) -> tuple[np.ndarray, np.ndarray] | None:
    """(steps, mean trained completion length) over the steps that trained; None when the run logs neither
    `async/completion_len_trained` nor what a sync row computes it from (its kept groups and `rollout.n`)."""
    if "async/completion_len_trained" in run.data:
        return run.series("async/completion_len_trained")
    try:
        n = int((run.config.get("rollout") or {})["n"])
    except (KeyError, TypeError, ValueError):
        return None
    if "train/groups_kept" not in run.data or "train/tokens_trained" not in run.data or n < 1:
        return None
    s_k, kept = run.series("train/groups_kept")
    s_t, tokens = run.series("train/tokens_trained")
    tok = dict(zip(s_t.tolist(), tokens.tolist(), strict=True))
    pairs = [(s, tok[s] / (k * n)) for s, k in zip(s_k.tolist(), kept.tolist(), strict=True) if k > 0 and s in tok]
    return np.array([s for s, _ in pairs]), np.array([x for _, x in pairs])


def _len_ratio(run: Run) -> float:
    """Trained over offered completion length, averaged over the steps that trained (module doc: near 1 for a
    run that never dropped; 1 when the run's rows say nothing of its kept groups)."""
    trained_len = _trained_len(run)
    if trained_len is None:
        return 1.0
    s_t, trained = trained_len
    s_o, offered = run.series("train/completion_len")
    lookup = dict(zip(s_o.tolist(), offered.tolist(), strict=True))
    ratios = [t / lookup[s] for s, t in zip(s_t.tolist(), trained.tolist(), strict=True) if lookup.get(s)]
    return float(np.mean(ratios)) if ratios else float("nan")


def _share_ratio(run: Run, kind: str, name: str) -> float:
    """`name`'s share of the run's trained groups over its share of the offered ones (`kind`: difficulty or
    source; module doc); NaN when the run logs no such counts or trained / offered nothing of the kind."""
    keys = [k for k in run.data if k.startswith(f"async/offered_by_{kind}/")]
    if f"async/offered_by_{kind}/{name}" not in keys:
        return float("nan")
    names = [k.rsplit("/", 1)[1] for k in keys]
    off = {n: _sum(run, f"async/offered_by_{kind}/{n}") for n in names}
    tr = {n: _sum(run, f"async/trained_by_{kind}/{n}") if f"async/trained_by_{kind}/{n}" in run.data else 0.0
          for n in names}
    if not sum(off.values()) or not sum(tr.values()) or not off[name]:
        return float("nan")
    return (tr[name] / sum(tr.values())) / (off[name] / sum(off.values()))


def _composition_columns(groups: Sequence[Group]) -> list[tuple[str, str, str]]:
    """(column, kind, name) of the composition ratios some run logs: hard problems, then each mix member."""
    keys = {k for g in groups for r in g.runs if r.started for k in r.data}
    cols = [("hard_ratio", "difficulty", "hard")] if "async/offered_by_difficulty/hard" in keys else []
    sources = sorted({m.group(1) for k in keys if (m := SOURCE.match(k))})
    return cols + [(f"{s}_ratio", "source", s) for s in sources]


def _hist(run: Run) -> dict[int, float]:
    if "async/groups_offered" not in run.data:  # a sync / one_step_off run: its trained tokens at its staleness
        return {int(_mean(run, "rollout/staleness")) if "rollout/staleness" in run.data else 0:
                _sum(run, "train/tokens_trained")}
    return {int(m.group(1)): _sum(run, k) for k in run.data if (m := HIST.match(k))}


def _finite_mean(xs: list[float]) -> float:
    ok = [x for x in xs if np.isfinite(x)]
    return float(np.mean(ok)) if ok else float("nan")


def _is_sync(g: Group) -> bool:
    ro = (g.runs[0].config.get("rollout") or {}) if g.runs else {}
    # async k = 0 is the sync trial only when paced (discard at k = 0 drops every other batch)
    return ro.get("mode") == "sync" or (ro.get("mode") == "async" and ro.get("max_staleness") == 0
                                        and ro.get("admission", "paced") == "paced")


def _difficulty_by(runs: Sequence[Run]) -> str:
    """What the runs' difficulty bins measure: the starting policy's pass rate (`rollout.difficulty_samples`
    samples of each problem) or each group's own under the policy that sampled it."""
    ms = {(r.config.get("rollout") or {}).get("difficulty_samples") for r in runs}
    if ms == {None}:
        return "own samples"
    return "starting policy, " + "/".join(str(m) for m in sorted(m for m in ms if m)) + " samples" + (
        " (some runs: own samples)" if None in ms else "")


def table(groups: Sequence[Group]) -> pd.DataFrame:
    """One row per group (module doc); empty when no run sampled ahead."""
    if not applies(groups):
        return pd.DataFrame()
    base = next((g for g in groups if _is_sync(g)), None)
    base_ratio = {r.seed: _len_ratio(r) for r in base.runs if r.started} if base is not None else {}
    comp = _composition_columns(groups)
    base_comp = {col: {r.seed: _share_ratio(r, kind, name) for r in base.runs if r.started}
                 for col, kind, name in comp} if base is not None else {}
    rows = []
    for g in groups:
        runs = [r for r in g.runs if r.started]
        if not runs:
            continue
        hist: dict[int, float] = {}
        for r in runs:
            for j, n in _hist(r).items():
                hist[j] = hist.get(j, 0.0) + n
        total = sum(hist.values())
        row = {"group": g.label, "condition": g.condition, "n_seeds": len(runs),
               **{f"tokens_at_{j}": hist[j] / total if total else float("nan") for j in sorted(hist)},
               "staleness_mean": sum(j * n for j, n in hist.items()) / total if total else float("nan"),
               "mismatch_k3": _finite_mean([_mean(r, "mismatch/k3") for r in runs]),
               "dropped_per_step": float(np.mean([_mean(r, "async/groups_dropped") if "async/groups_dropped"
                                                  in r.data else 0.0 for r in runs])),
               "delayed_per_step": float(np.mean([_mean(r, "async/groups_delayed") if "async/groups_delayed"
                                                  in r.data else 0.0 for r in runs])),
               "len_ratio": _finite_mean([_len_ratio(r) for r in runs]),
               "difficulty_by": _difficulty_by(runs)}
        if base is not None and g is not base:
            pairs = [(base_ratio[r.seed], _len_ratio(r)) for r in runs if r.seed in base_ratio]
            cmp = paired_comparison([a for a, _ in pairs], [b for _, b in pairs], bootstrap=False)
            row.update({"len_ratio_delta": cmp.delta, "delta_lo": cmp.ci_low, "delta_hi": cmp.ci_high})
        for col, kind, name in comp:
            mine = {r.seed: _share_ratio(r, kind, name) for r in runs}
            row[col] = _finite_mean(list(mine.values()))
            if base is not None and g is not base:
                pairs = [(base_comp[col][s], v) for s, v in mine.items() if s in base_comp[col]]
                cmp = paired_comparison([a for a, _ in pairs], [b for _, b in pairs], bootstrap=False)
                row.update({f"{col}_delta": cmp.delta if cmp.n else float("nan"), f"{col}_lo": cmp.ci_low,
                            f"{col}_hi": cmp.ci_high})
        rows.append(row)
    if not rows:
        return pd.DataFrame()
    df = pd.DataFrame(rows)
    # staleness.csv: the histogram's bins together and in order (groups with a smaller k lack the higher bins, so
    # the frame's first-seen order scattered them among the other columns)
    hist = sorted((c for c in df.columns if c.startswith("tokens_at_")), key=lambda c: int(c.rsplit("_", 1)[1]))
    lead = ["group", "condition", "n_seeds"]
    return df[lead + hist + [c for c in df.columns if c not in lead and c not in hist]]


def markdown(df: pd.DataFrame) -> list[str]:
    if not len(df):
        return []
    hist_cols = sorted((c for c in df.columns if c.startswith("tokens_at_")), key=lambda c: int(c.rsplit("_", 1)[1]))

    def f(x, fmt: str = "{:.3g}") -> str:
        return "n/a" if x is None or not np.isfinite(x) else fmt.format(x)

    head = ["group", "seeds", *[f"staleness {c.rsplit('_', 1)[1]}" for c in hist_cols], "mean", "mismatch k3",
            "dropped / step", "delayed / step", "len ratio", "vs sync"]
    md = ["", "## Staleness", "",
          "Per group: the share of trained tokens at each staleness (policy versions behind the learner), their "
          "mean, the mismatch KL(pi_behav || pi_prox) (k3, mean over steps), groups dropped past the bound and "
          "delayed in the queue per step, and the trained batch's mean completion length over the offered one "
          "(`len ratio`; 1: what was trained is what was offered; the uninformative groups every arm leaves out "
          "move it off 1 without any drop). `vs sync`: the paired difference by seed of the length ratio against "
          "the synchronous arm, with its 95% t interval: what admission changed.", "",
          "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for _, r in df.iterrows():
        delta = "" if "len_ratio_delta" not in r or not np.isfinite(r.get("len_ratio_delta", np.nan)) else \
            f"{r.len_ratio_delta:+.3f} [{f(r.delta_lo, '{:+.3f}')}, {f(r.delta_hi, '{:+.3f}')}]"
        md.append("| " + " | ".join([str(r.group), str(r.n_seeds), *[f(r[c], "{:.1%}") for c in hist_cols],
                                     f(r.staleness_mean, "{:.2f}"), f(r.mismatch_k3), f(r.dropped_per_step, "{:.2f}"),
                                     f(r.delayed_per_step, "{:.2f}"), f(r.len_ratio, "{:.3f}"), delta]) + " |")
    comp = [c[:-len("_ratio")] for c in df.columns if c.endswith("_ratio") and c != "len_ratio"]
    if not comp:
        return md
    by = "difficulty_by" in df.columns and "hard" in comp
    head = ["group", "seeds", "len ratio", *[f"{c} ratio" for c in comp], *(["hard by"] if by else [])]
    md += ["", "Composition of the trained groups against the offered ones: `len ratio` as above; `hard ratio`: the "
           "share of hard problems (pass rate below one half) among the trained groups over their share among the "
           "offered ones, the pass rate being (`hard by`) the starting policy's on `rollout.difficulty_samples` "
           "samples of each problem, the same in every arm of a seed, or each group's own under the policy that "
           "sampled it, which is older in a staler arm and so likelier hard there; `<member> ratio`: the same "
           "for each member of a mixed task. 1: trained as offered; the uninformative groups every arm leaves out "
           "move every arm off 1. In brackets: the paired difference by seed against the synchronous arm, with "
           "its 95% t interval.", "",
           "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]

    def cell(r, col: str, fmt: str = "{:.3f}") -> str:
        val = f(r.get(col, np.nan), fmt)
        d = r.get(f"{col}_delta" if col != "len_ratio" else "len_ratio_delta", np.nan)
        if d is None or not np.isfinite(d):
            return val
        lo, hi = (r.get(f"{col}_lo"), r.get(f"{col}_hi")) if col != "len_ratio" else (r.get("delta_lo"),
                                                                                        r.get("delta_hi"))
        return f"{val} ({d:+.3f} [{f(lo, '{:+.3f}')}, {f(hi, '{:+.3f}')}])"

    for _, r in df.iterrows():
        md.append("| " + " | ".join([str(r.group), str(r.n_seeds), cell(r, "len_ratio"),
                                     *[cell(r, f"{c}_ratio") for c in comp],
                                     *([str(r.difficulty_by)] if by else [])]) + " |")
    return md
