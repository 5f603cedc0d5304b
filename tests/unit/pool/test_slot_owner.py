"""The campaign driver owns the pool's slots (orchestrator/tune/slot_owner.py): Tune's hooks driven as its controller
drives them (fake trials and controller of tests/unit/tune, no Ray) free a trial's slot when it pauses, fails or ends,
whatever its own process did (none of these trials releases anything itself: a SIGKILLed driver), so the next trial
finds the slot free at once. And `connect` (orchestrator/trial/actors/shared.py), failing after it took the slot,
gives the slot back."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from ray.tune.experiment import Trial
from ray.tune.schedulers import TrialScheduler

from orchestrator.campaign.expand import expand
from orchestrator.campaign.schema import Campaign, CampaignConfig
from orchestrator.pool.slots import SlotTable
from orchestrator.storage import campaign_events
from orchestrator.tune.scheduling import scheduling
from orchestrator.tune.slot_owner import SlotOwner
from tests.unit.tune.fake_steps import add_trials, report_step


def _campaign(directory: str, **extra) -> Campaign:
    cfg = CampaignConfig.model_validate({
        "name": "c", "seeds": [0, 1], "conditions": {"A": {}},
        "resources": {"rollout_workers": 1, "worker_gpus": 1, "learner_gpus": 1, "shared_base": {"slots": 1}},
        **extra})
    return Campaign(cfg, "c.yaml", directory, "/tmp", expand(cfg, "c.yaml"))


def _owner(campaign: Campaign, table: SlotTable) -> SlotOwner:
    owner = scheduling(campaign).owner
    assert isinstance(owner, SlotOwner) and set(owner.pools) == {t.name for t in campaign.trials}
    owner.registry = lambda pool: table.release  # the pool's registry actor, in process
    return owner


def test_the_driver_frees_a_paused_trials_slot_for_the_next_one_lockstep(tmp_path):
    """One slot, two trials, lockstep rounds of 2 steps: they take turns, each start acquiring the slot (as the
    trial's connect does) and no trial ever giving it back itself; every turn finds the slot free."""
    campaign = _campaign(str(tmp_path), base={"steps": 4},
                         schedule={"mode": "lockstep", "round_steps": 2})
    plan, table = scheduling(campaign), SlotTable(1)
    sched, owner = plan.scheduler, _owner(campaign, table)
    trials, ctl = add_trials(sched, [t.name for t in campaign.trials])
    turns = []
    while (t := sched.choose_trial_to_run(ctl)) is not None:
        t.status = Trial.RUNNING
        turns.append((t.config["trial"], table.acquire(t.config["trial"]).epoch))  # raises when none is free
        while t.status == Trial.RUNNING:
            decision = report_step(sched, ctl, t, {"step": t.step, "time_this_iter_s": 1.0}, 4)
            if t.status == Trial.TERMINATED:
                owner.on_trial_complete(0, trials, t)
            elif decision == TrialScheduler.PAUSE:
                t.status = Trial.PAUSED
            owner.on_step_end(0, trials)  # the controller's step boundary
        owner.on_step_begin(0, trials)
    # the first pauses after round 1; the second, finishing round 1 last, goes on to its end; then the first
    a, b = (t.name for t in campaign.trials)
    assert turns == [(a, 1), (b, 2), (a, 3)] and table.held() == {}
    released = [(e["trial"], e["why"]) for e in campaign_events(str(tmp_path)) if e["event"] == "slot_release"]
    assert released == [(a, "pause"), (b, "end"), (a, "end")]


@pytest.mark.parametrize("hook", ["on_trial_error", "on_trial_recover", "on_trial_complete"])
def test_the_driver_frees_the_slot_of_a_trial_that_failed_or_ended(tmp_path, hook):
    """FIFO (Tune's own limiter, one pool): a trial whose driver died holding the slot, failed for good (ERROR),
    failed with a retry left, or ended: the next trial's acquire finds the slot free."""
    campaign = _campaign(str(tmp_path))
    table = SlotTable(1)
    owner = _owner(campaign, table)
    first, second = (t.name for t in campaign.trials)
    table.acquire(first, "killed-driver")
    assert table.try_acquire(second) is None  # what the second trial found before: no free slot, for good
    getattr(owner, hook)(0, [], SimpleNamespace(config={"trial": first}, status=Trial.ERROR))
    assert table.try_acquire(second).slot == 0
    why = {"on_trial_error": "error", "on_trial_recover": "error", "on_trial_complete": "end"}[hook]
    assert [(e["trial"], e["slot"], e["why"]) for e in campaign_events(str(tmp_path))
            if e["event"] == "slot_release"] == [(first, 0, why)]


def test_a_release_that_fails_is_one_line_and_the_campaign_goes_on(tmp_path, capsys):
    campaign = _campaign(str(tmp_path))
    owner = scheduling(campaign).owner

    def gone(pool):
        raise ValueError(f"Failed to look up actor with name '{pool}'")

    owner.registry = gone
    assert owner.release(campaign.trials[0].name, "end") is None
    assert capsys.readouterr().out.count("\n") == 1


# ------------------------------------------------------------------------------------------ connect
class _Remote:
    """A Ray actor handle's method, answered in process (`.remote` returns the value, `ray.get` passes it on)."""

    def __init__(self, fn):
        self.remote = fn


class _Actor:
    def __init__(self, **methods):
        for name, fn in methods.items():
            setattr(self, name, _Remote(fn))


def _fake_pool(monkeypatch, table: SlotTable, open_fails: bool, engines: tuple[int, ...] = (0,),
               learners: tuple[int, ...] = (0,), shape: tuple[int, int] = (1, 1)):
    """A pool of shape (engines, learners) whose named actors are only `engines` and `learners` (by index)."""
    import orchestrator.trial.actors.shared as client

    def open_slot(lease, **settings):
        if open_fails:
            raise RuntimeError("the learner could not build the slot's adapter")

    actors = {
        "slots": _Actor(engines=lambda: shape[0], learners=lambda: shape[1], try_acquire=table.try_acquire,
                        acquire=table.acquire, release=table.release),
        **{f"engine{i}": _Actor(ready=lambda: True, drop=lambda lease: None, load_policy=lambda lease, u: u)
           for i in engines},
        **{f"learner{j}": _Actor(ready=lambda: True, open=open_slot, export_policy=lambda lease, v: v)
           for j in learners},
    }
    fake_ray = SimpleNamespace(
        get_actor=lambda name: actors[name.rsplit("/", 1)[-1]],
        get=lambda refs, timeout=None: refs,
        get_runtime_context=lambda: SimpleNamespace(get_actor_id=lambda: "driver-1"))
    monkeypatch.setattr(client, "ray", fake_ray)
    monkeypatch.setattr(client.PoolEnginesClient, "load_policy", lambda self, update: update)
    return client, SimpleNamespace(get=lambda refs, phase, named: refs)


def test_connect_failing_after_the_acquire_gives_the_slot_back(monkeypatch, tmp_path):
    cfg = _campaign(str(tmp_path)).trials[0].trial
    table = SlotTable(1)
    client, calls = _fake_pool(monkeypatch, table, open_fails=True)
    with pytest.raises(RuntimeError, match="could not build"):
        client.connect(cfg, calls)
    assert table.held() == {}  # the next trial (or this one's retry) finds the slot free
    client, calls = _fake_pool(monkeypatch, table, open_fails=False)
    pool = client.connect(cfg, calls)
    assert (pool.slot, pool.lease.epoch, table.held()) == (0, 2, {cfg.name: 0})
    # the trial's backend on the pool (orchestrator/trial/actors/backend.py): no rollout worker of its own, its
    # opening recorded as one `slot` event, only v0 before its first push, and closing it frees the slot
    assert pool.workers == [] and pool.engines.initial_versions == {0}
    assert [{k: e[k] for k in ("event", "pool", "slot", "epoch")} for e in pool.events] == [
        {"event": "slot", "pool": pool.pool, "slot": 0, "epoch": 2}]
    pool.close()
    assert table.held() == {}


def test_connect_takes_its_slots_learner_and_engines_only(monkeypatch, tmp_path):
    """A pool of 2 engines and 2 learners: the trial that gets slot 3 reaches learner 1 and engine 1 only (the
    fake pool names no other actor: any other lookup fails) and records them."""
    cfg = _campaign(str(tmp_path)).trials[0].trial
    table = SlotTable(4)
    for other in ("a", "b", "c"):
        table.acquire(other)
    client, calls = _fake_pool(monkeypatch, table, open_fails=False, engines=(1,), learners=(1,), shape=(2, 2))
    pool = client.connect(cfg, calls)
    assert (pool.slot, pool.learner.index, pool.engines.indices) == (3, 1, [1])
    assert {k: pool.events[0][k] for k in ("slot", "learner", "engines")} == {"slot": 3, "learner": 1, "engines": [1]}
    assert [n for n, _ in pool.engines.names] == ["pool.engine[1]"]
    pool.close()
    assert table.held() == {"a": 0, "b": 1, "c": 2}
