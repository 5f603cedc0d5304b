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


def _kept_rows(with_async: bool) -> list[list[dict]]:
    """Two seeds of 2 steps, n = 4: 3 of 4 groups kept at step 0 (the uninformative one left out, shorter than
    the offered mean), all 4 at step 1; the async k = 0 rows carry what staleness.py logs for the same batch."""
    per_seed = []
    for extra in (0.0, 1.0):
        rows = [{"train/completion_len": 10.0 + extra, "train/groups_kept": 3, "train/tokens_trained": 132},
                {"train/completion_len": 12.0, "train/groups_kept": 4, "train/tokens_trained": 192}]
        if with_async:
            for r in rows:
                r.update({"async/groups_offered": 4, "async/groups_dropped": 0, "async/groups_delayed": 0,
                          "async/staleness_tokens_0": r["train/tokens_trained"],
                          "async/completion_len_trained": r["train/tokens_trained"] / (r["train/groups_kept"] * 4)})
        per_seed.append(rows)
    return per_seed


def test_a_sync_arm_and_async_k0_training_the_same_batches_get_the_same_len_ratio(tmp_path):
    """sync is async at k = 0 (docs/guides/staleness.md): the same trained batches give the same length ratio,
    whichever mode logged them; a sync run's trained length is its trained tokens over its kept groups' sequences,
    not a ratio pinned at 1 (the uninformative groups both leave out move it off 1)."""
    camp = _write(tmp_path / "c", {
        "sync": ({"mode": "sync", "n": 4}, _kept_rows(with_async=False)),
        "paced0": ({"mode": "async", "max_staleness": 0, "admission": "paced", "n": 4}, _kept_rows(with_async=True)),
        "discard1": ({"mode": "async", "max_staleness": 1, "admission": "discard", "n": 4},
                     _kept_rows(with_async=True)),
    })
    tab = build_report(camp, ReportOptions(out_dir=tmp_path / "out")).tables["staleness"].set_index("group")
    # per seed: step 0 trains 132 / 12 = 11 tokens a sequence of the offered 10 (seed 0) or 11 (seed 1); step 1
    # trains all it was offered, 192 / 16 = 12 of 12
    expected = ((11 / 10 + 1) / 2 + (11 / 11 + 1) / 2) / 2
    assert tab.loc["sync", "len_ratio"] == pytest.approx(expected)
    assert tab.loc["paced0", "len_ratio"] == pytest.approx(expected)
    # the sync arm is the first synchronous group: the async arms' paired difference against it is 0
    assert tab.loc["paced0", "len_ratio_delta"] == pytest.approx(0.0)
    assert tab.loc["discard1", "len_ratio_delta"] == pytest.approx(0.0)


def test_the_csv_keeps_the_histogram_bins_together_in_order(tmp_path):
    """A k = 0 group first (no bin 1 or 2): staleness.csv still lists tokens_at_0, _1, _2 side by side."""
    def rows(k: int) -> list[dict]:
        return [{"train/completion_len": 10.0, "train/tokens_trained": 10, "async/groups_offered": 1,
                 f"async/staleness_tokens_{k}": 10, "async/completion_len_trained": 10.0}]
    camp = _write(tmp_path / "c", {f"p{k}": ({"mode": "async", "max_staleness": k}, [rows(k)]) for k in range(3)})
    build_report(camp, ReportOptions(out_dir=tmp_path / "out"))
    head = (tmp_path / "out" / "staleness.csv").read_text().splitlines()[0].split(",")
    assert head[:6] == ["group", "condition", "n_seeds", "tokens_at_0", "tokens_at_1", "tokens_at_2"]


def _comp_rows(trained_hard_step1: int, trained_easy_step1: int) -> list[dict]:
    """Two async steps: step 0 offers 2 hard + 2 easy groups (hard = member `long`, easy = `short`) and trains 1 / 2
    (sync arm) or 0 / 2; step 1 offers 1 hard + 3 easy and trains what the caller says."""
    def row(off_h, off_e, tr_h, tr_e):
        out = {"train/completion_len": 10.0, "async/groups_offered": off_h + off_e, "async/groups_dropped": 0,
               "async/staleness_tokens_0": 10 * (tr_h + tr_e), "train/tokens_trained": 10 * (tr_h + tr_e)}
        for kind, (h, e) in (("difficulty", ("hard", "easy")), ("source", ("long", "short"))):
            out.update({f"async/offered_by_{kind}/{h}": off_h, f"async/offered_by_{kind}/{e}": off_e,
                        f"async/trained_by_{kind}/{h}": tr_h, f"async/trained_by_{kind}/{e}": tr_e})
        return out
    return [row(2, 2, 1 if trained_hard_step1 is None else 0, 2),
            row(1, 3, 1 if trained_hard_step1 is None else trained_hard_step1,
                3 if trained_easy_step1 is None else trained_easy_step1)]


def test_the_composition_by_difficulty_and_source_against_hand_arithmetic(tmp_path):
    """The synchronous arm (paced k = 0) trains 2 of the 3 hard groups offered and 5 of the 5 easy ones: hard ratio
    (2/7) / (3/8) = 16/21, short (5/7) / (5/8) = 8/7. The discard arm's seeds train 0, 1 and 1 hard groups of 5, 6
    and 4: ratios 0, 4/9, 2/3; their paired differences against 16/21 have the mean 10/27 - 16/21."""
    camp = _write(tmp_path / "c", {
        "sync0": ({"mode": "async", "max_staleness": 0, "admission": "paced"}, [_comp_rows(None, None)] * 3),
        "discard": ({"mode": "async", "max_staleness": 1, "admission": "discard"},
                    [_comp_rows(0, 3), _comp_rows(1, 3), _comp_rows(1, 1)]),
    })
    rep = build_report(camp, ReportOptions(out_dir=tmp_path / "out"))
    tab = rep.tables["staleness"].set_index("group")
    assert tab.loc["sync0", "hard_ratio"] == pytest.approx(16 / 21)
    assert tab.loc["sync0", "long_ratio"] == pytest.approx(16 / 21)
    assert tab.loc["sync0", "short_ratio"] == pytest.approx(8 / 7)
    assert tab.loc["discard", "hard_ratio"] == pytest.approx((0 + 4 / 9 + 2 / 3) / 3)
    assert tab.loc["discard", "hard_ratio_delta"] == pytest.approx(10 / 27 - 16 / 21)
    assert tab.loc["discard", "long_ratio_delta"] == pytest.approx(10 / 27 - 16 / 21)
    # short: (5/5, 5/6, 3/4 trained easy) / (5/8 offered) per seed
    short = [(5 / 5) / (5 / 8), (5 / 6) / (5 / 8), (3 / 4) / (5 / 8)]
    assert tab.loc["discard", "short_ratio"] == pytest.approx(sum(short) / 3)
    assert tab.loc["discard", "short_ratio_delta"] == pytest.approx(sum(short) / 3 - 8 / 7)
    assert tab.loc["discard", "hard_ratio_lo"] < tab.loc["discard", "hard_ratio_delta"] < tab.loc["discard",
                                                                                                  "hard_ratio_hi"]
    csv = (tmp_path / "out" / "staleness.csv").read_text().splitlines()[0].split(",")
    assert {"hard_ratio", "hard_ratio_delta", "long_ratio", "short_ratio_delta"} <= set(csv)
    assert "| group | seeds | len ratio | hard ratio | long ratio | short ratio |" in rep.markdown
    line = next(ln for ln in rep.markdown.splitlines() if ln.startswith("| discard | 3 | 1.000"))
    assert f"{(0 + 4 / 9 + 2 / 3) / 3:.3f} ({10 / 27 - 16 / 21:+.3f} [" in line


def test_the_composition_says_what_its_difficulty_measures(tmp_path):
    """`hard by`: the starting policy's pass rate where the runs sampled it (rollout.difficulty_samples), else
    each group's own samples'; an arm whose seeds differ says so."""
    sync0 = {"mode": "async", "max_staleness": 0, "admission": "paced", "difficulty_samples": 8}
    discard = {"mode": "async", "max_staleness": 1, "admission": "discard"}
    camp = _write(tmp_path / "c", {"sync0": (sync0, [_comp_rows(None, None)] * 2),
                                   "discard": (discard, [_comp_rows(0, 3), _comp_rows(1, 3)])})
    rep = build_report(camp, ReportOptions(out_dir=tmp_path / "out"))
    tab = rep.tables["staleness"].set_index("group")
    assert tab.loc["sync0", "difficulty_by"] == "starting policy, 8 samples"
    assert tab.loc["discard", "difficulty_by"] == "own samples"
    assert "| group | seeds | len ratio | hard ratio | long ratio | short ratio | hard by |" in rep.markdown
    assert next(ln for ln in rep.markdown.splitlines() if ln.startswith("| sync0 | 2 | 1.000")).endswith(
        "| starting policy, 8 samples |")
