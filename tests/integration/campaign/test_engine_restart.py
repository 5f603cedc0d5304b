"""A pool engine's restart costs no trial anything but time (issue 55), on the real stack: a 2 conditions x 2 seeds
campaign on one shared base with 4 slots (all four trials on the engine at once, so every fault hits every trial),
whose engine process is first SIGKILLed while requests are in flight, then SIGSTOPped while requests are in flight,
which the campaign's supervisor (orchestrator/pool/supervisor.py) must find and kill within its deadline. Ray
restarts the engine each time with every slot empty; each trial's engine client reopens its slot with the adapter
it last pushed and redoes its calls (orchestrator/trial/actors/engine_recovery.py). No trial fails (one start each,
Tune reports no error) and every trial's non-timing metrics equal those of the same campaign run without a fault,
at every step."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

import pytest

from orchestrator.campaign.expand import load_campaign
from orchestrator.storage import campaign_events
from tests.integration.campaign.injection import run_with_injector
from tests.integration.campaign.test_campaign import _jsonl, _trial_dir, _write
from tests.integration.campaign.test_shared_base import BASE, CONDITIONS, _sealed_step
from tests.integration.trial.test_trial import stable

STEPS = 3  # the SIGKILL in step 1, the SIGSTOP in step 2
SUPERVISOR = {"every_s": 1.0, "answer_s": 8.0, "engine_stall_s": 60.0}
DEADLINE_S = SUPERVISOR["every_s"] + SUPERVISOR["answer_s"] + 3.0  # a probe's period and answer, and slack
RESOURCES = {"rollout_workers": 1, "worker_cpus": 0.5, "learner_cpus": 0.5, "driver_cpus": 0.25,
             "shared_base": {"slots": 4, "supervisor": SUPERVISOR}}


def _campaign(tmp: Path, name: str):
    return load_campaign(_write(tmp, name=name, base={**BASE, "steps": STEPS}, conditions=CONDITIONS, seeds=[0, 1],
                                resources=RESOURCES, wandb={"mode": "disabled"}, max_failures=0))


def _probe(campaign, timeout: float = 5.0):
    """The pool engine's probe answer (its control thread), or None while it does not answer."""
    import ray

    from orchestrator.config.pool_key import engine_name, pool_id

    try:
        handle = ray.get_actor(engine_name(pool_id(campaign.trials[0].trial), 0))
        return ray.get(handle.probe.remote(), timeout=timeout)
    except Exception:  # noqa: BLE001 - not started yet, restarting, stopped
        return None


def _in_flight(campaign, after_step: int, stop: threading.Event):
    """Once some trial sealed `after_step`'s checkpoint: the engine's probe while it has requests in flight."""
    while not stop.is_set():
        if max(_sealed_step(campaign, t.name) for t in campaign.trials) >= after_step:
            answer = _probe(campaign)
            if answer is not None and answer.requests:
                return answer
        time.sleep(0.02)
    raise TimeoutError(f"the campaign ended before the engine had requests in flight after step {after_step}")


def _inject(campaign, stop: threading.Event, done: list, errors: list) -> None:
    """SIGKILL the engine with requests in flight after step 0's checkpoint, then, once it is back, SIGSTOP its
    new process with requests in flight after step 1's; `done` gets (signal, pid, time, requests in flight)."""
    try:
        for after, sig in ((0, signal.SIGKILL), (1, signal.SIGSTOP)):
            answer = _in_flight(campaign, after, stop)
            if done and answer.pid == done[-1][1]:
                raise AssertionError(f"engine pid {answer.pid} answered after it was killed")
            os.kill(answer.pid, sig)
            done.append((sig, answer.pid, time.time(), answer.requests))
    except BaseException as exc:  # surfaced by the test
        errors.append(exc)


def _run(tmp: Path, name: str, faults: bool) -> tuple:
    campaign = _campaign(tmp, name)
    failed, done, errors, seconds = run_with_injector(campaign, _inject if faults else None)
    print(f"campaign {name}: {seconds:.0f} s")
    assert not errors, errors
    return campaign, failed, done


@pytest.fixture(scope="module")
def runs(ray_local, reasoner_dir, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("engine_restart")
    return _run(tmp, "unfaulted", faults=False), _run(tmp, "faulted", faults=True)


def _rows(campaign, name: str) -> list[dict]:
    return [stable(r) for r in _jsonl(_trial_dir(campaign, name) / "metrics.jsonl")]


def test_an_engine_killed_or_stopped_under_requests_costs_no_trial_anything_but_time(runs):
    (clean, clean_failed, _), (faulted, failed, done) = runs
    assert clean_failed == 0 and failed == 0  # Tune: no trial errored
    assert [(sig, n > 0) for sig, _, _, n in done] == [(signal.SIGKILL, True), (signal.SIGSTOP, True)], done
    for t in faulted.trials:
        events = _jsonl(_trial_dir(faulted, t.name) / "events.jsonl")
        assert [e["from_step"] for e in events if e["event"] == "start"] == [0], t.name  # never retried
        assert not (Path(faulted.directory) / t.name / "error.txt").exists()
        # the same metrics as the unfaulted run's, every non-timing value at every step
        assert [r["step"] for r in _rows(faulted, t.name)] == list(range(STEPS))
        assert _rows(faulted, t.name) == _rows(clean, t.name), t.name
    # the trials that had requests in flight reopened their slot with their last adapter and redid them
    reopened = {t.name: [e for e in _jsonl(_trial_dir(faulted, t.name) / "events.jsonl")
                         if e["event"] == "engine_reopened"] for t in faulted.trials}
    assert sum(len(r) for r in reopened.values()) >= 2, reopened
    assert all(e["version"] is not None and e["epoch"] >= 1 for r in reopened.values() for e in r)


def test_the_supervisor_kills_a_stopped_engine_within_its_deadline_and_records_it(runs):
    (clean, _, _), (faulted, _, done) = runs
    events = campaign_events(faulted.directory)
    pool = [e for e in events if e["event"].startswith("pool_actor_")]
    stopped_at, stopped_pid = done[1][2], done[1][1]
    kills = [e for e in pool if e["event"] == "pool_actor_killed"]
    assert len(kills) == 1 and kills[0]["actor"] == "engine0", pool  # the stopped engine, and nothing else
    assert kills[0]["reason"].startswith("no answer to a probe within 8 s")
    print(f"SIGSTOP to the supervisor's kill: {kills[0]['time'] - stopped_at:.1f} s (deadline {DEADLINE_S:g} s)")
    assert 0 < kills[0]["time"] - stopped_at <= DEADLINE_S
    assert not Path(f"/proc/{stopped_pid}").exists()  # Ray killed the stopped process
    # the SIGKILL seen as a death (the SIGSTOP may land before the supervisor saw the engine back from it), the
    # engine back at the end; the learner never touched
    seen = [e["event"] for e in pool]
    assert seen in (["pool_actor_died", "pool_actor_back", "pool_actor_killed", "pool_actor_back"],
                    ["pool_actor_died", "pool_actor_killed", "pool_actor_back"]), pool
    assert {e["actor"] for e in pool} == {"engine0"}
    assert not [e for e in campaign_events(clean.directory) if e["event"].startswith("pool_actor_")]
    # `status` says what happened to the pool
    from orchestrator.jobs.status import render

    assert "engine0: killed by the supervisor 1x, died 1x; last: no answer to a probe" in render(faulted)
    record = json.loads((_trial_dir(faulted, faulted.trials[0].name) / "placement.json").read_text())
    assert record["pool"]["workers"][0]["pid"] == done[0][1]  # the trials opened on the first engine process
