"""The pre-launch learner memory check: exact parameter counts (against a closed form written from Qwen2's
architecture, and against the real models and PEFT adapters built here), the per-GPU estimate, and the one-line
refusal with the number of ranks that would fit."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.config.errors import UserError
from orchestrator.config.trial import TrialConfig
from orchestrator.preflight.learner_memory import GIB, check_learner_memory, learner_memory, model_counts

# Qwen2.5-3B's published config (the fields that shape it); nothing is downloaded
QWEN25_3B = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 2048,
             "intermediate_size": 11008, "num_hidden_layers": 36, "num_attention_heads": 16,
             "num_key_value_heads": 2, "vocab_size": 151936, "tie_word_embeddings": True,
             "max_position_embeddings": 32768, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0}


@pytest.fixture(scope="module")
def qwen3b(tmp_path_factory) -> str:
    d = tmp_path_factory.mktemp("qwen25_3b")
    (d / "config.json").write_text(json.dumps(QWEN25_3B))
    return str(d)


def _cfg(model: str, **over) -> TrialConfig:
    base = {"model": {"name": model, "max_model_len": 4096}, "task": {"name": "sokoban"},
            "credit": {"advantage_mode": "gae"},
            "resources": {"learner_gpus": 1, "accelerator_type": "H100"},
            "learner": {"mode": "full", "gradient_checkpointing": True,
                        "optim": {"micro_batch_size": 8, "max_tokens_per_micro_batch": 8192}}}
    for key, value in over.items():
        base[key] = {**base.get(key, {}), **value}
    return TrialConfig.model_validate(base)


def test_qwen25_3b_count_equals_the_closed_form(qwen3b):
    c = QWEN25_3B
    h, i, n, v = c["hidden_size"], c["intermediate_size"], c["num_hidden_layers"], c["vocab_size"]
    hd = h // c["num_attention_heads"]
    q, kv = c["num_attention_heads"] * hd, c["num_key_value_heads"] * hd
    layer = (h * q + q) + 2 * (h * kv + kv) + q * h + 3 * h * i + 2 * h  # q/k/v with bias, o, MLP, 2 norms
    expected = v * h + n * layer + h  # tied head: the embedding once; final norm
    counts = model_counts(qwen3b, _cfg(qwen3b))
    assert counts.params == expected == 3_085_938_688
    assert counts.decoder == counts.params  # tied: the critic's trunk holds the embedding too
    assert counts.largest_layer == layer and counts.root == v * h + h


def test_counts_equal_the_real_model_and_adapter(tmp_path):
    from peft import get_peft_model

    from workers.learner.modules import lora_config
    from workers.models.loading import build_tiny_model, load_model

    d = str(build_tiny_model(tmp_path / "tiny", seed=0))
    cfg = TrialConfig.model_validate({"model": {"name": d}, "task": {"name": "arithmetic"}})
    counts = model_counts(d, cfg)
    model = load_model(d)
    assert counts.params == sum(p.numel() for p in model.parameters())
    peft = get_peft_model(model, lora_config(cfg.learner.lora))
    assert counts.lora == sum(p.numel() for p in peft.parameters() if p.requires_grad)


def test_a_3b_policy_and_critic_trained_in_full_need_more_than_one_h100(qwen3b):
    cfg = _cfg(qwen3b)
    counts = model_counts(qwen3b, cfg)
    one, two = learner_memory(cfg, counts, 1), learner_memory(cfg, counts, 2)
    # 16 bytes per trained parameter (fp32 weights + grads + 2 Adam moments): policy and critic, ~99 GB
    assert one.weights + one.grads + one.optimizer == pytest.approx(16 * (2 * counts.params + 2049), rel=1e-9)
    assert one.total / GIB > 80 > two.total / GIB
    assert two.weights == pytest.approx(one.weights / 2) and two.activations == one.activations
    with pytest.raises(UserError) as e:
        check_learner_memory(cfg, qwen3b, "c.yaml", "ppo_s0")
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("c.yaml: resources.learner_ranks: trial ppo_s0")
    assert "raise resources.learner_ranks to 2" in msg and "H100 has 80 GiB" in msg
    fits = _cfg(qwen3b, resources={"learner_ranks": 2})
    assert "on 2 rank(s) of 80 GiB" in check_learner_memory(fits, qwen3b, "c.yaml", "ppo_s0")


def test_what_shrinks_the_estimate(qwen3b):
    counts = model_counts(qwen3b, _cfg(qwen3b))
    base = learner_memory(_cfg(qwen3b), counts)
    no_ckpt = learner_memory(_cfg(qwen3b, learner={"gradient_checkpointing": False}), counts)
    assert no_ckpt.activations > 3 * base.activations
    offload = learner_memory(_cfg(qwen3b, learner={"cpu_offload": True}), counts)
    assert offload.grads == offload.optimizer == 0 and offload.total < base.total / 4
    lora = learner_memory(_cfg(qwen3b, learner={"mode": "lora"}), counts)
    assert lora.optimizer == pytest.approx(8 * (2 * counts.lora + 2049))  # adapters only (policy + critic)
    lora_critic = learner_memory(_cfg(qwen3b, learner={"critic": {"model": "lora"}}), counts)
    assert lora_critic.optimizer == pytest.approx(8 * (counts.params + counts.lora + 2049))  # no second model
    wide = learner_memory(_cfg(qwen3b, learner={"critic": {"model": "lora", "lora": {"rank": 64}}}), counts)
    assert wide.optimizer - lora_critic.optimizer == pytest.approx(8 * counts.lora * (64 / 8 - 1))
    kl = learner_memory(_cfg(qwen3b, interventions={"kl": {"coef": 0.01}}), counts)
    assert kl.weights - base.weights == pytest.approx(2 * counts.params)  # the frozen bf16 reference


def test_unknown_gpu_memory_or_no_learner_gpu_refuses_nothing(qwen3b):
    line = check_learner_memory(_cfg(qwen3b, resources={"accelerator_type": None}), qwen3b, "c.yaml", "t")
    assert "GPU memory unknown" in line
    assert check_learner_memory(_cfg(qwen3b, resources={"learner_gpus": 0}), qwen3b, "c.yaml", "t") is None
    told = _cfg(qwen3b, resources={"accelerator_type": None, "gpu_memory_gb": 141})
    assert "of 131 GiB" in check_learner_memory(told, qwen3b, "c.yaml", "t")


def test_plan_refuses_an_oversize_full_campaign_in_one_line(qwen3b, tmp_path):
    campaign = tmp_path / "big.yaml"
    campaign.write_text(f"""name: big
base:
  steps: 10
  model: {{name: {qwen3b}, max_model_len: 4096}}
  task: {{name: sokoban}}
  learner: {{mode: full, gradient_checkpointing: true, optim: {{max_tokens_per_micro_batch: 8192}}}}
  credit: {{advantage_mode: gae}}
conditions: {{ppo: {{}}}}
seeds: [0]
resources: {{rollout_workers: 1, worker_gpus: 1, learner_gpus: 1, accelerator_type: H100}}
storage: {tmp_path / "out"}
""")
    proc = subprocess.run([sys.executable, "-m", "orchestrator", "plan", str(campaign)], capture_output=True,
                          text=True, timeout=300, cwd=Path(__file__).resolve().parents[3])
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "raise resources.learner_ranks to 2" in lines[0] and str(campaign) in lines[0]


# ------------------------------------------------------------------------------------------ colocated
def _colocated(qwen3b: str, utilization: float, **learner) -> TrialConfig:
    """Qwen2.5-3B full fine-tuning + a full critic (GAE), each rank beside one engine on an 80 GB GPU."""
    return _cfg(qwen3b, resources={"placement": "colocated", "learner_ranks": 4, "gpu_memory_gb": 80},
                rollout={"engine": {"gpu_memory_utilization": utilization}}, learner=learner)


def _allowed(msg: str) -> float:
    return float(msg.split("gpu_memory_utilization to ")[1].split(" ")[0])


def test_colocated_check_refuses_an_engine_at_0_9_and_accepts_one_that_fits(qwen3b):
    from orchestrator.preflight.colocated_memory import CUDA_CONTEXT_GIB, PROCESSES

    counts = model_counts(qwen3b, _colocated(qwen3b, 0.9))
    need = learner_memory(_colocated(qwen3b, 0.9), counts)
    device = 80e9 / GIB
    # closed form of the generate phase: engine share + the rank's resident sharded state (16 bytes per trained
    # parameter of policy and critic, over 4 ranks) + two CUDA contexts
    trained = counts.params + counts.decoder + counts.hidden + 1
    assert need.resident == pytest.approx(16 * trained / 4)
    generate = 0.9 * device + 16 * trained / 4 / GIB + PROCESSES * CUDA_CONTEXT_GIB
    assert generate > device * 0.9  # so it must be refused
    with pytest.raises(UserError) as err:
        check_learner_memory(_colocated(qwen3b, 0.9), qwen3b, "c.yaml", "t")
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith("c.yaml: rollout.engine.gpu_memory_utilization: ")
    allowed = _allowed(msg)
    assert f"{generate:.1f} GiB" in msg
    assert 0.05 < allowed < 0.9
    line = check_learner_memory(_colocated(qwen3b, allowed), qwen3b, "c.yaml", "t")
    assert f"colocated with an engine at {allowed:g}" in line
    with pytest.raises(UserError):  # one hundredth above the stated bound no longer fits
        check_learner_memory(_colocated(qwen3b, round(allowed + 0.02, 2)), qwen3b, "c.yaml", "t")


def test_colocated_check_names_ranks_when_training_alone_overflows(qwen3b):
    from orchestrator.preflight.colocated_memory import phase_fit, refusal

    fit = phase_fit(0.3, learner_total=75.0, learner_resident=10.0, device=80.0, reserve=0.1)
    key, why = refusal(fit, 0.3)
    assert key == "resources.learner_ranks" and "76.0 GiB of 72.0" in why
    assert refusal(phase_fit(0.3, 40.0, 10.0, 80.0, 0.1), 0.3) is None  # 24 + 10 + 1 <= 72 and 41 <= 72


def test_offload_between_steps_leaves_only_the_weights_the_engines_phase_reads(qwen3b):
    """Full mode: beside the awake engine only the policy's fp32 shard stays (the weight sync reads it); the
    critic, gradients and Adam moments wait in host memory. The training phase is unchanged, the engine's share
    that fits grows, and the refusal stops suggesting the offload once it is set."""
    counts = model_counts(qwen3b, _colocated(qwen3b, 0.9))
    plain, off = (learner_memory(_colocated(qwen3b, 0.9, **kw), counts) for kw in ({}, {"offload_between_steps": True}))
    assert off.total == plain.total and off.resident < plain.resident
    assert off.resident == pytest.approx(4 * counts.params / 4)
    refused = {}
    for name, kw in (("plain", {}), ("off", {"offload_between_steps": True})):
        with pytest.raises(UserError) as err:
            check_learner_memory(_colocated(qwen3b, 0.9, **kw), qwen3b, "c.yaml", "t")
        refused[name] = str(err.value)
    assert "set learner.offload_between_steps" in refused["plain"]
    assert "offload_between_steps" not in refused["off"]
    more = _allowed(refused["off"])
    assert more > _allowed(refused["plain"]) + 0.2  # 2.9 GiB resident instead of 23
    assert "colocated with an engine" in check_learner_memory(
        _colocated(qwen3b, more, offload_between_steps=True), qwen3b, "c.yaml", "t")
    with pytest.raises(UserError):
        check_learner_memory(_colocated(qwen3b, more), qwen3b, "c.yaml", "t")
    # LoRA: the frozen base and the adapter stay, the gradients and moments leave
    lora = {"mode": "lora", "offload_between_steps": True}
    mem = learner_memory(_colocated(qwen3b, 0.3, **lora), counts)
    assert mem.resident == mem.weights and mem.offloaded == mem.grads + mem.optimizer > 0
