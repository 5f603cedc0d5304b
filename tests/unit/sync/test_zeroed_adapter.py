"""`workers.sync.adapter.zeroed`: the base model as a LoRA adapter (every lora_B zero), what a pool's engine serves
base-model requests under (rollout.difficulty_samples on a shared base)."""

from __future__ import annotations

import pytest
import safetensors.torch
import torch

from workers.sync.adapter import zeroed
from workers.sync.policy import PolicyUpdate


def test_every_lora_b_is_zero_and_the_rest_is_kept():
    tensors = {"base_model.model.layers.0.q_proj.lora_A.weight": torch.randn(4, 16),
               "base_model.model.layers.0.q_proj.lora_B.weight": torch.randn(16, 4),
               "base_model.model.layers.1.v_proj.lora_B.weight": torch.randn(8, 4)}
    files = {"adapter_model.safetensors": safetensors.torch.save({k: v.clone() for k, v in tensors.items()}),
             "adapter_config.json": b'{"r": 4}'}
    out = zeroed(PolicyUpdate("adapter", 7, files))
    assert out.version == 0 and out.kind == "adapter" and out.files["adapter_config.json"] == b'{"r": 4}'
    got = safetensors.torch.load(out.files["adapter_model.safetensors"])
    assert set(got) == set(tensors)
    for k, v in got.items():
        assert torch.equal(v, torch.zeros_like(v)) if "lora_B" in k else torch.equal(v, tensors[k]), k
    assert safetensors.torch.load(files["adapter_model.safetensors"]).keys() == tensors.keys()  # input untouched


def test_an_adapter_without_weights_is_refused():
    with pytest.raises(ValueError, match="no .safetensors"):
        zeroed(PolicyUpdate("adapter", 1, {"adapter_config.json": b"{}"}))
