"""The report's offline-evaluation section: `eval`'s CSVs (trials/<trial>/eval/<set>.csv) read back per group and
compared paired by seed like the in-training measures; a campaign never evaluated offline has no section, and an
unreadable CSV is named, not fatal."""

from __future__ import annotations

import pytest

from orchestrator import storage as store
from orchestrator.evaluate.offline import write_row
from orchestrator.report import ReportOptions, build_report
from tests.unit.report.test_report_sections import write_campaign

EFFECT = {"C1": 0.0, "C4": 0.125, "C8": 0.25}


def _evaluate(camp, checkpoint_step: int = 7, eval_set: str = "gsm") -> None:
    for cond, effect in EFFECT.items():
        for seed in (0, 1, 2):
            p1 = 0.25 + 0.0625 * seed + effect  # seeds differ, the effect is the same for each: exact deltas
            write_row(store.trial_dir(str(camp), f"{cond}_s{seed}"), {
                "checkpoint_step": checkpoint_step, "eval_step": checkpoint_step + 1, "policy_version": 8,
                "set": eval_set, "n": 4, "k": 2, "temperature": 1.0, "seed": 104_729 + seed, "problems": 16,
                "pass@1": p1, "pass@k": min(1.0, 2 * p1), "time_s": 1.0})


def test_offline_eval_is_summarised_and_compared_paired_by_seed(tmp_path):
    camp = write_campaign(tmp_path / "c")
    _evaluate(camp)
    _evaluate(camp, eval_set="default")
    rep = build_report(camp, ReportOptions(out_dir=tmp_path / "out", figures=False))
    summary = rep.tables["offline_eval"].set_index(["group", "set"])
    assert len(summary) == 6 and set(summary["n_seeds"]) == {3}
    assert summary.loc[("C8", "gsm"), "pass@1_mean"] == pytest.approx(0.25 + 0.0625 + 0.25)
    deltas = rep.tables["offline_eval_deltas"].set_index(["group", "measure"])
    c8 = deltas.loc[("C8", "gsm pass@1 @ checkpoint 7")]
    assert (c8["baseline"], c8["n_pairs"], c8["delta"]) == ("C1", 3, pytest.approx(0.25))
    assert c8["zero_variance"] and c8["mark"] == ""  # exploratory: the report's `*` stays with its primary measure
    assert ("C4", "default pass@k @ checkpoint 7") in deltas.index
    md = (tmp_path / "out" / "report.md").read_text()
    assert "## Offline evaluation (`python -m orchestrator eval`)" in md
    assert "| C8 | gsm | 7 | 4 | 2 | 1 | 3 | 0.562 (0.062) | 1.000 (0.000) |" in md
    assert (tmp_path / "out" / "offline_eval_deltas.csv").is_file()


def test_no_csv_no_section_and_an_unreadable_one_is_named(tmp_path):
    camp = write_campaign(tmp_path / "c", seeds=(0,))
    rep = build_report(camp, ReportOptions(out_dir=tmp_path / "out", figures=False))
    assert "offline_eval" not in rep.tables and "Offline evaluation" not in rep.markdown
    bad = camp / "trials" / "C1_s0" / store.EVAL_DIR / "x.csv"
    bad.parent.mkdir()
    bad.write_text("checkpoint_step,oops\n1,2\n")
    rep = build_report(camp, ReportOptions(out_dir=tmp_path / "out", figures=False))
    assert "C1_s0/eval/x.csv: unreadable (no column set, eval_step, n, k, temperature, pass@1, pass@k)" in rep.markdown
