"""Every shipped campaign passes the pre-launch checks on the GPU it names, with the published shapes of its
models (their config.json written here from the published values; no weights, no Ray): the model settings
against the model's position limit, the learner's and the engine's memory per GPU, and each trial's bundles
against a node of 8 of the named GPUs. A campaign that stops fitting, or asks for GPUs without naming one, fails
here."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator.campaign.expand import load_campaign
from orchestrator.preflight.checks import position_limit
from orchestrator.preflight.cluster import Capacity, check_trials
from orchestrator.preflight.learner_memory import GIB, RESERVE, gpu_memory_gib, learner_memory, model_counts
from orchestrator.preflight.memory_check import check_campaign_learners
from tests.unit.preflight.test_learner_memory import QWEN25_3B

CAMPAIGNS = Path(__file__).resolve().parents[3] / "campaigns"
SHIPPED = sorted(CAMPAIGNS.rglob("*.yaml"))

# The published config.json of each seed model (huggingface.co/<name>/blob/main/config.json), the fields that
# shape it. Qwen2.5-3B-Instruct has Qwen2.5-3B's shape (its eos differs, not read here).
QWEN3_4B_2507 = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 2560,
                 "intermediate_size": 9728, "num_hidden_layers": 36, "num_attention_heads": 32,
                 "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 151936, "tie_word_embeddings": True,
                 "max_position_embeddings": 262144, "rms_norm_eps": 1e-6, "rope_theta": 5000000,
                 "attention_bias": False}
PUBLISHED = {"Qwen/Qwen3-4B-Instruct-2507": QWEN3_4B_2507, "Qwen/Qwen2.5-3B": QWEN25_3B,
             "Qwen/Qwen2.5-3B-Instruct": {**QWEN25_3B, "eos_token_id": 151645}}


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory) -> dict[str, str]:
    out = {}
    for name, config in PUBLISHED.items():
        d = tmp_path_factory.mktemp(name.replace("/", "_"))
        (d / "config.json").write_text(json.dumps(config))
        out[name] = str(d)
    return out


def test_published_shapes_give_the_published_sizes(model_dirs):
    """The configs are the models': the model cards give Qwen3-4B 4.0B parameters, 3.6B without the embedding
    (tied), and Qwen2.5-3B 3.09B, 2.77B without it."""
    cfg = load_campaign(CAMPAIGNS / "sepa_lean.yaml").trials[0].trial
    q3 = model_counts(model_dirs["Qwen/Qwen3-4B-Instruct-2507"], cfg)
    assert round(q3.params / 1e9, 1) == 4.0 and round((q3.params - q3.vocab * q3.hidden) / 1e9, 1) == 3.6
    assert q3.kv_per_token == 2 * 2 * 36 * 8 * 128  # bf16 K and V of 36 layers x 8 KV heads x 128
    q2 = model_counts(model_dirs["Qwen/Qwen2.5-3B"], cfg)
    assert round(q2.params / 1e9, 2) == 3.09 and round((q2.params - q2.vocab * q2.hidden) / 1e9, 2) == 2.77


def test_every_gpu_campaign_is_one_of_the_checked_ones():
    gpu = [p.relative_to(CAMPAIGNS).as_posix() for p in SHIPPED
           if any(t.trial.resources.worker_gpus or t.trial.resources.learner_gpus for t in load_campaign(p).trials)]
    assert gpu == sorted(["ragen/frozenlake_rv_filter.yaml", "ragen/frozenlake_rv_filter_lora.yaml",
                          "ragen/sokoban_entropy.yaml", "ragen/sokoban_entropy_lora.yaml", "ragen/sokoban_kl.yaml",
                          "ragen/sokoban_kl_lora.yaml", "ragen/sokoban_rv_filter.yaml",
                          "ragen/sokoban_rv_filter_lora.yaml", "sepa_conclusive.yaml", "sepa_lean.yaml",
                          "sepa_pilot.yaml"])


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.relative_to(CAMPAIGNS).as_posix())
def test_shipped_campaign_passes_the_pre_launch_checks_on_its_gpu(path, model_dirs):
    campaign = load_campaign(path)
    trials = [t.trial for t in campaign.trials]
    if not any(c.resources.worker_gpus or c.resources.learner_gpus for c in trials):
        return  # a CPU campaign: nothing to size
    for c in trials:  # it names the GPU it was sized for, so the memory check always runs
        assert gpu_memory_gib(c) is not None, f"{path.name}: no resources.accelerator_type / gpu_memory_gb"
        assert c.model.name in PUBLISHED, c.model.name
        key, limit = position_limit(model_dirs[c.model.name])
        assert c.model.max_model_len <= limit
    gpu = trials[0].resources.accelerator_type
    node = {"GPU": 8.0, "CPU": 64.0, **({f"accelerator_type:{gpu}": 1.0} if gpu else {})}
    check_trials(campaign, Capacity([node]))  # every bundle fits one node of 8 such GPUs

    lines = check_campaign_learners(campaign, resolve=lambda m: model_dirs[m.name])
    learner = [x for x in lines if "the learner needs" in x]
    assert learner and all(f"of {gpu_memory_gib(trials[0]):.0f} GiB" in x for x in learner), lines
    assert sum("engine per GPU" in x for x in lines) == len(learner)
    for c in trials:  # the margin, spelled out: every trial's learner within the usable 90%
        need = learner_memory(c, model_counts(model_dirs[c.model.name], c))
        assert need.total / GIB <= gpu_memory_gib(c) * (1 - RESERVE)
        break  # one per campaign here; the check above ran every shape


SHARED_SLOTS = 8  # a sensible pool: 8 trials at once (each LoRA campaign here has at least 8 trials)


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.relative_to(CAMPAIGNS).as_posix())
def test_shipped_lora_campaign_fits_its_gpu_on_a_shared_base(path, model_dirs):
    """Each shipped LoRA GPU campaign with resources.shared_base {slots: 8}: its trials can share (one model, one
    LoRA shape, separate placement, one learner rank), and the pool's learner GPU (the base once + 8 adapters with
    gradients and Adam moments) and engine GPU (8 adapters, each slot's KV share holding a max_model_len sequence)
    fit the GPU it names."""
    from orchestrator.preflight.engine_memory import pool_engine
    from orchestrator.preflight.learner_memory import shared_learner
    from orchestrator.preflight.shared_plan import with_shared_base

    campaign = load_campaign(path)
    c = campaign.trials[0].trial
    if c.learner.mode != "lora" or not (c.resources.worker_gpus or c.resources.learner_gpus):
        return
    assert len(campaign.trials) >= SHARED_SLOTS
    shared = with_shared_base(campaign, SHARED_SLOTS)  # the pre-launch refusal of what cannot share passes
    lines = check_campaign_learners(shared, resolve=lambda m: model_dirs[m.name])  # refuses a pool that cannot fit
    assert any(f"shared base, {SHARED_SLOTS} slot(s)" in x for x in lines), lines
    counts = model_counts(model_dirs[c.model.name], c)
    have = gpu_memory_gib(c)
    assert shared_learner(learner_memory(c, counts), SHARED_SLOTS).total / GIB <= have * (1 - RESERVE)
    assert pool_engine(c, counts, have, SHARED_SLOTS).kv_per_slot >= c.model.max_model_len
