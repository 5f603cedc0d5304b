"""The report's per-task section (orchestrator/report/sections/per_task.py) on a hand-written mixed campaign: each member's
measures, mean over steps and last value, against hand arithmetic; the dashboard's matching section."""

from __future__ import annotations

import json
from pathlib import Path

from orchestrator.report import ReportOptions, build_report


def _campaign(root: Path) -> Path:
    trials, rows = [], {
        "mix_s0": [{"step": 0, "train/correct_rate": 0.5, "train/chain/correct_rate": 0.25, "train/lake/correct_rate": 0.75,
                    "env/lake/success": 0.5, "eval/pass@1": 0.5, "eval/chain/pass@1": 0.0, "eval/lake/pass@1": 1.0},
                   {"step": 1, "train/correct_rate": 0.5, "train/chain/correct_rate": 0.75,
                    "train/lake/correct_rate": 0.25, "env/lake/success": 1.0}],
        "mix_s1": [{"step": 0, "train/correct_rate": 0.5, "train/chain/correct_rate": 0.5, "train/lake/correct_rate": 0.5,
                    "env/lake/success": 0.0, "eval/pass@1": 0.5, "eval/chain/pass@1": 0.5, "eval/lake/pass@1": 0.5},
                   {"step": 1, "train/correct_rate": 0.5, "train/chain/correct_rate": 0.5,
                    "train/lake/correct_rate": 0.5, "env/lake/success": 0.0}]}
    for name, rs in rows.items():
        trials.append({"name": name, "condition": "mix", "seed": int(name[-1]), "sweep": {},
                       "config": {"steps": 2, "rollout": {"prompts_per_step": 2, "n": 2}}})
        d = root / "trials" / name
        d.mkdir(parents=True)
        (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rs))
    (root / "campaign.json").write_text(json.dumps({"name": "mixed", "trials": trials}))
    return root


def test_each_member_gets_its_rows(tmp_path):
    rep = build_report(_campaign(tmp_path / "c"), ReportOptions(out_dir=tmp_path / "out", figures=False))
    tab = rep.tables["per_task"].set_index(["task", "measure"])
    assert sorted(tab.index) == [("chain", "eval/pass@1"), ("chain", "train/correct_rate"), ("lake", "env/success"),
                                 ("lake", "eval/pass@1"), ("lake", "train/correct_rate")]
    chain = tab.loc[("chain", "train/correct_rate")]  # run means 0.5 and 0.5; last values 0.75 and 0.5
    assert (chain["n_seeds"], chain["mean"], chain["last"]) == (2, 0.5, 0.625)
    assert tab.loc[("lake", "env/success"), "mean"] == (0.75 + 0.0) / 2
    assert tab.loc[("lake", "eval/pass@1"), "last"] == 0.75
    assert "## Per task" in rep.markdown and "| mix | chain | train/correct_rate | 2 | 0.500 | 0.625 |" in rep.markdown
    assert (tmp_path / "out" / "per_task.csv").exists()


def test_one_task_campaigns_have_no_section(tmp_path):
    camp = _campaign(tmp_path / "c")
    for d in (camp / "trials").iterdir():
        rows = [json.loads(x) for x in (d / "metrics.jsonl").read_text().splitlines()]
        (d / "metrics.jsonl").write_text("".join(json.dumps({k: v for k, v in r.items() if k.count("/") < 2}) + "\n"
                                                 for r in rows))
    rep = build_report(camp, ReportOptions(out_dir=tmp_path / "out", figures=False))
    assert rep.tables["per_task"].empty and "## Per task" not in rep.markdown
