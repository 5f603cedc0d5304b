"""`plan` for a campaign on one shared base (resources.shared_base): the pool's memory (the base once plus slots x
adapter, gradients, Adam moments and KV share) and its GPU-hours / makespan against separate trials, each against
closed forms worked by hand from the stated assumptions (orchestrator/preflight/shared_plan.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator import cli
from orchestrator.campaign.expand import load_campaign
from orchestrator.config.errors import UserError
from orchestrator.preflight.cost_model import overhead_seconds, step_seconds
from orchestrator.preflight.engine_memory import shared_engine, slots_fitting_engine
from orchestrator.preflight.learner_memory import (
    GIB,
    LearnerMemory,
    learner_memory,
    model_counts,
    shared_learner,
    slots_fitting_learner,
)
from orchestrator.preflight.memory_check import check_campaign_learners
from orchestrator.preflight.plan import Cluster, make_plan
from orchestrator.preflight.shared_plan import (
    TRIAL_START_S,
    cycle_seconds,
    generate_factor,
    plan_shared,
    with_shared_base,
)
from tests.unit.preflight.test_shipped_campaigns_fit import QWEN3_4B_2507

ROOT = Path(__file__).resolve().parents[3]
LEAN = ROOT / "campaigns/sepa_lean.yaml"


def test_shared_learner_counts_the_base_once_and_each_slot_its_state():
    # weights 10 = base 9 + adapter 1 (fp32, as its gradients 1); Adam 2; one micro-batch 0.5 + 3
    mem = LearnerMemory(weights=10.0, grads=1.0, optimizer=2.0, gathered=0.5, activations=3.0, ranks=1)
    s = shared_learner(mem, 4)
    assert (s.base, s.per_slot, s.working) == (9.0, 4.0, 3.5)
    assert s.total == 9 + 4 * 4 + 3.5
    assert shared_learner(mem, 1).total == mem.total  # one slot is a separate learner
    assert slots_fitting_learner(mem, 30.0) == 4  # (30 - 12.5) // 4: 4 slots take 28.5, 5 would take 32.5


def test_slots_fitting_learner_is_the_largest_that_fits():
    mem = LearnerMemory(weights=10.0, grads=1.0, optimizer=2.0, gathered=0.5, activations=3.0, ranks=1)
    for usable in (12.0, 12.5, 16.4, 16.5, 30.0, 100.0):
        n = slots_fitting_learner(mem, usable)
        assert shared_learner(mem, n).total <= usable or n == 0
        assert shared_learner(mem, n + 1).total > usable


def test_shared_engine_splits_its_kv_cache_over_the_slots():
    e = shared_engine(share=100.0, weights=20.0, adapter=2.0, kv_per_token=2.0, slots=4)
    assert e.adapters == 8.0 and e.kv_tokens == 36 and e.kv_per_slot == 9  # (100 - 20 - 8) / 2 over 4
    # each slot: its adapter 2 + one 10-token sequence's KV 20 = 22; 80 // 22
    assert slots_fitting_engine(100.0, 20.0, 2.0, 2.0, context=10) == 3
    assert shared_engine(100.0, 20.0, 2.0, 2.0, 3).kv_per_slot >= 10 > shared_engine(100.0, 20.0, 2.0, 2.0, 4).kv_per_slot


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory) -> str:
    d = tmp_path_factory.mktemp("qwen3")
    (d / "config.json").write_text(json.dumps(QWEN3_4B_2507))
    return str(d)


def test_lean_pool_memory_from_the_model(qwen3):
    """sepa_lean's pool on an H100: the learner holds Qwen3-4B's bf16 base once (2 bytes x 4.02e9) and per slot the
    rank-64 adapter's 16 bytes a parameter; the engine its base once, per slot the bf16 adapter."""
    campaign = with_shared_base(load_campaign(LEAN), 8)
    cfg = campaign.trials[0].trial
    counts = model_counts(qwen3, cfg)
    sep = learner_memory(cfg, counts)
    pool = shared_learner(sep, 8)
    assert pool.base == 2 * counts.params and pool.per_slot == 16 * counts.lora
    assert pool.total == pytest.approx(2 * counts.params + 8 * 16 * counts.lora + sep.activations)
    lines = check_campaign_learners(campaign, resolve=lambda m: qwen3)
    shared = [x for x in lines if "shared base, 8 slot(s)" in x]
    assert shared and f"{pool.total / GIB:.1f} GiB" in shared[0]
    assert not any("colocated instead" in x for x in lines)  # a shared campaign is separate by construction


def test_a_pool_that_cannot_hold_its_slots_is_refused_in_one_line(qwen3):
    campaign = with_shared_base(load_campaign(LEAN), 40)  # 40 x 1.97 GiB of adapter state on an 80 GiB H100
    with pytest.raises(UserError) as e:
        check_campaign_learners(campaign, resolve=lambda m: qwen3)
    msg = str(e.value)
    assert "\n" not in msg and "resources.shared_base.slots: 40 slots" in msg and "at most 29 slot(s)" in msg


def test_generation_batches_across_trials():
    assert generate_factor(1) == 1.0
    assert generate_factor(4) == 1.0  # 4 x 0.05 reaches the 0.20 ceiling: 4 batches in the time of one
    assert generate_factor(8) == 2.0
    # a KV cache that holds 190 sequences: one trial's 256 already fill it, more trials queue behind
    assert generate_factor(8, batch=256, kv_sequences=190) == 8.0
    assert generate_factor(4, batch=64, kv_sequences=128) == 2.0  # 2 trials' batches at once, at twice the rate
    assert cycle_seconds(10.0, 3.0, 8) == (2 * 10 + 8 * 3, 24.0)


def test_shared_vs_separate_gpu_hours_and_makespan_by_hand():
    """sepa_lean (20 equal trials, 40 steps, 2 GPUs a trial) with 4 slots on 8 GPUs: k = 4 trials at once generate
    in one trial's time (factor 1), the learner trains 4 in turn: step = g + 4 l; every trial's own overhead is its
    checkpoints + TRIAL_START_S, the pool starts once; 20 equal trials on 4 slots end in 5 waves."""
    campaign = load_campaign(LEAN)
    cfg = campaign.trials[0].trial
    plan = make_plan(campaign, cluster=Cluster(8, 64, "test"))
    parts = step_seconds(cfg, "H100")
    g, lrn = parts["generate"], parts["score"] + parts["train"]
    over = overhead_seconds(cfg, "H100")
    own = over["checkpoints"] + over["sync"] + TRIAL_START_S
    shared = plan_shared(plan, 4, "H100")
    assert shared.step_s == pytest.approx(g + 4 * lrn) and shared.step_overlapped_s == pytest.approx(4 * lrn)
    span_h = (over["startup"] + 5 * (40 * (g + 4 * lrn) + own)) / 3600
    assert shared.makespan_h == pytest.approx(span_h) and shared.gpu_hours == pytest.approx(2 * span_h)
    # separate, the plan's: 20 trials x 2 GPUs x (40 steps x (g + l) + start-up + their checkpoints)
    sep_trial_h = (40 * (g + lrn) + sum(over.values())) / 3600
    assert plan.gpu_hours == pytest.approx(20 * 2 * sep_trial_h)
    assert plan.makespan_h == pytest.approx(5 * sep_trial_h)  # 4 trials at once on 8 GPUs
    # the pool that does not fit the cluster runs nothing
    assert plan_shared(make_plan(campaign, cluster=Cluster(1, 64, "test")), 4, "H100").at_once == 0


def test_plan_prints_shared_and_separate_for_a_lora_campaign(capsys):
    assert cli.main(["plan", str(LEAN), "--gpus", "8", "--cpus", "64", "--slots", "4"]) == 0
    out = capsys.readouterr().out.split("shared base vs separate (LoRA):\n")[1].splitlines()
    assert out[2].startswith("separate (chosen)") and "2 a trial" in out[2]
    assert out[3].startswith("shared base, 4 slots") and "2 (one pool)" in out[3]
    assert "lock-step" in "\n".join(out[4:8])


def test_plan_of_a_full_campaign_prints_no_shared_side(capsys):
    assert cli.main(["plan", str(ROOT / "campaigns/ragen/sokoban_entropy.yaml"), "--gpus", "8"]) == 0
    assert "shared base" not in capsys.readouterr().out


def test_a_campaign_that_cannot_share_says_why(tmp_path, capsys):
    path = tmp_path / "c.yaml"
    path.write_text(json.dumps({
        "name": "c", "seeds": [0], "storage": str(tmp_path / "s"),
        "base": {"model": {"name": "Qwen/Qwen2.5-0.5B"}, "task": {"name": "arithmetic"}},
        "conditions": {"A": {}, "B": {"learner": {"lora": {"rank": 16}}}},
        "resources": {"rollout_workers": 1, "worker_gpus": 1, "learner_gpus": 1}}))
    assert cli.main(["plan", str(path), "--gpus", "8"]) == 0
    out = capsys.readouterr().out
    assert "shared base does not apply:" in out and "learner.lora.rank" in out


def test_plan_slots_below_one_is_one_line_exit_2(capsys):
    assert cli.main(["plan", str(LEAN), "--slots", "0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--slots" in err[0]


def test_a_shared_campaign_plans_shared_as_chosen(tmp_path, capsys):
    text = LEAN.read_text().replace("accelerator_type: H100}", "accelerator_type: H100, shared_base: {slots: 5}}")
    assert "shared_base" in text
    path = tmp_path / "lean_shared.yaml"
    path.write_text(text.replace("storage: ${ORCHESTRATOR_STORAGE:-~/orchestrator-results}",
                                 f"storage: {tmp_path / 's'}"))
    assert cli.main(["plan", str(path), "--gpus", "8"]) == 0
    out = capsys.readouterr().out
    assert "shared base, 5 slots (chosen)" in out and "separate (chosen)" not in out
    assert "C1_s0  40     256" in out and "2     3.55" in out  # the per-trial table is the separate trial's


def test_run_prints_the_shared_paragraph_before_launching(monkeypatch):
    from orchestrator.preflight.shared_plan import run_paragraph

    monkeypatch.setattr("ray.cluster_resources", lambda: {"GPU": 8.0, "CPU": 64.0})
    campaign = load_campaign(LEAN)
    shared = plan_shared(make_plan(campaign, cluster=Cluster(8, 64, "test")), 5, "H100")
    text = run_paragraph(with_shared_base(campaign, 5))
    assert text.startswith(f"plan: 20 trials on a shared base (5 slots): one pool of 2 GPU(s), about "
                           f"{shared.gpu_hours:.1f} GPU-hours"), text
    assert "Separate instead: 20 trials, 800 steps, about 71.0 GPU-hours" in text


# ------------------------------------------------------------------------------- a model sweep: a pool per model
TWO_MODELS = ["Qwen/Qwen3-4B-Instruct-2507", "Qwen/Qwen3-4B-Base"]  # the cost model's 4e9 parameters each


def _swept(tmp_path, models: list[str], slots: int | None = 4) -> Path:
    """sepa_lean sweeping the base model (every condition x seed on each), on a shared base of `slots`."""
    import yaml

    data = yaml.safe_load(LEAN.read_text())
    data["storage"] = str(tmp_path / "s")
    data["sweep"] = {"model.name": models}
    if slots is not None:
        data["resources"]["shared_base"] = {"slots": slots}
    path = tmp_path / "swept.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_a_model_sweep_plans_one_pool_per_model_side_by_side(tmp_path):
    """Two pools of 2 GPUs, each with sepa_lean's 20 trials on 4 slots: the same step time and makespan as the one
    pool of sepa_lean, twice its GPUs, trials at once and GPU-hours; a cluster that holds one pool but not two
    runs nothing."""
    one = plan_shared(make_plan(load_campaign(LEAN), cluster=Cluster(8, 64, "test")), 4, "H100")
    swept = with_shared_base(load_campaign(_swept(tmp_path, TWO_MODELS)), None)
    assert len(swept.trials) == 40
    two = plan_shared(make_plan(swept, cluster=Cluster(8, 64, "test")), 4, "H100")
    assert (one.pools, two.pools) == (1, 2)
    assert (two.gpus, two.at_once) == (2 * one.gpus, 2 * one.at_once) == (4, 8)
    assert two.step_s == pytest.approx(one.step_s) and two.makespan_h == pytest.approx(one.makespan_h)
    assert two.gpu_hours == pytest.approx(2 * one.gpu_hours)
    assert plan_shared(make_plan(swept, cluster=Cluster(3, 64, "test")), 4, "H100").at_once == 0
    assert plan_shared(make_plan(load_campaign(LEAN), cluster=Cluster(3, 64, "test")), 4, "H100").at_once == 4


def test_plan_of_a_shared_model_sweep_prints_its_pools(tmp_path, capsys):
    assert cli.main(["plan", str(_swept(tmp_path, TWO_MODELS)), "--gpus", "8"]) == 0
    out = capsys.readouterr().out.split("shared base vs separate (LoRA):\n")[1].splitlines()
    row = next(x for x in out if x.startswith("shared base"))
    assert row.startswith("shared base, 4 slots a pool (chosen)") and "4 (2 pools, one per model)" in row
    assert any("one pool per base model (2)" in x for x in out)


def test_run_paragraph_counts_every_pool(tmp_path, monkeypatch):
    from orchestrator.preflight.shared_plan import run_paragraph

    monkeypatch.setattr("ray.cluster_resources", lambda: {"GPU": 8.0, "CPU": 64.0})
    text = run_paragraph(load_campaign(_swept(tmp_path, TWO_MODELS)))
    assert text.startswith("plan: 40 trials on a shared base (4 slots): 2 pools (one per base model, 4 slots each) "
                           "of 4 GPU(s)"), text


@pytest.fixture(scope="module")
def two_configs(tmp_path_factory) -> dict[str, str]:
    from tests.unit.preflight.test_shipped_campaigns_fit import PUBLISHED

    out = {}
    for name in ("Qwen/Qwen3-4B-Instruct-2507", "Qwen/Qwen2.5-3B"):
        d = tmp_path_factory.mktemp(name.rsplit("/", 1)[-1])
        (d / "config.json").write_text(json.dumps(PUBLISHED[name]))
        out[name] = str(d)
    return out


def test_each_pools_memory_is_its_own_models(tmp_path, two_configs):
    """Two pools, each checked on its own GPUs with its own model's base and adapter: two shared lines, each the
    closed form of its model."""
    campaign = load_campaign(_swept(tmp_path, list(two_configs), slots=8))
    resolve = lambda m: two_configs[m.name]  # noqa: E731
    lines = check_campaign_learners(campaign, resolve=resolve)
    shared = [x for x in lines if x.strip().startswith("shared base, 8 slot(s)")]
    assert len(shared) == 2
    totals = set()
    for name, path in two_configs.items():
        cfg = next(t.trial for t in campaign.trials if t.trial.model.name == name)
        pool = shared_learner(learner_memory(cfg, model_counts(path, cfg)), 8)
        assert any(f"{pool.total / GIB:.1f} GiB" in x for x in shared), (name, shared)
        totals.add(f"{pool.total / GIB:.1f}")
    assert len(totals) == 2  # the two models' pools differ


def test_the_pool_that_cannot_hold_its_slots_is_named(tmp_path, two_configs):
    campaign = load_campaign(_swept(tmp_path, list(two_configs), slots=40))
    with pytest.raises(UserError) as e:
        check_campaign_learners(campaign, resolve=lambda m: two_configs[m.name])
    msg = str(e.value)
    assert "\n" not in msg and "resources.shared_base.slots: 40 slots" in msg and "in the pool of model Qwen/" in msg


def test_the_cluster_must_hold_every_pool_at_once(tmp_path):
    from orchestrator.preflight.cluster import Capacity, check_pools

    campaign = load_campaign(_swept(tmp_path, TWO_MODELS))
    node = {"CPU": 64.0, "GPU": 3.0, "accelerator_type:H100": 1.0}
    with pytest.raises(UserError) as e:
        check_pools(campaign, Capacity([node]))  # each pool's 2 GPUs fit, both pools' 4 do not
    msg = str(e.value)
    assert "\n" not in msg and "resources.shared_base: 2 pools" in msg and "hold 4 GPUs at once" in msg
    check_pools(campaign, Capacity([{**node, "GPU": 4.0}]))
    check_pools(load_campaign(LEAN), Capacity([node]))  # no shared base: nothing to check here


def test_a_local_ray_gets_every_pools_cpus_and_a_driver_per_trial_at_once(tmp_path):
    from orchestrator.tune.launch import campaign_cpus

    campaign = load_campaign(_swept(tmp_path, TWO_MODELS))
    # each pool: engine 4 + learner 4 CPUs; 2 pools x 4 slots of 1-CPU drivers
    assert campaign_cpus(campaign) == 2 * 8 + 8 * 1
    one = with_shared_base(load_campaign(LEAN), 4)
    assert campaign_cpus(one) == 8 + 4 * 1  # as before: the pool and a driver per slot
    assert campaign_cpus(load_campaign(LEAN)) == 9  # separate: the largest trial's
