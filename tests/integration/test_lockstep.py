"""Lockstep rounds on the real stack: 3 conditions x 2 seeds on one slot take turns round by round (checked from
the campaign's and the trials' events.jsonl), and a GPU-hour budget ends the campaign at a round boundary with
every trial at the same step."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from orchestrator.campaign import load_campaign
from orchestrator.launch import run_campaign
from orchestrator.status import render

SMALL = {"model": {"name": "tiny"}, "task": {"name": "arithmetic"}, "eval": {"every": 0},
         "rollout": {"prompts_per_step": 2, "n": 2, "max_tokens": 2}, "checkpoint": {"every": 2, "keep": 2}}
CONDITIONS = {"A": {}, "B": {"credit": {"advantage_mode": "maxrl"}}, "C": {"learner": {"optim": {"lr": 1e-4}}}}


def _campaign(tmp_path: Path, name: str, steps: int, **extra):
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump({
        "name": name, "storage": str(tmp_path / "store"), "seeds": [0, 1], "base": {"steps": steps, **SMALL},
        "conditions": CONDITIONS, "max_concurrent_trials": 1, "wandb": {"mode": "disabled"},
        "schedule": {"mode": "lockstep", "round_steps": 2},
        "resources": {"rollout_workers": 1, "worker_gpus": 1, "worker_cpus": 0.5, "learner_cpus": 0.5,
                      "driver_cpus": 0.25}, **extra}))
    return load_campaign(path)


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(ln) for ln in path.read_text().splitlines() if ln.strip()] if path.exists() else []


def _rounds_run(campaign) -> list[tuple[float, float, str, int]]:
    """(start, end, trial, round) of every stretch a trial ran: from its start events (the step it resumed
    from) to the next `round_done` / its end event."""
    cdir = Path(campaign.directory)
    events = _jsonl(cdir / "events.jsonl")
    spans = []
    for t in campaign.trials:
        own = _jsonl(cdir / "trials" / t.name / "events.jsonl")
        starts = [e for e in own if e["event"] == "start"]
        ends = sorted([e["time"] for e in events if e.get("trial") == t.name and e["event"] == "round_done"]
                      + [e["time"] for e in own if e["event"] == "end"])
        for s in starts:
            end = min(x for x in ends if x >= s["time"])
            spans.append((s["time"], end, t.name, s["from_step"] // 2))
    return sorted(spans)


def test_one_slot_runs_three_conditions_by_two_seeds_in_lockstep(ray_local, tmp_path):
    campaign = _campaign(tmp_path, "lockstep", steps=4)
    assert run_campaign(campaign) == 0
    spans = _rounds_run(campaign)
    assert len(spans) == 12  # 6 trials x 2 rounds: each paused after round 0 and resumed from its checkpoint
    # one slot: the stretches never overlap, and every round-0 stretch ends before any round-1 stretch starts
    for (s0, e0, *_), (s1, _, *_) in zip(spans, spans[1:], strict=False):
        assert e0 <= s1
    last_round0 = max(e for _, e, _, r in spans if r == 0)
    assert all(s >= last_round0 for s, _, _, r in spans if r == 1), spans
    assert [r for *_, r in spans] == [0] * 6 + [1] * 6
    for t in campaign.trials:
        rows = _jsonl(Path(campaign.directory) / "trials" / t.name / "metrics.jsonl")
        assert [r["step"] for r in rows] == [0, 1, 2, 3], t.name
    boundaries = [e for e in _jsonl(Path(campaign.directory) / "events.jsonl") if e["event"] == "round"]
    assert [b["round"] for b in boundaries] == [1]  # the boundary after round 0 (the last one ends the trials)
    assert "round 1" in render(campaign)


def test_budget_ends_the_campaign_at_a_round_boundary(ray_local, tmp_path):
    # 1e-6 GPU-hours: spent by the first round, so the campaign ends at the first boundary (step 1 of 6)
    campaign = _campaign(tmp_path, "budget", steps=6, budget={"gpu_hours": 1e-6})
    run_campaign(campaign)
    cdir = Path(campaign.directory)
    last = {t.name: _jsonl(cdir / "trials" / t.name / "metrics.jsonl")[-1]["step"] for t in campaign.trials}
    assert set(last.values()) == {1}, last
    stops = [e for e in _jsonl(cdir / "events.jsonl") if e["event"] == "budget_stop"]
    assert len(stops) == 1 and stops[0]["step"] == 1
    assert "budget" in render(campaign)
