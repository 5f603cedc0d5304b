"""Lockstep rounds on the real stack, on a shared base (`resources.shared_base`, one slot): three seeds of one
condition take turns round by round (round_steps 1, four steps), each pause handing the slot to the next trial at
once (checked from the campaign's and the trials' events.jsonl: the driver's `slot_release` on every pause, each
acquire's wait); and a GPU-hour budget ends a two-condition campaign at a round boundary with every trial at the
same step.

A trial's steps here take milliseconds; what costs is each start or resume of a trial. On a shared base a resume
is a driver process and a slot opened on the running pool (no engine or learner start), so the turn-taking runs
at the issue's size; the scheduler's decisions over a 3 x 2 grid are tests/unit/tune/test_lockstep.py's."""

from __future__ import annotations

import inspect
import json
from pathlib import Path

import yaml

from orchestrator.campaign.expand import load_campaign
from orchestrator.jobs.status import render
from orchestrator.trial.actors.shared import acquire_slot
from orchestrator.tune.launch import run_campaign

SMALL = {"model": {"name": "tiny"}, "task": {"name": "arithmetic"}, "eval": {"every": 0},
         "rollout": {"prompts_per_step": 2, "n": 2, "max_tokens": 2}, "checkpoint": {"every": 1, "keep": 2}}
CONDITIONS = {"A": {}, "B": {"credit": {"advantage_mode": "maxrl"}}}
ROUND = 1  # steps a round


def _campaign(tmp_path: Path, name: str, steps: int, conditions: dict, seeds: list[int], **extra):
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump({
        "name": name, "storage": str(tmp_path / "store"), "seeds": seeds, "base": {"steps": steps, **SMALL},
        "conditions": conditions, "wandb": {"mode": "disabled"},
        "schedule": {"mode": "lockstep", "round_steps": ROUND},
        "resources": {"rollout_workers": 1, "worker_gpus": 1, "worker_cpus": 0.5, "learner_cpus": 0.5,
                      "driver_cpus": 0.25, "shared_base": {"slots": 1}}, **extra}))
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
            done[t.name][t.trial.steps // ROUND] = ends[-1]
        started[t.name] = {e["from_step"] // ROUND + 1: e["time"] for e in own if e["event"] == "start"}
        for r, when in done[t.name].items():
            started[t.name].setdefault(r + 1, when)
    return done, started


def test_three_trials_take_turns_on_one_slot_round_by_round(ray_local, tmp_path):
    campaign = _campaign(tmp_path, "lockstep", steps=4, conditions={"A": {}}, seeds=[0, 1, 2])
    assert run_campaign(campaign) == 0
    cdir = Path(campaign.directory)
    done, started = _timeline(campaign)
    names = [t.name for t in campaign.trials]
    rounds = range(1, 5)
    assert all(set(done[n]) == set(rounds) for n in names), done
    # lockstep: nobody starts round r + 1 before everybody finished round r
    for r in rounds[:-1]:
        assert all(started[n][r + 1] >= max(done[m][r] for m in names) for n in names), (r, started, done)
    # one slot: the trials took turns, never two at once
    spans = sorted((started[n][r], done[n][r]) for n in names for r in rounds)
    assert all(a_end <= b_start + 1e-3 for (_, a_end), (b_start, _) in zip(spans, spans[1:], strict=False)), spans
    rows = {n: _jsonl(cdir / "trials" / n / "metrics.jsonl") for n in names}
    assert all([r["step"] for r in rows[n]] == [0, 1, 2, 3] for n in names), rows
    # the seed reaches sampling: the seeds' trajectories differ (resumed ones included)
    stable = [[{k: v for k, v in r.items() if not k.startswith(("time/", "rollout/tokens_per_s"))} for r in rows[n]]
              for n in names]
    assert all(a != b for i, a in enumerate(stable) for b in stable[i + 1:])
    # every pause handed the slot over: each resume is a new acquire of slot 0 under a new epoch (freed by whichever
    # came first, the paused trial's own release or the campaign driver's `slot_release`)
    events = _jsonl(cdir / "events.jsonl")
    pauses = [e for e in events if e["event"] == "pause"]
    starts = {n: [e for e in _jsonl(cdir / "trials" / n / "events.jsonl") if e["event"] == "start"] for n in names}
    resumes = sum(len(v) - 1 for v in starts.values())
    assert resumes >= len(names) and len(pauses) == resumes, (len(pauses), resumes)
    assert all(e["why"] in ("pause", "end") for e in events if e["event"] == "slot_release")
    slots = [e for n in names for e in _jsonl(cdir / "trials" / n / "events.jsonl") if e["event"] == "slot"]
    assert len(slots) == resumes + len(names) and {e["slot"] for e in slots} == {0}
    assert sorted(e["epoch"] for e in slots) == sorted(set(e["epoch"] for e in slots))  # a new epoch each time
    # every acquire found the slot free at its first try: a slot still held would have cost at least one poll
    # interval (1 s: longer than any step of these trials), a leaked one the setup deadline
    poll_s = inspect.signature(acquire_slot).parameters["poll_s"].default
    assert max(e["waited_s"] for e in slots) < poll_s, [e["waited_s"] for e in slots]
    assert [b["round"] for b in events if b["event"] == "round"] == [1, 2, 3]  # the boundaries before the last
    assert "lockstep: all 4 rounds finished" in render(campaign)


def test_budget_ends_the_campaign_at_a_round_boundary(ray_local, tmp_path):
    # 1e-6 GPU-hours (the pool's GPUs x wall): spent by the first round, so the campaign ends at the first boundary
    # (step 0 of 4); one seed of each condition shows every trial stopping at the same step: the first paused, the
    # second stopped there
    campaign = _campaign(tmp_path, "budget", steps=4, conditions=CONDITIONS, seeds=[0], budget={"gpu_hours": 1e-6})
    run_campaign(campaign)
    cdir = Path(campaign.directory)
    last = {t.name: _jsonl(cdir / "trials" / t.name / "metrics.jsonl")[-1]["step"] for t in campaign.trials}
    assert set(last.values()) == {ROUND - 1}, last
    stops = [e for e in _jsonl(cdir / "events.jsonl") if e["event"] == "budget_stop"]
    assert len(stops) == 1 and stops[0]["step"] == ROUND - 1
    assert "budget" in render(campaign)
