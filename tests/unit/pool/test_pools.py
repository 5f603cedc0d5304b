"""A shared-base campaign that sweeps base models: one pool per model (pool ids from the trial's config alone), the
refusal of every other difference, and each pool's slots as Tune's cap: a searcher and scheduler driven as Tune
drives them (fake trials, no Ray) never run more than `slots` trials of a pool at once, never hold back a trial
whose pool has a free slot, and run every trial (no deadlock), FIFO and lockstep."""

from __future__ import annotations

import random
import tempfile
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from ray.tune.experiment import Trial
from ray.tune.schedulers import TrialScheduler

from orchestrator.campaign.expand import expand
from orchestrator.campaign.schema import Campaign, CampaignConfig
from orchestrator.campaign.shared import check_shared_base
from orchestrator.config.errors import UserError
from orchestrator.config.pool_key import pool_groups, pool_id
from orchestrator.config.trial import TrialConfig
from orchestrator.tune.adaptive import CampaignSearcher
from orchestrator.tune.lockstep import LockstepScheduler
from orchestrator.tune.pool_fifo import PoolFifo
from orchestrator.tune.scheduling import concurrency_limit, scheduling, slot_cap
from orchestrator.tune.slot_cap import SlotCap
from tests.unit.tune.fake_steps import report_step

MODELS = ["Qwen/Qwen2.5-0.5B", "Qwen/Qwen3-4B-Instruct-2507"]


def _campaign(slots: int = 2, seeds=(0, 1), sweep=None, conditions=None, directory: str = "/tmp/c",
              **extra) -> Campaign:
    cfg = CampaignConfig.model_validate({
        "name": "c", "seeds": list(seeds),
        "conditions": conditions or {"A": {}, "B": {"credit": {"advantage_mode": "maxrl"}}},
        "sweep": {"model.name": MODELS} if sweep is None else sweep,
        "resources": {"rollout_workers": 1, "worker_gpus": 1, "learner_gpus": 1, "shared_base": {"slots": slots}},
        **extra})
    trials = expand(cfg, "c.yaml")
    check_shared_base(cfg, trials, "c.yaml")  # what load_campaign refuses
    return Campaign(cfg, "c.yaml", directory, "/tmp", trials)


# ------------------------------------------------------------------------------------------ pool ids
def test_a_model_sweep_expands_into_one_pool_per_model():
    campaign = _campaign()
    groups = pool_groups(t.trial for t in campaign.trials)
    assert len(groups) == 2 and sorted(len(g) for g in groups.values()) == [4, 4]
    for pid, cfgs in groups.items():
        assert {c.model.name for c in cfgs} == {cfgs[0].model.name}  # a pool serves one model
        assert pid.startswith(cfgs[0].model.name.rsplit("/", 1)[-1].lower() + "-")  # readable: the model's slug
    assert sorted(groups)[0].startswith("qwen2.5-0.5b-") and sorted(groups)[1].startswith("qwen3-4b-instruct-2507-")


def test_pool_id_is_a_pure_function_of_the_pool_keys():
    base = TrialConfig.model_validate({"model": {"name": "tiny"}, "task": {"name": "arithmetic"},
                                       "resources": {"shared_base": {"slots": 2}}})
    same = TrialConfig.model_validate({**base.model_dump(mode="json"), "name": "other", "seed": 7,
                                       "credit": {"advantage_mode": "maxrl"}, "output_dir": "/x"})
    assert pool_id(base) == pool_id(same) == pool_id(TrialConfig.model_validate(base.model_dump(mode="json")))
    assert pool_id(base) == "tiny-" + pool_id(base).split("-")[-1] and len(pool_id(base).split("-")[-1]) == 8
    seeded = TrialConfig.model_validate({**base.model_dump(mode="json"), "model": {"name": "tiny", "tiny_seed": 1}})
    longer = TrialConfig.model_validate({**base.model_dump(mode="json"),
                                         "model": {"name": "tiny", "max_model_len": 256}})
    assert len({pool_id(base), pool_id(seeded), pool_id(longer)}) == 3  # any model difference: another pool
    assert pool_groups([base]) == {pool_id(base): [base]}
    assert pool_groups([TrialConfig()]) == {}  # a separate trial needs no pool


def test_every_trial_of_one_model_gets_the_id_its_pool_was_started_under():
    # the campaign starts its pools from the first trial of each group; every trial (a retry, a resumed campaign
    # expanding the file again) computes its own id from its config and finds the same pool
    first, again = _campaign(), _campaign()
    started = {pid: group[0] for pid, group in pool_groups(t.trial for t in first.trials).items()}
    for t in again.trials:
        assert started[pool_id(t.trial)].model == t.trial.model


def test_a_difference_that_is_not_the_model_is_still_refused():
    with pytest.raises(UserError) as e:
        _campaign(conditions={"A": {}, "B": {"learner": {"lora": {"rank": 16}}}})
    msg = str(e.value)
    assert "\n" not in msg and "conditions.B.learner.lora.rank" in msg and "only the model may differ" in msg
    with pytest.raises(UserError, match="sweep.rollout.num_workers: .* must agree on rollout.num_workers"):
        _campaign(sweep={"model.name": MODELS, "rollout.num_workers": [1, 2]}, resources=None,
                  base={"resources": {"shared_base": {"slots": 2}}})
    with pytest.raises(UserError, match="learner.mode 'lora'"):
        _campaign(conditions={"A": {"learner": {"mode": "full"}}})


# ------------------------------------------------------------------------------------------ concurrency
def test_tune_runs_every_pools_slots_in_all_and_counts_each_pool():
    campaign = _campaign(slots=3)
    assert concurrency_limit(campaign) == 6  # two pools of 3 slots
    assert concurrency_limit(_campaign(slots=3, max_concurrent_trials=4)) == 4
    assert concurrency_limit(_campaign(slots=3, sweep={})) == 3  # one model: one pool, as before
    plan = scheduling(campaign)
    assert isinstance(plan.scheduler, PoolFifo) and plan.max_concurrent is None  # Tune's limiter cannot count pools
    assert isinstance(plan.search_alg, CampaignSearcher)
    one = scheduling(_campaign(slots=3, sweep={}))
    assert one.scheduler is None and one.search_alg is None and one.max_concurrent == 3  # as before
    cap = slot_cap(campaign)
    assert cap.slots == 3 and set(cap.pool_of) == {t.name for t in campaign.trials}


def test_slot_cap_counts_the_trials_own_pool():
    cap = SlotCap(limit=3, slots=1, pool_of={"a0": "A", "a1": "A", "b0": "B", "b1": "B", "c0": "C"})
    assert not cap.allows("a1", {"a0"}) and cap.allows("b0", {"a0"}) and cap.allows("a0", {"a0"})
    assert not cap.allows("c0", {"a0", "b0", "x"})  # the limit in all
    assert SlotCap(limit=2).allows(None, {"a"}) and not SlotCap(limit=2).allows(None, {"a", "b"})


class _Controller:
    def __init__(self):
        self.trials: list = []

    def get_trials(self):
        return self.trials

    def stop_trial(self, trial):
        trial.status = Trial.TERMINATED


def _simulate(campaign: Campaign, plan, steps: int, rng: random.Random) -> list[dict[str, int]]:
    """Drive the searcher and scheduler as Tune does: ask for a trial while none is pending, start every pending
    trial and the one the scheduler chooses, feed one step's result to a running trial picked at random, end it
    at its last step (PAUSE / STOP as the scheduler says). Returns the running trials per pool after each event;
    asserts that a trial of a pool with a free slot is never left unissued while the searcher says wait."""
    ctl, cap = _Controller(), slot_cap(campaign)
    pool_of, sched, search = cap.pool_of, plan.scheduler, plan.search_alg
    seen, n = [], 0
    for _ in range(10_000):
        if not any(t.status == Trial.PENDING for t in ctl.trials):
            n += 1
            got = search.suggest(f"id{n}")
            if isinstance(got, dict):
                t = SimpleNamespace(trial_id=f"id{n}", config=got, status=Trial.PENDING, last_result={}, step=0)
                ctl.trials.append(t)
                sched.on_trial_add(ctl, t)
            elif got is None:  # waiting: every trial not yet created belongs to a full pool (or the limit is hit)
                running = [t.config["trial"] for t in ctl.trials if t.status in (Trial.RUNNING, Trial.PENDING)]
                created = {t.config["trial"] for t in ctl.trials}
                for name in (x.name for x in campaign.trials if x.name not in created):
                    assert not cap.allows(name, running), (name, running)
        chosen = sched.choose_trial_to_run(ctl)
        for t in ctl.trials:
            if t.status == Trial.PENDING or t is chosen:
                t.status = Trial.RUNNING
        running = [t for t in ctl.trials if t.status == Trial.RUNNING]
        per_pool: dict[str, int] = {}
        for t in running:
            per_pool[pool_of[t.config["trial"]]] = per_pool.get(pool_of[t.config["trial"]], 0) + 1
        seen.append(per_pool)
        if not running:
            if all(t.status == Trial.TERMINATED for t in ctl.trials) and len(ctl.trials) == len(campaign.trials):
                return seen
            continue
        t = rng.choice(running)
        result = {"step": t.step, "time_this_iter_s": 1.0}
        decision = report_step(sched, ctl, t, result, steps)
        if t.status == Trial.TERMINATED:
            search.on_trial_complete(t.trial_id, result)
        elif decision == TrialScheduler.PAUSE:
            t.status = Trial.PAUSED
    raise AssertionError("the campaign did not finish: a deadlock")


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 3), st.integers(1, 3), st.integers(0, 10**6), st.booleans())
def test_no_pool_ever_runs_more_than_its_slots_and_every_trial_runs(slots, seeds, seed, lockstep):
    extra = {"schedule": {"mode": "lockstep", "round_steps": 2}} if lockstep else {}
    with tempfile.TemporaryDirectory() as directory:  # events.jsonl; tmp_path is one folder for every example
        campaign = _campaign(slots=slots, seeds=range(seeds), directory=directory, **extra)
        seen = _simulate(campaign, scheduling(campaign), steps=4, rng=random.Random(seed))
    assert max(max(p.values(), default=0) for p in seen) <= slots
    # both pools ran side by side whenever each had a trial to run (at the start: each fills its slots)
    assert any(len(p) == 2 for p in seen)


def test_fifo_never_puts_a_second_trial_on_a_full_pool_while_another_pools_trial_waits():
    # conditions over the model: A and B on the first model, C on the second, 1 slot a pool. In the searcher's
    # order (A, B, C) Tune's limiter at 2 would start A and B on the first pool (B finding no slot); the
    # searcher gives the second pool its trial instead, and B waits for A's slot
    campaign = _campaign(slots=1, seeds=(0,), sweep={}, base={"model": {"name": MODELS[0]}},
                         conditions={"A": {}, "B": {"credit": {"advantage_mode": "maxrl"}},
                                     "C": {"model": {"name": MODELS[1]}}})
    assert concurrency_limit(campaign) == 2
    plan = scheduling(campaign)
    got = [plan.search_alg.suggest(f"id{i}") for i in range(3)]
    assert got == [{"trial": "A_s0"}, {"trial": "C_s0"}, None]
    plan.scheduler.on_trial_complete(None, SimpleNamespace(config={"trial": "A_s0"}), {})
    assert plan.search_alg.suggest("id3") == {"trial": "B_s0"}  # A's slot, freed


def test_the_searcher_picks_the_first_trial_whose_pool_has_a_free_slot():
    cap = SlotCap(limit=None, slots=2, pool_of={"a0": "A", "a1": "A", "a2": "A", "b0": "B", "b1": "B"})
    search = CampaignSearcher(list(cap.pool_of), dict.fromkeys(cap.pool_of, 0), dict.fromkeys(cap.pool_of, "c"),
                              "/nonexistent", scheduler=PoolFifo(cap))
    got = [search.suggest(f"id{i}") for i in range(5)]
    assert got == [{"trial": "a0"}, {"trial": "a1"}, {"trial": "b0"}, {"trial": "b1"}, None]


def test_lockstep_takes_a_paused_trial_of_a_pool_with_a_free_slot(tmp_path):
    cap = SlotCap(limit=None, slots=1, pool_of={"a0": "A", "a1": "A", "b0": "B"})
    sched = LockstepScheduler(2, dict.fromkeys(cap.pool_of, 4), dict.fromkeys(cap.pool_of, 1.0), str(tmp_path),
                              slots=cap)
    trials = [SimpleNamespace(config={"trial": n}, status=Trial.PAUSED, last_result={}) for n in ("a0", "a1", "b0")]
    sched.rounds = dict.fromkeys(cap.pool_of, 0)
    sched.loaded, sched.active = True, {"a0"}
    trials[0].status = Trial.RUNNING
    ctl = _Controller()
    ctl.trials = trials
    assert sched.choose_trial_to_run(ctl) is trials[2]  # a1's pool is full: b0 goes first
    trials[2].status = Trial.RUNNING
    assert sched.choose_trial_to_run(ctl) is None  # both pools full now
    sched.on_trial_result(ctl, trials[0], {"step": 3})  # a0's last step: it ends by itself
    trials[0].status = Trial.TERMINATED
    sched.on_trial_complete(ctl, trials[0], {"step": 3})
    assert sched.choose_trial_to_run(ctl) is trials[1]  # a0's slot, freed
