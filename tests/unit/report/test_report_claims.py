"""The report's claims hold (issue 22): the `*` follows Holm within a measure's family, power comes from an effect
of interest, contrasts and main effects, AUC windows from the cadence with every dropped run listed, zero-variance
differences are never marked, units follow the metric's kind, and the CLI / campaign `report:` settings reach it.
Every expectation is checked against scipy / numpy on the same numbers."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from scipy import stats as sps
from scipy.integrate import trapezoid
from statsmodels.stats.multitest import multipletests

from orchestrator import cli
from orchestrator.campaign.expand import load_campaign
from orchestrator.config.errors import UserError
from orchestrator.report import ReportOptions, build_report
from orchestrator.stats.power import seeds_for_power

LEAN = {"C1": ("grpo", "none"), "C3": ("grpo", "gtpo_hicra"), "C4": ("grpo", "gtpo_sepa"),
        "C5": ("maxrl", "none"), "C8": ("maxrl", "gtpo_sepa")}


def write_runs(root: Path, curves: dict[tuple[str, int], np.ndarray], *, metric: str = "train/correct_rate",
               configs: dict[str, dict] | None = None, steps: int | None = None, eval_every: int | None = None,
               sweeps: dict[tuple[str, int], dict] | None = None) -> Path:
    """A campaign directory whose runs log exactly `curves[(condition, seed)]` (NaN: the row lacks the key;
    a shorter array: the run stopped there) at steps 0, 1, ... (or, for eval metrics, at the `eval_every`
    grid and the last step, as orchestrator.trial.loop does)."""
    trials = []
    root.mkdir(parents=True, exist_ok=True)
    for (cond, seed), curve in curves.items():
        sweep = (sweeps or {}).get((cond, seed), {})
        name = f"{cond}_s{seed}" + "".join(f"_{v}" for v in sweep.values())
        n_steps = steps or len(curve)
        config = {"steps": n_steps, "rollout": {"prompts_per_step": 4, "n": 4}, **(configs or {}).get(cond, {})}
        if eval_every:
            config["eval"] = {"every": eval_every}
        trials.append({"name": name, "condition": cond, "seed": seed, "sweep": sweep, "config": config})
        if eval_every:
            grid = sorted(set(range(0, n_steps, eval_every)) | {n_steps - 1})
        rows = []
        for k in range(len(curve) if not eval_every else n_steps):
            row = {"step": k, "loss": 0.1}
            if eval_every:
                if k in grid:
                    v = curve[grid.index(k)] if grid.index(k) < len(curve) else None
                    if v is None:
                        break
                    if math.isfinite(v):
                        row[metric] = float(v)
            elif math.isfinite(curve[k]):
                row[metric] = float(curve[k])
            rows.append(json.dumps(row))
        tdir = root / "trials" / name
        tdir.mkdir(parents=True)
        (tdir / "metrics.jsonl").write_text("\n".join(rows) + "\n")
    (root / "campaign.json").write_text(json.dumps({"name": "claims", "trials": trials}))
    return root


def _row(df: pd.DataFrame, **where) -> pd.Series:
    sel = df
    for k, v in where.items():
        sel = sel[sel[k] == v]
    assert len(sel) == 1, (where, df)
    return sel.iloc[0]


# --- the mark follows Holm within the measure's family -----------------------------------------------------------


def test_mark_follows_the_holm_adjusted_p_within_the_measure_family(tmp_path):
    base = np.array([0.30, 0.42, 0.35, 0.50, 0.38])
    diffs = {"C2": [0.020, 0.031, 0.008, 0.034, 0.012], "C3": [0.01, -0.02, 0.03, -0.01, 0.0],
             "C4": [-0.01, 0.02, 0.0, -0.03, 0.01], "C5": [0.02, -0.01, -0.02, 0.0, 0.01]}
    p = {c: sps.ttest_rel(base + np.array(d), base).pvalue for c, d in diffs.items()}
    assert 0.0125 < p["C2"] < 0.05  # raw p significant; Holm over 4 tests is not
    curves = {("C1", s): np.full(3, base[s]) for s in range(5)}
    curves |= {(c, s): np.full(3, base[s] + d[s]) for c, d in diffs.items() for s in range(5)}
    rep = build_report(write_runs(tmp_path / "c", curves), ReportOptions(windows=[], figures=False))
    d = rep.tables["deltas"]
    row = _row(d, group="C2")
    assert row.mark == ""  # raw p < 0.05, Holm-adjusted above: no mark
    assert set(d.measure) == {"step 2"} and (d.family == "step 2").all() and (d.family_size == 4).all()
    assert row.p_value == pytest.approx(p["C2"]) and row.ci_excludes_zero  # the raw CI excludes zero ...
    want = dict(zip(p, multipletests(list(p.values()), method="holm")[1], strict=True))
    for c in diffs:
        assert _row(d, group=c).p_holm == pytest.approx(want[c], rel=1e-9)
    assert row.p_holm > 0.05 and row.mark == ""  # ... and still no mark
    assert (d.mark == "").all()
    assert "Holm-adjusted p < 0.05 within the primary measure's family" in rep.markdown
    assert "Primary measure: **step 2**" in rep.markdown  # no AUC window: the default falls back to step k
    assert "(Holm) covers its 4 comparisons only" in rep.markdown
    # a clear effect keeps its mark after the adjustment
    curves |= {("C2", s): np.full(3, base[s] + 0.05 + 0.002 * s) for s in range(5)}
    d = build_report(write_runs(tmp_path / "c2", curves), ReportOptions(windows=[], figures=False)).tables["deltas"]
    assert _row(d, group="C2").mark == "*" and _row(d, group="C2").p_holm < 0.05


def test_below_three_seed_pairs_the_header_says_no_comparison_is_tested(tmp_path):
    curves = {(c, s): np.full(3, 0.3 + 0.1 * s + 0.05 * (c == "C2")) for c in ("C1", "C2") for s in range(2)}
    rep = build_report(write_runs(tmp_path / "c", curves), ReportOptions(windows=[], figures=False))
    assert (rep.tables["deltas"].family_size == 0).all()
    assert "(Holm) covers no comparison: none has the 3 seed pairs a test needs, so none carries a `*`" in rep.markdown


# --- zero variance ----------------------------------------------------------------------------------------------


def test_zero_variance_differences_are_reported_as_such_and_never_marked(tmp_path):
    base = [0.3, 0.4, 0.5, 0.6]
    curves = {("C1", s): np.full(4, base[s]) for s in range(4)}
    curves |= {("C2", s): np.full(4, base[s] + 0.05) for s in range(4)}  # every seed: exactly +5pp
    curves |= {("C3", s): np.full(4, base[s] + 0.01 * s) for s in range(4)}
    rep = build_report(write_runs(tmp_path / "c", curves), ReportOptions(windows=[], figures=False))
    row = _row(rep.tables["deltas"], group="C2")
    assert row.mark == "" and not row.ci_excludes_zero
    assert row.zero_variance
    assert math.isnan(row.p_value) and math.isnan(row.ci_low) and math.isnan(row.p_holm)
    assert row.delta == pytest.approx(0.05) and row.note.startswith("zero variance")
    assert row.family_size == 2  # counted in the family (as p = 1), so C3's adjustment is not smaller
    c3 = _row(rep.tables["deltas"], group="C3")
    assert c3.p_holm == pytest.approx(min(1.0, 2 * c3.p_value))
    assert "zero variance" in rep.markdown


# --- power from an effect of interest ---------------------------------------------------------------------------


def test_power_comes_from_the_effect_of_interest_not_the_observed_effect(tmp_path):
    rng = np.random.default_rng(0)
    base = rng.normal(0.4, 0.05, 6)
    noise = rng.normal(0, 0.01, 6)
    tables = []
    for i, planted in enumerate((0.0, 0.03)):  # same noise, different observed effects
        curves = {("C1", s): np.full(3, base[s]) for s in range(6)}
        curves |= {("C2", s): np.full(3, base[s] + planted + noise[s]) for s in range(6)}
        curves |= {("C3", s): np.full(3, base[s] - noise[s]) for s in range(6)}
        rep = build_report(write_runs(tmp_path / f"c{i}", curves),
                           ReportOptions(windows=[], figures=False, effect=0.01))
        tables.append(rep.tables["power"])
        row = _row(rep.tables["power"], group="C2")
        sd = np.std(noise, ddof=1)
        assert row.effect_of_interest == 0.01 and row.sd_diff == pytest.approx(sd)
        assert row.alpha == pytest.approx(0.05 / 2)  # Bonferroni over the 2 tests of the family
        assert row.seeds_per_arm == max(3, seeds_for_power(0.01, sd, 0.025, 0.8))
        assert "effect of interest" in rep.markdown
    assert tables[0].seeds_per_arm.tolist() == tables[1].seeds_per_arm.tolist()
    assert tables[0].power_now.tolist() == pytest.approx(tables[1].power_now.tolist())
    # no effect of interest: no seeds per arm at all; below three pairs: nothing either
    rep = build_report(tmp_path / "c1", ReportOptions(windows=[], figures=False))
    assert rep.tables["power"].seeds_per_arm.isna().all() and "No effect of interest" in rep.markdown
    curves = {(c, s): np.full(3, 0.3 + 0.01 * s + (c == "C2") * 0.02 * s) for c in ("C1", "C2") for s in range(2)}
    rep = build_report(write_runs(tmp_path / "few", curves), ReportOptions(windows=[], figures=False, effect=0.01))
    assert rep.tables["power"].seeds_per_arm.isna().all() and rep.tables["power"].mde_at_current_seeds.isna().all()


# --- contrasts and main effects ---------------------------------------------------------------------------------


def test_contrasts_and_factorial_main_effects(tmp_path):
    rng = np.random.default_rng(1)
    effect = {"C1": 0.0, "C3": 0.01, "C4": 0.03, "C5": 0.02, "C8": 0.06}
    seed_shift = rng.normal(0, 0.03, 4)
    finals = {(c, s): 0.4 + seed_shift[s] + e + rng.normal(0, 0.005) for c, e in effect.items() for s in range(4)}
    curves = {k: np.full(3, v) for k, v in finals.items()}
    configs = {c: {"credit": {"advantage_mode": a, "transform_mode": t}} for c, (a, t) in LEAN.items()}
    rep = build_report(write_runs(tmp_path / "c", curves, configs=configs), ReportOptions(windows=[], figures=False,
                       contrasts=["C4-C3", "C8-C5"]))
    d = rep.tables["deltas"]
    assert d.kind.tolist() == ["vs baseline"] * 4 + ["contrast"] * 2 + ["main effect"] * 2
    x = {c: np.array([finals[(c, s)] for s in range(4)]) for c in LEAN}
    c43 = _row(d, group="C4-C3")
    assert c43.baseline == "C3" and c43.p_value == pytest.approx(sps.ttest_rel(x["C4"], x["C3"]).pvalue)
    adv = d[d.group.str.startswith("main effect advantage")].iloc[0]
    per_seed = ((x["C5"] - x["C1"]) + (x["C8"] - x["C4"])) / 2  # C3 has no MaxRL twin: left out
    assert "maxrl - grpo" in adv.group and adv.delta == pytest.approx(per_seed.mean())
    assert adv.p_value == pytest.approx(sps.ttest_1samp(per_seed, 0).pvalue)
    tr = d[d.group.str.startswith("main effect transform")].iloc[0]
    assert "gtpo_sepa - none" in tr.group
    assert tr.delta == pytest.approx((((x["C4"] - x["C1"]) + (x["C8"] - x["C5"])) / 2).mean())
    assert (d.family_size == 8).all()
    with pytest.raises(ValueError, match="contrast"):
        build_report(tmp_path / "c", ReportOptions(windows=[], figures=False, contrasts=["C4-C9"]))


# --- AUC windows ------------------------------------------------------------------------------------------------


def test_auc_windows_follow_the_eval_cadence_and_dropped_runs_are_listed(tmp_path):
    # eval every 4 steps over 13 steps: steps 0, 4, 8, 12
    grid = np.array([0, 4, 8, 12])
    curves = {(c, s): 0.2 + 0.01 * grid + 0.01 * s + (c == "C2") * 0.005 for c in ("C1", "C2") for s in range(3)}
    curves[("C2", 1)] = np.array([0.2, np.nan, 0.3, 0.35])  # eval at step 4 was NaN
    curves[("C1", 2)] = curves[("C1", 2)][:3]  # stopped after step 8
    camp = write_runs(tmp_path / "c", curves, metric="eval/pass@1", steps=13, eval_every=4)
    rep = build_report(camp, ReportOptions(figures=False))
    assert set(rep.tables["auc"].window) == {"0-8", "0-12"} and rep.windows == [(0, 8), (0, 12)]
    dropped = rep.tables["auc_dropped"].set_index(["trial", "window"]).reason
    assert "interior step 4" in dropped[("C2_s1", "0-8")] and "interior step 4" in dropped[("C2_s1", "0-12")]
    assert dropped[("C1_s2", "0-12")].startswith("no value at step 12")
    assert len(dropped) == 3
    assert "`C2_s1`, steps 0-8: no value at interior step 4" in rep.markdown
    auc = rep.tables["auc_runs"].set_index(["trial", "window"]).auc
    assert auc[("C1_s0", "0-12")] == pytest.approx(trapezoid(curves[("C1", 0)], grid) / 12)
    # interpolation only when asked
    rep = build_report(camp, ReportOptions(figures=False, interpolate=True))
    auc = rep.tables["auc_runs"].set_index(["trial", "window"]).auc
    assert auc[("C2_s1", "0-8")] == pytest.approx(trapezoid([0.2, 0.3], [0, 8]) / 8)
    assert len(rep.tables["auc_dropped"]) == 1
    # windows from the campaign
    rep = build_report(camp, ReportOptions(figures=False, windows=[(4, 12)]))
    assert set(rep.tables["auc"].window) == {"4-12"}


# --- units ------------------------------------------------------------------------------------------------------


def test_units_follow_the_metric_kind_not_its_values(tmp_path):
    curves = {(c, s): np.full(3, 0.12 + 0.01 * s + (c == "C2") * 0.01) for c in ("C1", "C2") for s in range(3)}
    rep = build_report(write_runs(tmp_path / "l", curves, metric="loss/total"), ReportOptions(metric="loss/total",
                       windows=[], figures=False))
    assert "| C1 | 3 | 0.13 |" in rep.markdown and "%" not in rep.markdown.split("## Step")[1].split("##")[0]
    rep = build_report(write_runs(tmp_path / "h", curves, metric="policy/entropy_mean"),
                       ReportOptions(metric="policy/entropy_mean", windows=[], figures=False))
    assert "0.13 nats" in rep.markdown
    rep = build_report(write_runs(tmp_path / "r", curves), ReportOptions(windows=[], figures=False))
    assert "13.0%" in rep.markdown


# --- the campaign's `report:` settings and the CLI --------------------------------------------------------------


def test_campaign_report_settings_and_cli_flags(tmp_path, capsys):
    store = tmp_path / "store"
    rng = np.random.default_rng(2)
    curves = {(c, s): np.full(16, 0.3 + 0.02 * s + rng.normal(0, 0.01)) for c in ("C1", "C2", "C3")
              for s in range(3)}
    write_runs(store / "syn", curves)
    spec = {"name": "syn", "seeds": [0, 1, 2], "conditions": {"C1": {}, "C2": {}, "C3": {}}, "storage": str(store),
            "base": {"steps": 16},
            "report": {"effect_of_interest": 0.02, "contrasts": ["C3-C2"], "auc_windows": [[0, 12]],
                       "primary": "auc_4_12"}}
    f = tmp_path / "syn.yaml"
    f.write_text(yaml.safe_dump(spec))
    assert cli.main(["report", str(f), "--out", str(tmp_path / "o1")]) == 0
    power = pd.read_csv(tmp_path / "o1" / "power.csv")
    deltas = pd.read_csv(tmp_path / "o1" / "deltas.csv")
    assert (power.effect_of_interest == 0.02).all() and "C3-C2" in set(deltas.group)
    assert set(pd.read_csv(tmp_path / "o1" / "auc.csv").window) == {"0-12", "4-12"}  # the primary is computed
    assert set(deltas[deltas.role == "primary"].measure) == {"AUC 4-12"}
    assert (deltas[deltas.role == "exploratory"].mark.isna()).all()  # "" reads back as NaN
    assert "Primary measure: **AUC 4-12** (report.primary: auc_4_12)" in (tmp_path / "o1" / "report.md").read_text()
    assert cli.main(["report", str(f), "--out", str(tmp_path / "o2"), "--effect", "0.05"]) == 0
    assert (pd.read_csv(tmp_path / "o2" / "power.csv").effect_of_interest == 0.05).all()
    capsys.readouterr()
    spec["report"]["contrasts"] = ["C3-C9"]
    f.write_text(yaml.safe_dump(spec))
    with pytest.raises(UserError, match=r"report\.contrasts\[0\]: 'C3-C9'"):
        load_campaign(f)
    assert cli.main(["expand", str(f)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "report.contrasts[0]" in err and "Traceback" not in err
