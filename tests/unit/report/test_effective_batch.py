"""The report's effective-batch section (orchestrator/report/sections/effective_batch.py) on hand-written campaigns: the
table's means against hand arithmetic, the warning on an unfilled campaign whose conditions drift apart, none on a
filled one, and the informative-groups figure."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest

from orchestrator.report import ReportOptions, build_report
from orchestrator.report.sections.effective_batch import MARGIN, spread

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _campaign(root: Path, informative: dict[str, list[list[int]]], filled: bool) -> Path:
    """Conditions -> per seed, the informative groups per step; 8 groups sampled (unfilled) or as many as the
    refill needed; 10 tokens per trained group; one sample in 16 overlong."""
    trials = []
    for cond, per_seed in informative.items():
        for seed, inf in enumerate(per_seed):
            name = f"{cond}_s{seed}"
            trials.append({"name": name, "condition": cond, "seed": seed, "sweep": {},
                           "config": {"steps": len(inf), "rollout": {"prompts_per_step": 8, "n": 2}}})
            rows = []
            for k, n_inf in enumerate(inf):
                kept = min(4, n_inf) if filled else n_inf
                rows.append({"step": k, "train/correct_rate": 0.5, "train/groups_sampled": 16 if filled else 8,
                             "train/groups_informative": n_inf, "train/groups_kept": kept,
                             "train/tokens_trained": 10 * kept, "train/overlong_share": 1 / 16,
                             "train/fill_rounds": 2 if filled else 1})
            d = root / "trials" / name
            d.mkdir(parents=True)
            (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (root / "campaign.json").write_text(json.dumps({"name": "batch", "trials": trials}))
    return root


def test_unfilled_campaign_table_and_warning(tmp_path):
    # A: 6, 6 and 4, 6 -> run means 6 and 5 -> 5.5; B: 2, 2 and 4, 2 -> 2 and 3 -> 2.5
    camp = _campaign(tmp_path / "c", {"A": [[6, 6], [4, 6]], "B": [[2, 2], [4, 2]]}, filled=False)
    rep = build_report(camp, ReportOptions(out_dir=tmp_path / "out"))
    tab = rep.tables["effective_batch"].set_index("group")
    assert tab.loc["A", "groups_informative"] == 5.5 and tab.loc["B", "groups_informative"] == 2.5
    assert tab.loc["A", "tokens_trained"] == 55.0 and tab.loc["B", "tokens_trained"] == 25.0
    assert tab.loc["A", "groups_sampled"] == 8 and tab.loc["B", "n_seeds"] == 2
    assert tab.loc["A", "overlong_share"] == pytest.approx(1 / 16) and tab.loc["B", "fill_rounds"] == 1
    assert spread(rep.tables["effective_batch"], "groups_informative") == pytest.approx((5.5 - 2.5) / 5.5)
    md = rep.markdown
    assert "## Effective batch" in md and "| A | 2 | 8.00 | 5.50 | 5.50 | 55 | 6.2% | 1.00 |" in md
    assert ("**Warning: unequal effective batch.** trained tokens differ by 55% (B 25 vs A 55 per step); "
            "trained groups differ by 55% (B 2.5 vs A 5.5 per step)") in md
    png = tmp_path / "out" / "informative_groups.png"
    assert png in rep.figures and png.read_bytes()[:8] == PNG_MAGIC
    assert (tmp_path / "out" / "effective_batch.csv").exists()


def test_filled_campaign_trains_equal_batches_without_warning(tmp_path):
    camp = _campaign(tmp_path / "c", {"A": [[6, 6], [5, 6]], "B": [[4, 5], [4, 4]]}, filled=True)
    rep = build_report(camp, ReportOptions(out_dir=tmp_path / "out", figures=False))
    tab = rep.tables["effective_batch"].set_index("group")
    assert (tab.groups_trained == 4).all() and (tab.tokens_trained == 40).all()
    assert "Warning: unequal effective batch" not in rep.markdown
    # informative groups sampled still differ (5.75 vs 4.25: 26%), but every condition trained on 4
    assert spread(rep.tables["effective_batch"], "groups_informative") > MARGIN
    assert f"trained groups agree within {MARGIN:.0%}" in rep.markdown


def test_old_campaigns_without_the_keys_have_no_section(tmp_path):
    root = tmp_path / "c"
    d = root / "trials" / "A_s0"
    d.mkdir(parents=True)
    (d / "metrics.jsonl").write_text(json.dumps({"step": 0, "train/correct_rate": 0.5}) + "\n")
    (root / "campaign.json").write_text(json.dumps({"name": "old", "trials": [
        {"name": "A_s0", "condition": "A", "seed": 0, "sweep": {}, "config": {"steps": 1}}]}))
    rep = build_report(root, ReportOptions(out_dir=tmp_path / "out"))
    assert "## Effective batch" not in rep.markdown and not len(rep.tables["effective_batch"])


def test_a_panel_no_run_logged_says_so_instead_of_an_empty_legend(tmp_path):
    """Runs that log the informative groups but not the trained ones: that panel has no line to label."""
    camp = _campaign(tmp_path / "c", {"A": [[6, 6]]}, filled=False)
    path = camp / "trials" / "A_s0" / "metrics.jsonl"
    rows = [{k: v for k, v in json.loads(line).items() if k != "train/groups_kept"}
            for line in path.read_text().splitlines()]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # matplotlib's "No artists with labels found to put in legend"
        rep = build_report(camp, ReportOptions(out_dir=tmp_path / "out"))
    assert (tmp_path / "out" / "informative_groups.png") in rep.figures
