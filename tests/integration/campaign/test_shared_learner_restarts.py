"""The pool's learner restarting is the pool's fault, not the trials' (orchestrator/trial/actors/shared.py:
PoolLearnerClient, orchestrator/trial/loop.py): a shared campaign whose learner process is SIGKILLed three times
(the pool's whole restart budget, orchestrator/pool/lifecycle.py:RESTARTS) under trials with `max_failures: 1`.

Two slots, four trials: a one_step_off trial and an async trial (`rollout.mode: async`, max_staleness 2, paced;
issue 57) run first, side by side, and meet the three kills, each once both have sealed one of their first three
checkpoints, mid-step (a training step in flight beside the next steps' generation, whose prefetched
batches the checkpoint holds: one for one_step_off, up to two for async k = 2). Their twins (the same configs under
other condition names) run after them, unfaulted, on the learner's fourth process. Every kill is absorbed inside
each faulted trial's process: it waits for the learner, reopens its slot, restores its newest checkpoint (the
batches sampled ahead included, as a Tune retry would) and carries on. Tune sees no error, each trial starts once,
and each faulted trial's metrics equal its twin's at every step, bit for bit. Every step also passed the leak guard
(orchestrator/trial/actors/leak_guard.py): the drift of batches one or two policies behind the learner stays far
below its bound."""

from __future__ import annotations

import json
import os
import signal
import threading
import time

import pytest

from orchestrator.campaign.expand import load_campaign
from orchestrator.trial.actors.leak_guard import GAP_METRIC, LEAK_GAP
from tests.integration.campaign.injection import run_with_injector
from tests.integration.campaign.test_campaign import _jsonl, _trial_dir, _write
from tests.integration.campaign.test_shared_base import _sealed_step
from tests.integration.trial.test_trial import stable

STEPS = 4  # a kill after each of the first three checkpoints, one step left after the last
KILLS = (0, 1, 2)  # after the checkpoint of these steps
RESOURCES = {"rollout_workers": 1, "worker_cpus": 0.5, "learner_cpus": 0.5, "driver_cpus": 0.25,
             "shared_base": {"slots": 2}}
BASE = {"steps": STEPS, "model": {"name": "tiny-reasoner"}, "task": {"name": "chain"},
        "rollout": {"prompts_per_step": 4, "n": 4, "max_tokens": 24, "skip_uninformative": False,
                    "mode": "one_step_off", "engine": {"in_process": True}},
        "eval": {"every": 0}, "checkpoint": {"every": 1, "keep": 2}}
MODES = {  # name -> (rollout settings over BASE's, the staleness the trained batches reach)
    "one_step_off": ({"mode": "one_step_off"}, 1),
    "async_k2": ({"mode": "async", "max_staleness": 2}, 2),  # paced: the checkpoint holds two batches ahead
}
# the faulted pair first (Tune starts trials in this order, two slots: the pair runs together), their twins after
FAULTED, TWIN = {m: f"{m}_faulted" for m in MODES}, {m: f"{m}_twin" for m in MODES}
CONDITIONS = {**{FAULTED[m]: {"rollout": r} for m, (r, _) in MODES.items()},
              **{TWIN[m]: {"rollout": r} for m, (r, _) in MODES.items()}}


def _learner_pid(campaign, name: str) -> int:
    return json.loads((_trial_dir(campaign, name) / "placement.json").read_text())["pool"]["learner"]["pid"]


def _kill_learner(campaign, stop: threading.Event, done: list, errors: list) -> None:
    """SIGKILL the pool's learner once both faulted trials have sealed each step of KILLS, each time in the learner
    process both placed last (a new one after each restart, once both rewound onto it), so that every kill hits
    both. `done`: (pid, time)."""
    try:
        names = [_name(campaign, c) for c in FAULTED.values()]
        for step in KILLS:
            while not all(_placed(campaign, n) and _sealed_step(campaign, n) >= step
                          and not (done and _learner_pid(campaign, n) == done[-1][0]) for n in names):
                if stop.wait(0.05):
                    raise TimeoutError(f"the campaign ended before {names} sealed step {step} on a new learner")
            pids = {_learner_pid(campaign, n) for n in names}
            assert len(pids) == 1, pids  # one pool learner
            pid = pids.pop()
            os.kill(pid, signal.SIGKILL)
            done.append((pid, time.time()))
    except BaseException as exc:  # surfaced by the test
        errors.append(exc)


def _placed(campaign, name: str) -> bool:
    return (_trial_dir(campaign, name) / "placement.json").exists()


def _name(campaign, condition: str) -> str:
    return next(t.name for t in campaign.trials if t.condition == condition)


@pytest.fixture(scope="module")
def restarted(ray_local, reasoner_dir, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("learner-restarts")
    campaign = load_campaign(_write(tmp, name="restarts", base=BASE, conditions=CONDITIONS, seeds=[0],
                                    resources=RESOURCES, wandb={"mode": "disabled"}, max_failures=1))
    unfinished, done, errors, seconds = run_with_injector(campaign, _kill_learner)
    print(f"campaign with {len(done)} learner kills: {seconds:.0f} s")
    assert not errors and len(done) == len(KILLS), (errors, done)
    return campaign, unfinished, done


def test_three_learner_restarts_cost_no_trial_a_retry(restarted):
    campaign, unfinished, done = restarted
    assert unfinished == 0  # every trial finished
    faulted = {_name(campaign, c) for c in FAULTED.values()}
    for t in campaign.trials:
        events = _jsonl(_trial_dir(campaign, t.name) / "events.jsonl")
        starts = [e for e in events if e["event"] == "start"]
        restarts = [e for e in events if e["event"] == "learner_restart"]
        assert len(starts) == 1 and starts[0]["from_step"] == 0, (t.name, starts)  # Tune never retried it
        assert events[-1]["event"] == "end"
        if t.name not in faulted:
            assert not restarts
            continue
        # one rewind per kill, each after it, each to a checkpoint at or after the one the kill waited for
        assert len(restarts) == len(KILLS), (t.name, restarts)
        assert all(r["time"] > kill[1] for r, kill in zip(restarts, done, strict=True))
        assert all(r["from_step"] >= step + 1 for r, step in zip(restarts, KILLS, strict=True)), (t.name, restarts)
        assert all("restarted under the trial" in r["reason"] for r in restarts)
    # Tune's own view: no trial errored (error.txt is what Tune writes for a failed attempt)
    import glob

    assert not glob.glob(f"{campaign.directory}/*/error*.txt")
    # the last placements of the faulted trials name a learner process none of the kills hit
    assert all(_learner_pid(campaign, name) not in {d[0] for d in done} for name in faulted)


@pytest.mark.parametrize("mode", list(MODES))
def test_the_faulted_trial_equals_the_unfaulted_one_at_every_step(restarted, mode):
    campaign, _, _ = restarted
    faulted, twin = _name(campaign, FAULTED[mode]), _name(campaign, TWIN[mode])
    rows = {name: _jsonl(_trial_dir(campaign, name) / "metrics.jsonl") for name in (faulted, twin)}
    assert [r["step"] for r in rows[faulted]] == list(range(STEPS))
    assert [stable(r) for r in rows[faulted]] == [stable(r) for r in rows[twin]]
    # batches trained up to one (one_step_off) or two (async k = 2) policies behind, and the leak guard let every
    # step through
    stale = MODES[mode][1]
    assert max(r.get("rollout/staleness", 0) for r in rows[twin]) == stale
    gaps = [r[GAP_METRIC] for r in rows[faulted] + rows[twin] if GAP_METRIC in r]
    print(f"{mode} log-prob gap per token (mean over a step): max {max(gaps):.3g}, bound {LEAK_GAP:g}")
    assert max(gaps) < LEAK_GAP / 10
