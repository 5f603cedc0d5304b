"""workers/sync/full_weights.py without vLLM: safetensors packing (round trip, sharding, dtype, tied weights, read back by
transformers), the checksum slice, and the checkpoint-name check the engine runs before loading."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load

from workers.sync.full_weights import (
    INDEX_FILE,
    SINGLE_FILE,
    check_checkpoint_names,
    checksum_names,
    engine_checkpoint_names,
    iter_safetensors,
    pack_weights,
    weights_checksum,
)


def _llama(tie: bool = False, seed: int = 0):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=40, hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=2,
                      num_key_value_heads=1, head_dim=16, tie_word_embeddings=tie)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return LlamaForCausalLM(cfg).eval()


def _unpack(files: dict[str, bytes]) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for name, data in files.items():
        if name.endswith(".safetensors"):
            part = load(data)
            assert not set(part) & set(out), "a tensor written twice"
            out.update(part)
    return out


def test_pack_round_trip_single_file():
    state = _llama().state_dict()
    files = pack_weights(state, torch.float32)
    assert list(files) == [SINGLE_FILE]
    back = _unpack(files)
    assert set(back) == set(state)
    for name, t in state.items():
        assert back[name].dtype == torch.float32
        assert torch.equal(back[name], t)


def test_pack_casts_to_engine_dtype():
    state = _llama().state_dict()
    back = _unpack(pack_weights(state, torch.bfloat16))
    for name, t in state.items():
        assert back[name].dtype == torch.bfloat16
        assert torch.equal(back[name], t.to(torch.bfloat16))  # round to nearest, as the engine would cast
    assert any(not torch.equal(back[n].float(), t) for n, t in state.items())  # the cast really rounds


def test_pack_splits_into_indexed_files(tmp_path):
    state = _llama().state_dict()
    sizes = {n: t.numel() * 4 for n, t in state.items()}
    limit = max(sizes.values()) + 1  # every file holds at least one tensor, most hold several
    files = pack_weights(state, torch.float32, max_file_bytes=limit)
    shards = sorted(n for n in files if n.endswith(".safetensors"))
    n = len(shards)
    assert n > 2 and shards == [f"model-{k:05d}-of-{n:05d}.safetensors" for k in range(1, n + 1)]
    assert set(files) == {*shards, INDEX_FILE}
    index = json.loads(files[INDEX_FILE])
    assert index["metadata"]["total_size"] == sum(sizes.values())
    assert set(index["weight_map"]) == set(state)
    for fname in shards:
        part = load(files[fname])
        assert sum(t.numel() * 4 for t in part.values()) <= limit
        assert {k for k, v in index["weight_map"].items() if v == fname} == set(part)
    back = _unpack(files)
    assert all(torch.equal(back[k], v) for k, v in state.items())

    # what a reader of the directory gets, file by file
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
    assert {k: v for k, v in iter_safetensors(tmp_path)}.keys() == state.keys()


def test_pack_oversized_tensor_gets_its_own_file():
    state = {"a": torch.zeros(10), "big": torch.ones(100), "c": torch.zeros(10)}
    files = pack_weights(state, torch.float32, max_file_bytes=80)
    index = json.loads(files[INDEX_FILE])["weight_map"]
    assert index == {"a": "model-00001-of-00003.safetensors", "big": "model-00002-of-00003.safetensors",
                     "c": "model-00003-of-00003.safetensors"}


def test_sharded_files_load_in_transformers(tmp_path):
    """HF reads the sharded layout back as the same model (an independent reader of the format)."""
    from transformers import AutoModelForCausalLM

    model = _llama(seed=3)
    model.config.save_pretrained(tmp_path)
    for name, data in pack_weights(model.state_dict(), torch.float32, max_file_bytes=20_000).items():
        (tmp_path / name).write_bytes(data)
    assert len(list(tmp_path.glob("*.safetensors"))) > 2
    again = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32)
    ref = model.state_dict()
    assert all(torch.equal(t, ref[k]) for k, t in again.state_dict().items())


def test_pack_writes_a_tied_head_once(tmp_path):
    from transformers import AutoModelForCausalLM

    model = _llama(tie=True, seed=1)
    state = model.state_dict()
    assert state["lm_head.weight"].data_ptr() == state["model.embed_tokens.weight"].data_ptr()
    for dtype in (torch.float32, torch.bfloat16):
        back = _unpack(pack_weights(state, dtype))
        assert "lm_head.weight" not in back and set(back) == set(state) - {"lm_head.weight"}
        assert torch.equal(back["model.embed_tokens.weight"], state["model.embed_tokens.weight"].to(dtype))
    # as transformers saves a tied checkpoint: it loads back tied, with the same head
    model.config.save_pretrained(tmp_path)
    for name, data in pack_weights(state, torch.float32).items():
        (tmp_path / name).write_bytes(data)
    again = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32)
    assert torch.equal(again.lm_head.weight, model.lm_head.weight)

    # equal values in separate storage are not an alias: both are written
    copy = {k: v.clone() for k, v in state.items()}
    assert "lm_head.weight" in _unpack(pack_weights(copy, torch.float32))


def test_pack_rejects_empty_and_non_tensors():
    with pytest.raises(ValueError):
        pack_weights({}, torch.float32)
    with pytest.raises(TypeError):
        pack_weights({"a": [1.0]}, torch.float32)


def test_checksum_slice_names():
    names = checksum_names(_llama().state_dict())
    assert names == ["model.embed_tokens.weight",
                     *[f"model.layers.{i}.{k}.weight" for i in range(3)
                       for k in ("input_layernorm", "post_attention_layernorm")],
                     "model.norm.weight"]
    with pytest.raises(KeyError):
        checksum_names({"transformer.wte.weight": None})  # not a Llama/Qwen-style decoder


def test_checksum_reads_exactly_its_slice():
    state = _llama().state_dict()
    ref = weights_checksum(state, torch.float32)
    assert ref == weights_checksum({k: v.clone() for k, v in state.items()}, torch.float32)

    def changed(name, index):
        s = {k: v.clone() for k, v in state.items()}
        s[name].view(-1)[index] += 1.0
        return weights_checksum(s, torch.float32)

    # inside the slice: any change shows
    assert changed("model.embed_tokens.weight", 15 * 32 + 31) != ref  # last element of the 16 rows read
    assert changed("model.layers.2.post_attention_layernorm.weight", 0) != ref
    assert changed("model.norm.weight", 31) != ref
    # outside it: projections (fused differently in vLLM), embedding rows past the first 16, the head
    assert changed("model.layers.0.self_attn.q_proj.weight", 0) == ref
    assert changed("model.embed_tokens.weight", 16 * 32) == ref
    assert changed("lm_head.weight", 0) == ref
    # padding rows appended to the vocabulary (as vLLM does) are not read
    padded = dict(state, **{"model.embed_tokens.weight": torch.cat([state["model.embed_tokens.weight"],
                                                                    torch.randn(24, 32)])})
    assert weights_checksum(padded, torch.float32) == ref


def test_checksum_is_taken_in_the_engine_dtype():
    """The learner hashes its fp32 weights cast to bf16; the engine hashes the bf16 values it loaded."""
    state = _llama().state_dict()
    engine_side = {k: v.to(torch.bfloat16) for k, v in state.items()}
    assert weights_checksum(state, torch.bfloat16) == weights_checksum(engine_side, torch.bfloat16)
    assert weights_checksum(state, torch.bfloat16) != weights_checksum(state, torch.float32)


def test_engine_checkpoint_names_expand_fused_and_tied():
    embed, head = object(), object()
    params = [("model.embed_tokens.weight", embed), ("model.layers.0.self_attn.qkv_proj.weight", object()),
              ("model.layers.0.self_attn.qkv_proj.bias", object()), ("model.layers.0.mlp.gate_up_proj.weight", object()),
              ("model.norm.weight", object()), ("lm_head.weight", embed)]
    packed = {"qkv_proj": ["q_proj", "k_proj", "v_proj"], "gate_up_proj": ["gate_proj", "up_proj"]}
    required, optional = engine_checkpoint_names(params, packed)
    assert required == {"model.embed_tokens.weight", "model.norm.weight",
                        *(f"model.layers.0.self_attn.{p}_proj.{leaf}" for p in "qkv" for leaf in ("weight", "bias")),
                        "model.layers.0.mlp.gate_proj.weight", "model.layers.0.mlp.up_proj.weight"}
    assert optional == {"lm_head.weight"}
    untied = engine_checkpoint_names(params[:-1] + [("lm_head.weight", head)], packed)
    assert "lm_head.weight" in untied[0] and not untied[1]


def test_check_checkpoint_names():
    required, optional = {"a.weight", "b.weight"}, {"lm_head.weight"}
    check_checkpoint_names(["a.weight", "b.weight"], required, optional)
    check_checkpoint_names(["a.weight", "b.weight", "lm_head.weight"], required, optional)
    with pytest.raises(ValueError, match=r"1 missing \['b.weight'\]"):
        check_checkpoint_names(["a.weight"], required, optional)
    with pytest.raises(ValueError, match=r"1 unexpected \['base_model.a.weight'\]"):
        check_checkpoint_names(["a.weight", "b.weight", "base_model.a.weight"], required, optional)
