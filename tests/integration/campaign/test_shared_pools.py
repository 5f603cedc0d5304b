"""A shared-base campaign that sweeps base models gets one pool per model (orchestrator/config/pool_key.py), on the
real stack: the tiny model at two model seeds (different weights) x 2 seeds, 1 slot a pool, 2 steps,
`max_failures: 0`. Each model's two trials share its pool's engine and learner, one at a time (the second takes the
slot the first released), the two pools run side by side, and the queued trial of model 0 equals the same trial run
separately at every step, while the two models' trials of one seed differ (each pool served its own model).

Model 1's first trial has its driver SIGKILLed after its first step (no retry left: it runs no cleanup and never
comes back): the campaign driver frees its slot as Tune sees it die (orchestrator/tune/slot_owner.py), so model 1's
queued trial takes the slot at once, under the next epoch, instead of waiting out its setup deadline (model 1's
pool: model 0's first trial runs whole beside it, so the pools still run side by side)."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

import pytest

from orchestrator.campaign.expand import load_campaign
from orchestrator.config.pool_key import pool_id
from orchestrator.storage import campaign_events
from orchestrator.tune.launch import run_campaign, run_single_trial
from tests.integration.campaign.test_campaign import _jsonl, _trial_dir, _write
from tests.integration.trial.test_trial import stable

STEPS = 2
KILLED_MODEL = 1  # the model seed whose first trial's driver is killed
RESOURCES = {"rollout_workers": 1, "worker_cpus": 0.5, "learner_cpus": 0.5, "driver_cpus": 0.25,
             "shared_base": {"slots": 1}}
BASE = {"steps": STEPS, "model": {"name": "tiny"}, "task": {"name": "arithmetic"}, "eval": {"every": 0},
        "rollout": {"prompts_per_step": 4, "n": 4, "max_tokens": 4, "skip_uninformative": False},
        "checkpoint": {"every": STEPS, "keep": 2}}


def _kill_after_first_step(campaign, stop: threading.Event, killed: list, errors: list) -> None:
    """SIGKILL the driver of model 1's first trial to write a step's row (the step after it is still running)."""
    try:
        names = [t.name for t in campaign.trials if t.trial.model.tiny_seed == KILLED_MODEL]
        while not stop.is_set():
            for name in names:
                if _jsonl(_trial_dir(campaign, name) / "metrics.jsonl"):
                    pid = json.loads((_trial_dir(campaign, name) / "placement.json").read_text())["driver"]["pid"]
                    os.kill(pid, signal.SIGKILL)
                    killed.append((name, time.time()))
                    return
            time.sleep(0.02)
        raise TimeoutError(f"the campaign ended before a trial of model {KILLED_MODEL} finished a step")
    except BaseException as exc:  # surfaced by the fixture
        errors.append(exc)


@pytest.fixture(scope="module")
def pools_campaign(ray_local, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("pools")
    campaign = load_campaign(_write(tmp, name="pools", base=BASE, conditions={"grpo": {}}, seeds=[0, 1],
                                    sweep={"model.tiny_seed": [0, 1]}, resources=RESOURCES,
                                    wandb={"mode": "disabled"}, max_failures=0))
    stop, killed, errors = threading.Event(), [], []
    injector = threading.Thread(target=_kill_after_first_step, args=(campaign, stop, killed, errors), daemon=True)
    injector.start()
    try:
        failed = run_campaign(campaign)
    finally:
        stop.set()
        injector.join(timeout=10)
    assert not errors and len(killed) == 1, errors
    assert failed == 1  # the killed trial: no retry left
    return campaign, tmp, killed[0]


def _record(campaign, name: str) -> dict:
    tdir = _trial_dir(campaign, name)
    events = [e for e in _jsonl(tdir / "events.jsonl") if "time" in e]  # a killed trial has no end
    return {"placement": json.loads((tdir / "placement.json").read_text()), "span": (events[0]["time"],
                                                                                      events[-1]["time"]),
            "rows": [stable(r) for r in _jsonl(tdir / "metrics.jsonl")]}


def test_one_pool_per_model_each_serving_its_trials_one_at_a_time(pools_campaign):
    campaign, _, (killed, killed_at) = pools_campaign
    by_model: dict[int, list] = {}
    for t in campaign.trials:
        by_model.setdefault(t.trial.model.tiny_seed, []).append(t)
    assert sorted(by_model) == [0, 1] and all(len(v) == 2 for v in by_model.values())
    records = {t.name: _record(campaign, t.name) for t in campaign.trials}
    assert all([r["step"] for r in rec["rows"]] == list(range(STEPS)) for n, rec in records.items() if n != killed)
    assert [r["step"] for r in records[killed]["rows"]] == [0]
    records[killed]["span"] = (records[killed]["span"][0], killed_at)  # it ran until the kill
    ids = {}
    for seed, trials in by_model.items():
        pools = [records[t.name]["placement"]["pool"] for t in trials]
        # the model's trials: one pool (its id from their config), one engine actor, one learner actor
        assert {p["id"] for p in pools} == {pool_id(trials[0].trial)}
        assert len({p["learner"]["actor_id"] for p in pools}) == 1
        assert len({p["workers"][0]["actor_id"] for p in pools}) == 1
        ids[seed] = (pools[0]["id"], pools[0]["learner"]["actor_id"], pools[0]["learner"]["pid"],
                     pools[0]["workers"][0]["pid"], pools[0]["learner"]["placement_group"])
        # 1 slot: the pool's two trials never ran at once
        (a0, b0), (a1, b1) = (records[t.name]["span"] for t in trials)
        assert b0 <= a1 or b1 <= a0, (trials[0].name, trials[1].name)
    # two pools: every id, actor, process and placement group differs
    assert all(x != y for x, y in zip(ids[0], ids[1], strict=True)), ids
    # side by side: some trial of one pool ran while one of the other did
    spans = {s: [records[t.name]["span"] for t in by_model[s]] for s in by_model}
    assert any(a < d and c < b for a, b in spans[0] for c, d in spans[1]), spans


def test_a_killed_drivers_slot_comes_back_at_once_and_the_queued_trial_finishes(pools_campaign):
    campaign, _, (killed, _) = pools_campaign
    queued = next(t.name for t in campaign.trials if t.trial.model.tiny_seed == KILLED_MODEL and t.name != killed)
    slot = {n: [e for e in _jsonl(_trial_dir(campaign, n) / "events.jsonl") if e["event"] == "slot"]
            for n in (killed, queued)}
    assert len(slot[killed]) == len(slot[queued]) == 1  # one attempt each: no retry
    (dead,), (took,) = slot[killed], slot[queued]
    # the driver freed the dead trial's slot (its process did not: SIGKILL); the queued trial took the same slot
    # under the next epoch without waiting for it (the setup deadline is an hour), and ran every step
    released = [e for e in campaign_events(campaign.directory) if e["event"] == "slot_release"]
    assert [(e["slot"], e["why"]) for e in released if e["trial"] == killed] == [(dead["slot"], "error")]
    assert (took["pool"], took["slot"], took["epoch"]) == (dead["pool"], dead["slot"], dead["epoch"] + 1)
    assert took["waited_s"] < 5.0, took
    assert [r["step"] for r in _record(campaign, queued)["rows"]] == list(range(STEPS))
    assert json.loads((_trial_dir(campaign, queued) / "placement.json").read_text())["pool"]["epoch"] == took["epoch"]


def test_each_pool_serves_its_own_model_as_a_separate_trial_would(pools_campaign):
    campaign, tmp, _ = pools_campaign
    from orchestrator.config.trial import TrialConfig

    rows = {t.name: _record(campaign, t.name)["rows"] for t in campaign.trials}
    by_key = {(t.trial.model.tiny_seed, t.seed): t for t in campaign.trials}
    # the two models' trials of one seed sample different rollouts (different weights): step 0 differs
    assert rows[by_key[0, 0].name][0] != rows[by_key[1, 0].name][0]
    # the queued trial of model 0 (its pool's slot reused) equals its separate twin: pool 0 served model 0 exactly;
    # with step 0 differing above, pool 1 did not serve model 0 (one twin: each costs a trial start in CI)
    for key in ((0, 1),):
        twin = by_key[key]
        name = f"alone{key[0]}{key[1]}"
        cfg = TrialConfig.model_validate({**twin.config, "output_dir": None, "name": name,
                                          "resources": {**twin.config["resources"], "shared_base": None}})
        assert run_single_trial(cfg, tmp / name) is not None
        alone = [stable(r) for r in _jsonl(Path(tmp / name / name / "trial" / "metrics.jsonl"))]
        assert [r["step"] for r in alone] == list(range(STEPS))
        assert alone == rows[twin.name], twin.name
