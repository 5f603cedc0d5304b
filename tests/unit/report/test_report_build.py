"""Campaign report end to end on synthetic campaign directories written in the test."""

from __future__ import annotations

import json
import math
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from orchestrator.report import ReportOptions, build_report
from orchestrator.report.build import CSV_FILES

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _curve(step: np.ndarray) -> np.ndarray:
    return 0.30 + 0.12 * (1.0 - np.exp(-step / 8.0))


def write_campaign(root: Path, *, effects: dict[str, float], seeds=range(6), steps: int = 16,
                   rng_seed: int = 0, step_noise: float = 0.01, pair_noise: float = 0.01,
                   sepa: tuple[str, ...] = (), kind: str = "surprisal", eval_every: int | None = None,
                   rows: dict[str, int] | None = None, no_metrics: tuple[str, ...] = (),
                   not_started: tuple[str, ...] = (), sweeps: dict[str, list[dict]] | None = None,
                   npz: bool = False) -> Path:
    """A campaign dir in the storage layout. Condition c's curve is the shared curve + a seed offset shared by
    all conditions (what pairing removes) + effects[c] + a per-run offset (pair_noise) + per-step noise.
    rows: trial name -> rows actually written (short trials)."""
    rng = np.random.default_rng(rng_seed)
    seeds = list(seeds)
    seed_offset = {s: rng.normal(0, 0.03) for s in seeds}
    trials = []
    for cond, delta in effects.items():
        for sweep in (sweeps or {}).get(cond, [{}]):
            for s in seeds:
                tag = "".join(f"_{k.split('.')[-1]}{v}" for k, v in sweep.items())
                mode = "gtpo_sepa" if cond in sepa else "none"
                config = {"steps": steps, "rollout": {"prompts_per_step": 16, "n": 16},
                          "credit": {"transform_mode": mode, "uncertainty_kind": kind}}
                trials.append({"name": f"{cond}{tag}_s{s}", "condition": cond, "seed": s, "sweep": sweep,
                               "config": config, "_delta": delta, "_sepa": cond in sepa})
    root.mkdir(parents=True, exist_ok=True)
    (root / "campaign.json").write_text(json.dumps({
        "name": "synthetic", "campaign_id": "abc123",
        "trials": [{k: v for k, v in t.items() if not k.startswith("_")} for t in trials]}))
    for t in trials:
        name = t["name"]
        run_offset = rng.normal(0, pair_noise)
        step = np.arange(steps)
        correct = _curve(step) + seed_offset[t["seed"]] + t["_delta"] + run_offset + rng.normal(0, step_noise, steps)
        if name in not_started:
            continue
        tdir = root / "trials" / name
        tdir.mkdir(parents=True)
        if name in no_metrics:
            continue
        n_rows = (rows or {}).get(name, steps)
        lines = []
        for k in range(n_rows):
            lam = max(0.0, (k - 2) / 100.0) if t["_sepa"] else 0.0
            row = {"step": k, "train/correct_rate": float(correct[k]), "credit/sepa_lambda": lam,
                   "loss": 0.1, f"credit/exec_{kind}_var": 0.6, f"credit/plan_{kind}_var": 0.7,
                   f"credit/exec_{kind}_var_after": 0.6 * (1 - lam), f"credit/plan_{kind}_var_after": 0.7}
            if eval_every and k % eval_every == 0:
                row["eval/pass@1"] = float(correct[k]) + 0.05
                row["eval/pass@k"] = float(correct[k]) + 0.2
            lines.append(json.dumps(row))
        (tdir / "metrics.jsonl").write_text("\n".join(lines) + "\n")
        if npz and t["_sepa"]:
            udir = tdir / "uncertainty"
            udir.mkdir()
            for k in range(0, n_rows, 5):
                ex = rng.gamma(1.0, 0.7, 500).astype(np.float32)
                pl = rng.gamma(1.2, 0.6, 40).astype(np.float32)
                np.savez(udir / f"step_{k}.npz", exec_before=ex,
                         exec_after=np.full_like(ex, ex.mean()) + rng.normal(0, 0.05, ex.size).astype(np.float32),
                         plan_before=pl, plan_after=pl)
    return root


def _delta(report, group: str, measure: str) -> pd.Series:
    d = report.tables["deltas"]
    sel = d[(d.group == group) & (d.measure == measure)]
    assert len(sel) == 1, d
    return sel.iloc[0]


def test_planted_effect_is_detected_and_needs_fewer_seeds_as_it_grows(tmp_path):
    for i, effect in enumerate((0.02, 0.04)):
        rep = build_report(write_campaign(tmp_path / f"c{i}", effects={"C1": 0.0, "C2": effect}, seeds=range(8)),
                           ReportOptions(figures=False))
        assert rep.baseline == "C1" and rep.step == 15 and rep.missing == []
        assert rep.tables["power"].seeds_per_arm.isna().all()  # no effect of interest: no seeds claimed
        for measure in ("AUC 0-10", "AUC 0-15", "step 15"):
            row = _delta(rep, "C2", measure)
            primary = measure == "AUC 0-15"  # the default primary measure: the only family with a `*`
            assert row.ci_excludes_zero and row.ci_low > 0 and row.mark == ("*" if primary else ""), row
            assert row.role == ("primary" if primary else "exploratory")
            assert row.n_pairs == 8 and row.delta == pytest.approx(effect, abs=0.012)
            assert row.p_holm >= row.p_value
    # seeds per arm for an effect of interest fall as it grows
    camp = tmp_path / "c0"
    seeds_needed = []
    for interest in (0.005, 0.01, 0.02, 0.04):
        power = build_report(camp, ReportOptions(figures=False, effect=interest)).tables["power"]
        seeds_needed.append(int(power[(power.group == "C2") & (power.measure == "AUC 0-15")].seeds_per_arm.iloc[0]))
    assert seeds_needed == sorted(seeds_needed, reverse=True) and len(set(seeds_needed)) == 4, seeds_needed
    assert seeds_needed[-1] >= 3 and seeds_needed[0] > 10
    # generations per arm = seeds x (hi + 1) steps x 16 problems x 16 rollouts
    row = power.query("measure == 'AUC 0-15'").iloc[0]
    assert row.generations_per_arm == row.seeds_per_arm * 16 * 256
    assert row.current_generations_per_arm == 8 * 16 * 256


def test_no_effect_false_positive_rate_is_near_nominal(tmp_path):
    hits, total = 0, 0
    for i in range(40):
        rep = build_report(write_campaign(tmp_path / f"n{i}", effects={"C1": 0.0, "C2": 0.0}, seeds=range(10),
                                          steps=11, rng_seed=100 + i), ReportOptions(windows=((0, 10),), figures=False))
        row = _delta(rep, "C2", "AUC 0-10")
        hits += bool(row.ci_excludes_zero)
        total += 1
    # A 95% CI excludes zero ~5% of the time under the null (percentile bootstrap with 10 seeds: a bit more).
    # 40 campaigns: P(> 8 hits) is below 1% even at a true 8% rate.
    assert hits / total <= 0.2, hits


def test_running_and_partly_failed_campaign(tmp_path):
    camp = write_campaign(tmp_path / "run", effects={"C1": 0.0, "C2": 0.02, "C4": 0.01}, seeds=range(3), steps=20,
                          sepa=("C4",), rows={"C2_s1": 3, "C1_s2": 12}, no_metrics=("C4_s2",),
                          not_started=("C2_s2",))
    with (camp / "trials" / "C1_s0" / "metrics.jsonl").open("a") as fh:
        fh.write('{"step": 20, "train/corr')  # a partly written last line
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        rep = build_report(camp, ReportOptions(windows=((0, 10), (0, 15), (0, 50))))
    missing = {m.name: m.reason for m in rep.missing}
    assert set(missing) == {"C2_s1", "C1_s2", "C4_s2", "C2_s2", "C1_s0"}
    assert missing["C2_s2"].startswith("not started") and "no metrics.jsonl" in missing["C4_s2"]
    assert missing["C2_s1"].startswith("short: 3 of 20") and "unreadable" in missing["C1_s0"]
    assert rep.step == 2  # the latest step every started trial reached (C2_s1 stops at step 2)
    assert "step 2" in rep.markdown and "C2_s1" in rep.markdown and "C2_s2" in rep.markdown
    st = rep.tables["step_table"].set_index("group")
    assert st.loc["C1", "n_seeds"] == 3 and st.loc["C2", "n_seeds"] == 2 and st.loc["C4", "n_seeds"] == 2
    auc = rep.tables["auc"]
    assert set(zip(auc.lo, auc.hi, strict=True)) == {(0, 10), (0, 15)} and rep.skipped_windows == [(0, 50)]
    # window 0-10: C1 has 3 runs reaching it, C2 only s0 (s1 short, s2 not started)
    assert auc.query("group == 'C2' and hi == 10").n_seeds.iloc[0] == 1
    d = _delta(rep, "C2", "AUC 0-10")
    assert d.n_pairs == 1 and not d.ci_excludes_zero and math.isnan(d.p_value)
    assert "0-50" in rep.headline and "Skipped windows" in rep.markdown
    lam = rep.tables["sepa_lambda_max"]
    assert list(lam.group) == ["C4"] and lam.max_lambda.iloc[0] == pytest.approx(0.17)
    for name in CSV_FILES:
        assert (rep.out_dir / f"{name}.csv").is_file()
    assert (camp / "report" / "report.md").read_text() == rep.markdown


def test_empty_campaign_renders(tmp_path):
    camp = write_campaign(tmp_path / "empty", effects={"C1": 0.0, "C2": 0.0}, seeds=range(2),
                          not_started=("C1_s0", "C1_s1", "C2_s0", "C2_s1"))
    rep = build_report(camp)
    assert rep.step is None and len(rep.missing) == 4 and rep.figures == []
    assert rep.tables["step_table"].n_seeds.sum() == 0 and rep.skipped_windows == [(0, 10), (0, 15)]
    assert "not started" in rep.markdown


def test_figures_and_mechanistic_diagnostic(tmp_path):
    camp = write_campaign(tmp_path / "fig", effects={"C1": 0.0, "C4": 0.01}, seeds=range(3), sepa=("C4",),
                          kind="entropy", npz=True)
    rep = build_report(camp, ReportOptions(out_dir=tmp_path / "out"))
    names = {p.name for p in rep.figures}
    assert names == {"learning_curves.png", "auc_forest.png", "sepa_lambda.png", "uncertainty_hist_C4.png",
                     "trajectory_distance.png"}  # no decomposition.png: these trials log no credit/decomp_*
    import matplotlib.image as mpimg

    for p in rep.figures:
        assert p.parent == tmp_path / "out" and p.stat().st_size > 1000
        assert p.read_bytes()[:8] == PNG_MAGIC
        img = mpimg.imread(p)
        assert img.ndim == 3 and img.shape[0] > 100 and img.shape[1] > 100 and img.std() > 0
        assert f"]({p.name})" in rep.markdown
    mech = rep.tables["mechanistic"]
    assert set(mech.group) == {"C4"} and set(mech.kind) == {"entropy"}
    tok = mech[mech.source.str.startswith("tokens")].set_index("token_class")
    assert tok.loc["execution", "variance_reduction_pct"] > 90
    assert tok.loc["planning", "variance_reduction_pct"] == pytest.approx(0.0, abs=1e-9)
    assert tok.loc["execution", "n"] == 3 * 4 * 500  # 3 seeds x steps 0, 5, 10, 15 x 500 tokens
    met = mech[mech.source.str.startswith("metrics")].set_index("token_class")
    lam_mean = np.mean([max(0.0, (k - 2) / 100.0) for k in range(16)])
    assert met.loc["execution", "variance_reduction_pct"] == pytest.approx(100 * lam_mean)
    assert met.loc["planning", "var_before"] == pytest.approx(0.7)
    assert pd.read_csv(tmp_path / "out" / "mechanistic.csv").shape == mech.shape


def test_eval_metric_default_step_and_sweep_groups(tmp_path):
    sweeps = {c: [{"learner.loss.entropy_coeff": 0.0}, {"learner.loss.entropy_coeff": 0.01}] for c in ("C1", "C2")}
    camp = write_campaign(tmp_path / "ev", effects={"C1": 0.0, "C2": 0.03}, seeds=range(4), steps=16,
                          eval_every=5, sweeps=sweeps, rows={"C2_entropy_coeff0.01_s3": 14})
    rep = build_report(camp, ReportOptions(figures=False))
    assert rep.metric == "eval/pass@1"
    assert rep.step == 10  # every started trial reached step 13; the latest eval step <= 13 common to all is 10
    assert rep.groups == ["C1 [loss.entropy_coeff=0.0]", "C1 [loss.entropy_coeff=0.01]",
                          "C2 [loss.entropy_coeff=0.0]", "C2 [loss.entropy_coeff=0.01]"]
    assert rep.baseline == rep.groups[0]
    st = rep.tables["step_table"]
    assert (st.n_seeds == 4).all() and (st.step == 10).all()
    # eval windows need points at both ends: 0-10 is covered, 0-15 by every run except the short one
    auc = rep.tables["auc"]
    assert auc.query("hi == 15").n_seeds.tolist() == [4, 4, 4, 3]
    assert len(rep.tables["deltas"]) == 3 * 3  # 3 groups x (step, AUC 0-10, AUC 0-15)
    rep2 = build_report(camp, ReportOptions(metric="train/correct_rate", baseline="C2", step=7, figures=False))
    assert rep2.step == 7 and rep2.baseline == "C2 [loss.entropy_coeff=0.0]"
    assert (rep2.tables["step_table"].step == 7).all()
    with pytest.raises(ValueError, match="baseline"):
        build_report(camp, ReportOptions(baseline="C9", figures=False))
