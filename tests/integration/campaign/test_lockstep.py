"""Lockstep rounds on the real stack: two seeds of one condition on one slot take turns round by round (checked
from the campaign's and the trials' events.jsonl), and a GPU-hour budget ends a two-condition campaign at a round
boundary with every trial at the same step.

A trial's steps here take milliseconds; what costs is each start or resume of a trial (Tune, a vLLM engine, a
learner: seconds each), so the real stack runs the fewest trials that show each behaviour (3 starts, then 2); the
scheduler's decisions over a 3 x 2 grid are tests/unit/tune/test_lockstep.py's."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from orchestrator.campaign.expand import load_campaign
from orchestrator.jobs.status import render
from orchestrator.tune.launch import run_campaign

SMALL = {"model": {"name": "tiny"}, "task": {"name": "arithmetic"}, "eval": {"every": 0},
         "rollout": {"prompts_per_step": 2, "n": 2, "max_tokens": 2}, "checkpoint": {"every": 2, "keep": 2}}
CONDITIONS = {"A": {}, "B": {"credit": {"advantage_mode": "maxrl"}}}


def _campaign(tmp_path: Path, name: str, steps: int, conditions: dict, seeds: list[int], **extra):
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump({
        "name": name, "storage": str(tmp_path / "store"), "seeds": seeds, "base": {"steps": steps, **SMALL},
        "conditions": conditions, "max_concurrent_trials": 1, "wandb": {"mode": "disabled"},
        "schedule": {"mode": "lockstep", "round_steps": 2},
        "resources": {"rollout_workers": 1, "worker_gpus": 1, "worker_cpus": 0.5, "learner_cpus": 0.5,
                      "driver_cpus": 0.25}, **extra}))
    return load_campaign(path)


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(ln) for ln in path.read_text().splitlines() if ln.strip()] if path.exists() else []


def _timeline(campaign) -> tuple[dict, dict]:
    """done[trial][r]: when the trial finished round r (1-based; the campaign's `round_done` events, its own
    `end` for the last); started[trial][r]: when it started round r (its `start` events: the step it resumed
    from; a trial that went on without pausing started round r + 1 when it finished round r)."""
    cdir = Path(campaign.directory)
    events = _jsonl(cdir / "events.jsonl")
    done, started = {}, {}
    for t in campaign.trials:
        own = _jsonl(cdir / "trials" / t.name / "events.jsonl")
        done[t.name] = {e["round"]: e["time"] for e in events if e["event"] == "round_done" and e["trial"] == t.name}
        ends = [e["time"] for e in own if e["event"] == "end"]
        if ends:
            done[t.name][t.trial.steps // 2] = ends[-1]
        started[t.name] = {e["from_step"] // 2 + 1: e["time"] for e in own if e["event"] == "start"}
        for r, when in done[t.name].items():
            started[t.name].setdefault(r + 1, when)
    return done, started


def test_one_slot_runs_two_conditions_by_two_seeds_in_lockstep(ray_local, tmp_path):
    campaign = _campaign(tmp_path, "lockstep", steps=4, conditions={"A": {}}, seeds=[0, 1])
    assert run_campaign(campaign) == 0
    done, started = _timeline(campaign)
    names = [t.name for t in campaign.trials]
    assert all(set(done[n]) == {1, 2} for n in names), done
    # lockstep: nobody starts round 2 before everybody finished round 1
    everyone_round1 = max(done[n][1] for n in names)
    assert all(started[n][2] >= everyone_round1 for n in names), (started, done)
    # one slot: the trials took turns; all but the last of round 1 paused at their checkpoint and resumed there
    spans = sorted((started[n][r], done[n][r]) for n in names for r in (1, 2))
    assert all(a_end <= b_start + 1e-3 for (_, a_end), (b_start, _) in zip(spans, spans[1:], strict=False)), spans
    resumed = [n for n in names if any(e["event"] == "start" and e["from_step"] == 2 for e in
                                       _jsonl(Path(campaign.directory) / "trials" / n / "events.jsonl"))]
    assert len(resumed) == len(names) - 1 == 1, resumed
    rows = {n: _jsonl(Path(campaign.directory) / "trials" / n / "metrics.jsonl") for n in names}
    assert all([r["step"] for r in rows[n]] == [0, 1, 2, 3] for n in names), rows
    # the seed reaches sampling: the two seeds' trajectories differ (a resumed one included)
    a, b = ([{k: v for k, v in r.items() if not k.startswith(("time/", "rollout/tokens_per_s"))} for r in rows[n]]
            for n in names)
    assert a != b
    boundaries = [e for e in _jsonl(Path(campaign.directory) / "events.jsonl") if e["event"] == "round"]
    assert [b["round"] for b in boundaries] == [1]  # the boundary after round 1 (round 2 ends the trials)
    assert "lockstep: all 2 rounds finished" in render(campaign)


def test_budget_ends_the_campaign_at_a_round_boundary(ray_local, tmp_path):
    # 1e-6 GPU-hours: spent by the first round, so the campaign ends at the first boundary (step 1 of 6); one seed
    # of each condition shows every trial stopping at the same step: the first paused, the second stopped there
    campaign = _campaign(tmp_path, "budget", steps=6, conditions=CONDITIONS, seeds=[0], budget={"gpu_hours": 1e-6})
    run_campaign(campaign)
    cdir = Path(campaign.directory)
    last = {t.name: _jsonl(cdir / "trials" / t.name / "metrics.jsonl")[-1]["step"] for t in campaign.trials}
    assert set(last.values()) == {1}, last
    stops = [e for e in _jsonl(cdir / "events.jsonl") if e["event"] == "budget_stop"]
    assert len(stops) == 1 and stops[0]["step"] == 1
    assert "budget" in render(campaign)
