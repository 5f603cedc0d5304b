"""The report's sweep panels on synthetic agentic campaigns: success against the swept value (seed 004's
Figure 3), final value and AUC with t intervals over seeds, checked against scipy."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from scipy import stats as sps

from orchestrator.report import ReportOptions, build_report


def write_env_campaign(root: Path, conditions: dict[str, float], sweep_key: str | None, sweep_values: list,
                       seeds: list[int], steps: int = 21, every: int = 10) -> dict[str, list[float]]:
    """eval/success every `every` steps; returns trial name -> its eval values (for independent checks)."""
    rng = np.random.default_rng(0)
    trials, values = [], {}
    for cond, base in conditions.items():
        for sv in sweep_values or [None]:
            sweep = {sweep_key: sv} if sweep_key else {}
            for s in seeds:
                name = f"{cond}_s{s}" + (f"_{sv}" if sv is not None else "")
                trials.append({"name": name, "condition": cond, "seed": s, "sweep": sweep,
                               "config": {"task": {"name": "frozen_lake"}, "rollout": {"prompts_per_step": 8, "n": 16}}})
                shift = (sv or 0) * 0.1 if isinstance(sv, float) else 0.0
                rows, vals = [], []
                for k in range(steps):
                    row = {"step": k, "train/correct_rate": 0.1, "env/success": 0.1}
                    if k % every == 0 or k == steps - 1:
                        v = float(np.clip(base + shift + 0.01 * k + rng.normal(0, 0.03), 0, 1))
                        row["eval/success"] = v
                        vals.append((k, v))
                    rows.append(json.dumps(row))
                values[name] = vals
                d = root / "trials" / name
                d.mkdir(parents=True)
                (d / "metrics.jsonl").write_text("\n".join(rows) + "\n")
    (root / "campaign.json").write_text(json.dumps({"name": "env", "campaign_id": "x", "trials": trials}))
    return values


def test_conditions_on_x_sweep_points_as_lines(tmp_path):
    vals = write_env_campaign(tmp_path, {"nofilter": 0.2, "rv0.9": 0.4}, "task.success_rate", [0.8, 0.98],
                              seeds=[0, 1, 2, 3])
    report = build_report(tmp_path, ReportOptions(figures=True))
    assert report.metric == "eval/success"
    table = report.tables["sweeps"]
    assert set(table.panel) == {"condition"} and len(table) == 4
    row = table[(table.x == "rv0.9") & (table.series == "task.success_rate=0.98")].iloc[0]
    finals = [vals[f"rv0.9_s{s}_0.98"][-1][1] for s in range(4)]
    lo, hi = sps.t.interval(0.95, 3, loc=np.mean(finals), scale=sps.sem(finals))
    assert row.n_seeds == 4 and row.final_mean == pytest.approx(np.mean(finals))
    assert (row.final_ci_low, row.final_ci_high) == pytest.approx((max(lo, 0.0), min(hi, 1.0)))
    aucs = [np.trapezoid([v for _, v in vals[f"rv0.9_s{s}_0.98"]], [k for k, _ in vals[f"rv0.9_s{s}_0.98"]]) / 20
            for s in range(4)]
    assert row.auc_mean == pytest.approx(np.mean(aucs))
    assert (tmp_path / "report" / "sweeps.png").exists() and (tmp_path / "report" / "sweeps.csv").exists()
    assert "## Sweeps" in report.markdown


def test_one_condition_each_sweep_key_is_a_panel_and_few_seeds_get_no_ci(tmp_path):
    write_env_campaign(tmp_path, {"ppo_gae": 0.3}, "interventions.entropy_bonus.coeff", [0.0, 0.01, 0.1],
                       seeds=[0, 1])
    report = build_report(tmp_path, ReportOptions(figures=False))
    table = report.tables["sweeps"]
    assert list(table.panel.unique()) == ["interventions.entropy_bonus.coeff"]
    assert list(table.x) == ["0.0", "0.01", "0.1"] and table.final_ci_low.isna().all()
    assert "too few seeds" in report.markdown


def test_no_sweep_panel_for_a_plain_single_turn_campaign(tmp_path):
    from tests.unit.report.test_report_build import write_campaign

    write_campaign(tmp_path, effects={"C1": 0.0, "C3": 0.02}, seeds=range(3))
    assert "sweeps" not in build_report(tmp_path, ReportOptions(figures=False)).tables


def test_sweep_trend_is_a_paired_slope_test_and_final_is_at_the_common_step(tmp_path):
    """One condition swept over lr in {0.1, 0.2, 0.4} x 4 seeds: a seed offset shared by every value, a small
    monotone effect. The trend test is scipy's one-sample t-test of the per-seed least-squares slopes over the
    numeric values; per-value deltas are ttest_rel against lr=0.1; "final" is at the step every run reached
    even where a run logged more steps."""
    rng = np.random.default_rng(4)
    lrs, seeds = [0.1, 0.2, 0.4], range(4)
    offset = rng.normal(0, 0.05, 4)
    final = {(lr, s): 0.3 + offset[s] + 0.1 * lr + rng.normal(0, 0.003) for lr in lrs for s in seeds}
    trials = []
    for lr in lrs:
        for s in seeds:
            name = f"C1_s{s}_lr{lr}"
            n_steps = 8 if (lr, s) == (0.2, 0) else 6  # one run went further: its last value is not "final"
            trials.append({"name": name, "condition": "C1", "seed": s, "sweep": {"learner.optim.lr": lr},
                           "config": {"steps": 6}})
            rows = [{"step": k, "train/correct_rate": final[(lr, s)] if k == 5 else 0.9 if k > 5 else 0.2}
                    for k in range(n_steps)]
            d = tmp_path / "trials" / name
            d.mkdir(parents=True)
            (d / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    (tmp_path / "campaign.json").write_text(json.dumps({"name": "lr", "trials": trials}))
    report = build_report(tmp_path, ReportOptions(figures=True))
    table = report.tables["sweeps"]
    assert (table.step == 5).all() and table.x_value.tolist() == lrs
    assert table.final_mean.tolist() == pytest.approx([np.mean([final[(lr, s)] for s in seeds]) for lr in lrs])
    trend = report.tables["sweep_trend"]
    row = trend[trend.measure == "final (step 5)"].iloc[0]
    y = np.array([[final[(lr, s)] for s in seeds] for lr in lrs])
    slopes = [sps.linregress(lrs, y[:, i]).slope for i in range(4)]
    ref = sps.ttest_1samp(slopes, 0.0)
    assert row.x_kind == "value" and row.n_seeds == 4 and row.slope_mean == pytest.approx(np.mean(slopes))
    assert row.p_value == pytest.approx(ref.pvalue) and row.role == "exploratory" and row.mark == ""
    # the one primary test: the trend of the primary measure (here the widest AUC window, 0-5) over lr in C1
    main = trend[trend.role == "primary"]
    assert len(main) == 1 and main.iloc[0].measure == "AUC 0-5" and main.iloc[0].key == "learner.optim.lr"
    assert list(trend.mark == "*") == list((trend.role == "primary") & (trend.p_value < 0.05))
    assert "Primary test: the trend of **AUC 0-5** over `learner.optim.lr` in condition C1" in report.markdown
    assert (report.tables["deltas"].mark == "").all() and (report.tables["sweep_deltas"].mark == "").all()
    assert (row.ci_low, row.ci_high) == pytest.approx(tuple(ref.confidence_interval(0.95)))
    deltas = report.tables["sweep_deltas"]
    d = deltas[(deltas.measure == "final (step 5)") & (deltas.x == "0.4")].iloc[0]
    assert d.against == "0.1" and d.p_value == pytest.approx(sps.ttest_rel(y[2], y[0]).pvalue)
    assert "Trend over the swept values" in report.markdown and (tmp_path / "report" / "sweep_trend.csv").exists()


def test_the_primary_sweep_test_is_declared_or_the_first_and_everything_else_is_exploratory(tmp_path):
    """Two conditions swept over the same key: by default the primary test is the first condition's trend of the
    primary measure; `report.primary_sweep` names another; a name the campaign lacks is a one-line error naming
    the key and listing the sweeps. No other row of report.md carries a `*`."""
    from orchestrator.campaign.sections import ReportSettings

    write_env_campaign(tmp_path, {"a": 0.2, "b": 0.4}, "task.success_rate", [0.5, 0.8, 0.98], seeds=[0, 1, 2, 3])
    report = build_report(tmp_path, ReportOptions(figures=False))
    trend = report.tables["sweep_trend"]
    main = trend[trend.role == "primary"]
    assert len(main) == 1 and (main.iloc[0].condition, main.iloc[0].key) == ("a", "task.success_rate")
    assert "the first in campaign order (set report.primary_sweep to choose)" in report.markdown
    declared = ReportSettings.model_validate({"primary_sweep": {"condition": "b"}}).primary_sweep
    report = build_report(tmp_path, ReportOptions(figures=False, primary_sweep=declared))
    trend = report.tables["sweep_trend"]
    main = trend[trend.role == "primary"]
    assert len(main) == 1 and main.iloc[0].condition == "b" and main.iloc[0].measure == "AUC 0-20"
    assert list(trend.mark == "*") == list((trend.role == "primary") & (trend.p_value < 0.05))
    assert (report.tables["deltas"].mark == "").all() and set(report.tables["deltas"].role) == {"exploratory"}
    stars = [ln for ln in report.markdown.splitlines() if ln.rstrip().endswith("| * |") and "| role |" not in ln
             and "| Role |" not in ln]
    assert len(stars) == int(main.iloc[0].mark == "*")
    with pytest.raises(ValueError, match=r"report.primary_sweep: condition c matches no sweep; .*condition a, key "
                                         r"task.success_rate, series all"):
        build_report(tmp_path, ReportOptions(figures=False, primary_sweep={"condition": "c"}))
    with pytest.raises(Exception, match="extra"):
        ReportSettings.model_validate({"primary_sweep": {"conditon": "b"}})
