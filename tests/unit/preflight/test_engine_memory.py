"""The engine's share per GPU against a closed form (Qwen2.5-3B's published shape), its one-line refusal when
the share cannot hold the weights and one context, the colocated variant a separate trial is shown, and the
micro-batch size the learner estimate counts."""

from __future__ import annotations

import json

import pytest

from orchestrator.config.errors import UserError
from orchestrator.config.trial import TrialConfig
from orchestrator.preflight.engine_memory import colocated_variant, engine_line, engine_memory
from orchestrator.preflight.learner_memory import GIB, learner_memory, micro_batch_tokens, model_counts
from tests.unit.preflight.test_learner_memory import QWEN25_3B


@pytest.fixture(scope="module")
def qwen3b(tmp_path_factory) -> str:
    d = tmp_path_factory.mktemp("qwen25_3b_engine")
    (d / "config.json").write_text(json.dumps(QWEN25_3B))
    return str(d)


def _cfg(model: str, util: float, **learner) -> TrialConfig:
    return TrialConfig.model_validate({
        "model": {"name": model, "max_model_len": 4096}, "task": {"name": "arithmetic"},
        "rollout": {"engine": {"gpu_memory_utilization": util}},
        "resources": {"worker_gpus": 1, "learner_gpus": 1, "accelerator_type": "H100"},
        "learner": {"lora": {"rank": 64}, **learner}})


def test_engine_share_splits_into_weights_and_kv_cache(qwen3b):
    cfg = _cfg(qwen3b, 0.85)
    counts = model_counts(qwen3b, cfg)
    mem = engine_memory(cfg, counts, 79.6)
    # bf16 K and V: 2 x 2 bytes x 36 layers x 2 KV heads x 128 (2048 / 16 heads)
    assert counts.kv_per_token == 2 * 2 * 36 * 2 * 128
    assert mem.share == pytest.approx(0.85 * 79.6 * GIB) and mem.weights == 2 * counts.params
    assert mem.kv_tokens == int((mem.share - mem.weights) // counts.kv_per_token)
    assert "engine per GPU: 67.7 GiB" in engine_line(cfg, counts, 79.6, "c.yaml")


def test_an_engine_share_without_room_for_one_context_is_refused(qwen3b):
    cfg = _cfg(qwen3b, 0.08)  # 6.4 GiB: beside the 5.7 GiB of weights, KV cache for more than one context
    counts = model_counts(qwen3b, cfg)
    assert engine_memory(cfg, counts, 79.6).kv_tokens >= 4096
    tiny = _cfg(qwen3b, 0.072)  # 5.73 GiB: the weights (5.75 GiB) do not fit
    with pytest.raises(UserError) as err:
        engine_line(tiny, counts, 79.6, "c.yaml")
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith("c.yaml: rollout.engine.gpu_memory_utilization: ")
    assert "less than one model.max_model_len (4096) sequence" in msg


def test_the_colocated_variant_names_the_engine_share_that_fits(qwen3b):
    cfg = _cfg(qwen3b, 0.85, gradient_checkpointing=True, optim={"max_tokens_per_micro_batch": 8192})
    need = learner_memory(cfg, model_counts(qwen3b, cfg))
    line = colocated_variant(cfg, need, 79.6)
    share = float(line.rsplit(" ", 1)[-1])
    assert "fits with rollout.engine.gpu_memory_utilization" in line and 0.05 < share < 0.85
    # at that share both phases fit: the engine + the rank's resident state + 2 CUDA contexts within 90%
    assert share * 79.6 + need.resident / GIB + 1.0 <= 0.9 * 79.6
    assert colocated_variant(_cfg(qwen3b, share, gradient_checkpointing=True,
                                  optim={"max_tokens_per_micro_batch": 8192}), need, 79.6).endswith(": fits")


def test_micro_batch_tokens_count_a_context_longer_than_the_budget(qwen3b):
    assert micro_batch_tokens(_cfg(qwen3b, 0.5, optim={"micro_batch_size": 8})) == 8 * 4096
    assert micro_batch_tokens(_cfg(qwen3b, 0.5, optim={"max_tokens_per_micro_batch": 16384})) == 16384
    assert micro_batch_tokens(_cfg(qwen3b, 0.5, optim={"max_tokens_per_micro_batch": 1000})) == 4096  # alone
