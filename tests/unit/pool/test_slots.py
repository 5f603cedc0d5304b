"""The pool's slot table and what a shared campaign asks Tune for (no Ray, no engine)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.campaign.expand import expand, trial_table
from orchestrator.campaign.schema import Campaign, CampaignConfig
from orchestrator.config.placement import bundles, tune_bundles
from orchestrator.pool.lifecycle import pool_bundles
from orchestrator.pool.slots import SlotTable
from orchestrator.tune.scheduling import concurrency_limit, scheduling


def test_a_trial_gets_its_slot_back_and_a_released_slot_goes_to_the_next():
    table = SlotTable(2)
    a, b = table.acquire("a", "d1"), table.acquire("b", "d2")
    assert (a.slot, a.epoch, b.slot, b.epoch) == (0, 1, 1, 1)
    again = table.acquire("a", "d3")  # a retried trial (a new driver) that still holds its slot: a new epoch
    assert (again.slot, again.epoch, again.trial) == (0, 2, "a")
    with pytest.raises(RuntimeError, match="no free slot for trial c"):
        table.acquire("c", "d4")
    assert table.release("a", epoch=1) is None and table.held() == {"a": 0, "b": 1}  # a late release: nothing
    assert table.release("b") == 1  # the campaign driver's: whatever epoch b holds
    c = table.acquire("c", "d4")
    assert (c.slot, c.epoch) == (1, 2) and table.held() == {"a": 0, "c": 1}
    assert table.release("a", epoch=2) == 0 and table.acquire("d").epoch == 3  # every acquire bumps the epoch


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(0, 5)), max_size=40), st.integers(1, 4))
def test_never_two_holders_of_one_slot_and_every_acquire_a_new_epoch(ops, slots):
    """Against a reference: a dict of holders. A holder keeps its slot; no two trials hold one slot; a slot's
    epochs only grow."""
    table = SlotTable(slots)
    ref: dict[str, int] = {}
    epochs = [0] * slots
    for acquire, k in ops:
        name = f"t{k}"
        if acquire:
            if name in ref or len(ref) < slots:
                lease = table.acquire(name, name)
                assert ref.setdefault(name, lease.slot) == lease.slot and lease.epoch > epochs[lease.slot]
                epochs[lease.slot] = lease.epoch
            else:
                with pytest.raises(RuntimeError):
                    table.acquire(name, name)
        else:
            table.release(name)
            ref.pop(name, None)
        assert table.held() == ref and len(set(ref.values())) == len(ref)


def _campaign(**extra) -> Campaign:
    cfg = CampaignConfig.model_validate({
        "name": "c", "seeds": [0, 1], "conditions": {"A": {}, "B": {"credit": {"advantage_mode": "maxrl"}}},
        "resources": {"rollout_workers": 2, "worker_gpus": 1, "learner_gpus": 1, "shared_base": {"slots": 3}},
        **extra})
    return Campaign(cfg, "c.yaml", "/tmp/c", "/tmp", expand(cfg, "c.yaml"))


def test_shared_trials_ask_tune_for_their_driver_only_and_at_most_slots_run():
    campaign = _campaign()
    trial = campaign.trials[0].trial
    assert tune_bundles(trial) == bundles(trial)[:1] == [{"CPU": trial.resources.driver_cpus}]
    assert pool_bundles(trial) == bundles(trial)[1:]  # the engines' and learner's GPUs, reserved once
    assert sum(b.get("GPU", 0) for b in pool_bundles(trial)) == 3
    assert concurrency_limit(campaign) == 3 and scheduling(campaign).max_concurrent == 3
    assert concurrency_limit(_campaign(max_concurrent_trials=2)) == 2
    assert "shared: 1 bundles, 0.5 CPU, 0 GPU" in trial_table(campaign.trials)
    separate = _campaign(resources={"rollout_workers": 2})
    assert tune_bundles(separate.trials[0].trial) == bundles(separate.trials[0].trial)
    assert concurrency_limit(separate) is None


def test_a_saved_table_reads_back_whole_and_a_missing_file_is_an_empty_table(tmp_path):
    """What a restarted registry reads (orchestrator/pool/slots.py): the same holders, and epochs that go on
    growing, so no epoch is handed out twice."""
    table = SlotTable(3)
    table.acquire("a", "d1"), table.acquire("b", "d2"), table.acquire("a", "d3")
    table.release("b")
    path = tmp_path / "slots.json"
    table.save(path)
    back = SlotTable.load(path, 3)
    assert back.holders == table.holders and back.epochs == table.epochs == [2, 1, 0]
    assert back.acquire("c").slot == 1 and back.epochs[1] == 2  # the freed slot, under a new epoch
    assert SlotTable.load(tmp_path / "none.json", 2).holders == [None, None]


def test_a_pool_of_several_learners_and_engines_reserves_each_once_and_pool_gpus_counts_them():
    """shared_base {learners: L, engines: E}: E engine bundles then L learner bundles, each a separate trial's;
    pool_gpus (what `plan` charges) counts them all, and the defaults are the one-learner pool of before."""
    from orchestrator.config.pool_key import pool_engines, pool_gpus, pool_learners, shared_gpus

    trial = _campaign().trials[0].trial  # 2 rollout workers, 1 GPU each, 1 learner GPU
    assert (pool_engines(trial), pool_learners(trial), pool_gpus(trial)) == (2, 1, 3)
    big = _campaign(resources={"rollout_workers": 2, "worker_gpus": 1, "learner_gpus": 1, "worker_cpus": 2,
                               "shared_base": {"slots": 4, "learners": 2, "engines": 3}}).trials[0].trial
    engine, learner = {"CPU": 2.0, "GPU": 1.0}, {"CPU": big.resources.learner_cpus, "GPU": 1.0}
    assert pool_bundles(big) == [engine] * 3 + [learner] * 2
    assert (pool_engines(big), pool_learners(big), pool_gpus(big)) == (3, 2, 5)
    assert shared_gpus([big, big]) == 5  # one pool
    cpu = _campaign(resources={"rollout_workers": 1, "shared_base": {"slots": 2, "learners": 2}}).trials[0].trial
    assert pool_gpus(cpu) == 0 and len(pool_bundles(cpu)) == 3


def test_a_slot_trains_on_slot_mod_learners():
    from orchestrator.config.pool_key import slot_learner

    assert [slot_learner(s, 1) for s in range(4)] == [0, 0, 0, 0]
    assert [slot_learner(s, 2) for s in range(5)] == [0, 1, 0, 1, 0]
    assert [slot_learner(s, 3) for s in range(4)] == [0, 1, 2, 0]
    with pytest.raises(ValueError):
        slot_learner(0, 0)


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 6), st.integers(0, 6), st.integers(0, 11))
def test_a_trials_engines_are_w_distinct_of_the_pools_and_spread_over_them(engines, workers, slot):
    """slot_engines: `workers` distinct engines of the pool's, the same for a slot every time; with workers =
    engines every trial samples on all of them, in the pool's order (the single-pool behaviour of before)."""
    from orchestrator.config.pool_key import slot_engines

    if workers > engines:
        with pytest.raises(ValueError):
            slot_engines(slot, workers, engines)
        return
    mine = slot_engines(slot, workers, engines)
    assert len(mine) == len(set(mine)) == workers and all(0 <= i < engines for i in mine)
    if workers == engines:
        assert mine == list(range(engines))
    if workers:  # consecutive slots start on consecutive blocks: every engine is some slot's first
        firsts = {slot_engines(s, workers, engines)[0] for s in range(engines)}
        assert firsts == set(range(engines)) or workers > 1


def test_one_worker_trials_on_two_engines_alternate():
    from orchestrator.config.pool_key import slot_engines

    assert [slot_engines(s, 1, 2) for s in range(4)] == [[0], [1], [0], [1]]
    assert [slot_engines(s, 2, 3) for s in range(3)] == [[0, 1], [2, 0], [1, 2]]


def test_the_usage_line_reports_each_learner():
    from orchestrator.pool.lifecycle import usage_line

    engine = {"step_s": 5.0, "up_s": 10.0, "adapter_s": 0.5, "served_calls": 3, "max_in_flight": 2}
    learners = [{"train_s": 2.0, "up_s": 10.0, "export_s": 0.1, "checkpoint_s": 0.2},
                {"train_s": 8.0, "up_s": 10.0, "export_s": 0.3, "checkpoint_s": 0.4}]
    line = usage_line("p", [engine, engine], learners)
    assert "engines decoding 50%, 50% of their 10 s" in line and "6 rollouts" in line
    assert "learner0 training 20% of its 10 s (exports 0.1 s, checkpoints 0.2 s)" in line
    assert "learner1 training 80% of its 10 s (exports 0.3 s, checkpoints 0.4 s)" in line
