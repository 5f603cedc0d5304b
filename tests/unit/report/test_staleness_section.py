"""The report's staleness section (orchestrator/report/sections/staleness.py) on a hand-written campaign: a sync
arm and an async discard arm whose trained batches are shorter than the offered ones; the histogram, the drop and
delay rates, the length ratio and its paired difference against the sync arm against hand arithmetic; no section
for a campaign without an async arm."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator.report import ReportOptions, build_report


def _write(root: Path, runs: dict[str, tuple[dict, list[list[dict]]]]) -> Path:
    trials = []
    for cond, (rollout, per_seed) in runs.items():
        for seed, rows in enumerate(per_seed):
            name = f"{cond}_s{seed}"
            trials.append({"name": name, "condition": cond, "seed": seed, "sweep": {},
                           "config": {"steps": len(rows), "rollout": rollout}})
            d = root / "trials" / name
            d.mkdir(parents=True)
            (d / "metrics.jsonl").write_text("".join(json.dumps({"step": k, "train/correct_rate": 0.5, **r}) + "\n"
                                                     for k, r in enumerate(rows)))
    (root / "campaign.json").write_text(json.dumps({"name": "stale", "trials": trials}))
    return root


def _sync(tokens: int) -> list[dict]:
    return [{"train/tokens_trained": tokens, "train/completion_len": 10.0} for _ in range(2)]


def _discard(trained_len: float) -> list[dict]:
    """Step 0 trains fresh groups (staleness 0), step 1 drops its batch (4 groups), step 2 trains stale ones."""
    base = {"train/completion_len": 10.0, "async/groups_offered": 4, "mismatch/k3": 0.02}
    return [
        {**base, "async/staleness_tokens_0": 40, "async/staleness_tokens_1": 0, "async/groups_dropped": 0,
         "async/groups_delayed": 0, "async/completion_len_trained": 10.0, "train/tokens_trained": 40},
        {**base, "async/staleness_tokens_0": 0, "async/staleness_tokens_1": 0, "async/groups_dropped": 4,
         "async/groups_delayed": 0, "train/tokens_trained": 0},
        {**base, "async/staleness_tokens_0": 0, "async/staleness_tokens_1": 20, "async/groups_dropped": 0,
         "async/groups_delayed": 4, "async/completion_len_trained": trained_len, "train/tokens_trained": 20},
    ]


def test_staleness_section_against_hand_arithmetic(tmp_path):
    camp = _write(tmp_path / "c", {
        "sync": ({"mode": "sync"}, [_sync(40), _sync(40), _sync(40)]),
        "discard": ({"mode": "async", "max_staleness": 1, "admission": "discard"},
                    [_discard(5.0), _discard(5.2), _discard(5.4)]),
    })
    rep = build_report(camp, ReportOptions(out_dir=tmp_path / "out"))
    tab = rep.tables["staleness"].set_index("group")
    # discard: 3 x (40 tokens at 0, 20 at 1) -> 2/3 and 1/3; sync: everything at 0
    assert tab.loc["discard", "tokens_at_0"] == pytest.approx(2 / 3)
    assert tab.loc["discard", "tokens_at_1"] == pytest.approx(1 / 3)
    assert tab.loc["discard", "staleness_mean"] == pytest.approx(1 / 3) and tab.loc["sync", "tokens_at_0"] == 1.0
    assert tab.loc["discard", "dropped_per_step"] == pytest.approx(4 / 3)
    assert tab.loc["discard", "delayed_per_step"] == pytest.approx(4 / 3)
    assert tab.loc["discard", "mismatch_k3"] == pytest.approx(0.02)
    # the length ratio per run: mean over trained steps of trained / offered = (1 + x / 10) / 2
    ratios = [(1 + x / 10) / 2 for x in (5.0, 5.2, 5.4)]
    assert tab.loc["discard", "len_ratio"] == pytest.approx(sum(ratios) / 3)
    assert tab.loc["sync", "len_ratio"] == 1.0
    assert tab.loc["discard", "len_ratio_delta"] == pytest.approx(sum(ratios) / 3 - 1)
    assert tab.loc["discard", "delta_hi"] < 0  # the trained batch is shorter than offered, beyond seed noise
    assert "## Staleness" in rep.markdown and "| discard | 3 | 66.7% | 33.3% |" in rep.markdown
    assert (tmp_path / "out" / "staleness.csv").exists()


def test_no_section_without_an_async_arm(tmp_path):
    camp = _write(tmp_path / "c", {"a": ({"mode": "sync"}, [_sync(40)]), "b": ({"mode": "sync"}, [_sync(30)])})
    rep = build_report(camp, ReportOptions(out_dir=tmp_path / "out"))
    assert "staleness" not in rep.tables and "## Staleness" not in rep.markdown


def test_discard_at_k0_is_not_the_synchronous_arm(tmp_path):
    """Under discard, k = 0 drops every other batch: no paired column against it."""
    camp = _write(tmp_path / "c", {
        "d0": ({"mode": "async", "max_staleness": 0, "admission": "discard"}, [_discard(5.0)] * 2),
        "d1": ({"mode": "async", "max_staleness": 1, "admission": "discard"}, [_discard(5.0)] * 2),
    })
    rep = build_report(camp, ReportOptions(out_dir=tmp_path / "out"))
    assert "len_ratio_delta" not in rep.tables["staleness"].columns
    camp = _write(tmp_path / "p", {
        "p0": ({"mode": "async", "max_staleness": 0, "admission": "paced"}, [_sync(40)] * 2),
        "d1": ({"mode": "async", "max_staleness": 1, "admission": "discard"}, [_discard(5.0)] * 2),
    })
    assert "len_ratio_delta" in build_report(camp, ReportOptions(out_dir=tmp_path / "o2")).tables["staleness"]
