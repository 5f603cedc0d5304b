"""`python -m orchestrator samples` and the report's examples section on a synthetic campaign directory."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from orchestrator.cli import main
from orchestrator.report.sections import examples
from orchestrator.trial.artifacts.samples import SamplesWriter

TRIALS = [("C1_s0", "C1", 0), ("C1_s1", "C1", 1), ("C4_s0", "C4", 0), ("C4_s1", "C4", 1)]


def row(trial: str, step: int, split: str, problem: str, k: int) -> dict:
    text = f"{trial} says: let me check {problem} {k}"
    at = text.index("let me check")
    return {"step": step, "split": split, "group": int(problem[1:]), "problem": problem, "sample": k,
            "prompt": f"prompt of {problem}", "completion": text, "turns": None, "reward": float(k == 0),
            "correct": k == 0, "episode_advantage": None if split == "eval" else 0.5,
            "token_advantage": None if split == "eval" else 0.25, "length": 7, "truncated": k == 1,
            "planning_spans": [[at, at + 12]], "adapter_version": step, "trained": split == "train"}


@pytest.fixture
def campaign(tmp_path) -> Path:
    """A campaign YAML whose directory holds campaign.json and samples: eval at steps 0 and 2 (C4_s1: 0 only),
    training samples at steps 0..2."""
    path = tmp_path / "cmp.yaml"
    path.write_text(yaml.safe_dump({"name": "cmp", "storage": str(tmp_path / "store"), "seeds": [0, 1],
                                    "base": {"steps": 3}, "conditions": {"C1": {}, "C4": {}}}))
    cdir = tmp_path / "store" / "cmp"
    cdir.mkdir(parents=True)
    (cdir / "campaign.json").write_text(json.dumps({"name": "cmp", "trials": [
        {"name": n, "condition": c, "seed": s} for n, c, s in TRIALS]}))
    for name, _, _ in TRIALS:
        writer = SamplesWriter(str(cdir / "trials" / name), max_mb=10)
        for step in range(3):
            writer.write(step, "train", [row(name, step, "train", "p3", k) for k in range(2)])
        for step in (0,) if name == "C4_s1" else (0, 2):
            writer.write(step, "eval", [row(name, step, "eval", p, k) for p in ("p0", "p1") for k in range(2)])
    return path


def run(capsys, *argv) -> tuple[int, str, str]:
    code = main(["samples", *map(str, argv)])
    out, err = capsys.readouterr()
    return code, out, err


def test_mark_wraps_spans_and_merges_overlaps():
    assert examples.mark("abcdef", [[1, 3], [2, 4], [5, 6]]) == "a[[bcd]]e[[f]]"
    assert examples.mark("abc", []) == "abc"


def test_default_is_the_first_held_out_problem_across_conditions_at_the_last_common_step(campaign, capsys):
    code, out, _ = run(capsys, campaign)
    assert code == 0
    lines = out.splitlines()
    assert lines[0] == "problem p0 at step 0 (eval): prompt of p0"  # C4_s1 has no eval at step 2
    assert [ln for ln in lines if ln.startswith("==")] == ["== C1", "== C4"]
    assert [ln for ln in lines if ln.startswith("--")] == [
        f"-- {n} (seed {s}): 1/2 correct" for n, _, s in TRIALS]
    assert "      C1_s1 says: [[let me check]] p0 1" in lines
    assert "  [1] reward 0 wrong adv - (token mean -) 7 tokens truncated" in lines
    assert "p1" not in out


def test_problem_and_step_pick_the_comparison(campaign, capsys):
    code, out, _ = run(capsys, campaign, "--problem", "p1", "--step", "0")
    assert code == 0 and out.startswith("problem p1 at step 0 (eval)") and out.count("[[let me check]] p1") == 8


def test_one_trial_shows_its_training_groups_with_advantages(campaign, capsys):
    code, out, _ = run(capsys, campaign, "--trial", "C1_s0")
    assert code == 0
    lines = out.splitlines()
    assert lines[0] == "C1_s0 step 2 (train, adapter version 2)"
    assert "problem p3: prompt of p3" in lines
    assert "  [0] reward 1 correct adv +0.500 (token mean +0.250) 7 tokens" in lines


@pytest.mark.parametrize(("argv", "needle"), [
    (["--trial", "C9_s0"], "--trial C9_s0: no such trial; trials: C1_s0, C1_s1, C4_s0, C4_s1"),
    (["--step", "2"], "--step 2: no eval samples there in every trial; steps with them: 0"),
    (["--problem", "p7"], "--problem p7: not in the eval samples of step 0; problems there: p0, p1"),
    (["--trial", "C1_s0", "--step", "9"], "--step 9: no train samples there in every trial; steps with them: 0, 1, 2"),
])
def test_bad_requests_are_one_line_exit_2(campaign, capsys, argv, needle):
    code, out, err = run(capsys, campaign, *argv)
    assert code == 2 and out == ""
    assert err.splitlines() == [f"error: {campaign}: {needle}"]


def test_campaign_that_has_not_run_is_one_line(tmp_path):
    path = tmp_path / "new.yaml"
    path.write_text(yaml.safe_dump({"name": "new", "storage": str(tmp_path / "s"), "seeds": [0],
                                    "conditions": {"A": {}}}))
    proc = subprocess.run([sys.executable, "-m", "orchestrator", "samples", str(path)], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 2 and len(proc.stderr.splitlines()) == 1 and "has not run yet" in proc.stderr


def test_examples_section_one_problem_per_condition(campaign):
    cdir = str(campaign.parent / "store" / "cmp")
    md = examples.markdown(cdir, examples.campaign_trials(cdir))
    assert md[1] == "## Examples" and "step 2" in md[3]  # C4_s1 lacks step 2, but only first seeds are shown
    assert [ln for ln in md if ln.startswith("**")] == ["**C1** (C1_s0, 1/2 correct; reward 1):",
                                                       "**C4** (C4_s0, 1/2 correct; reward 1):"]
    assert "C4_s0 says: [[let me check]] p0 0" in md and "problem at step 2" in md[3]
    assert examples.markdown(str(campaign.parent), []) == []
