"""The policy-sync interface without vLLM: what each `PolicySync` asks of the engine and does with an update,
against a stand-in engine (the real one: tests/integration/rollout/test_rollout.py and test_weight_sync.py)."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest

from workers.sync.adapter import AdapterSync
from workers.sync.full_weights import WEIGHT_SYNC_EXTENSION, FullWeightSync
from workers.sync.policy import PolicySync, PolicyUpdate


class FakeEngine:
    """The parts of `vllm.LLM` the syncs use: `llm_engine.add_lora/remove_lora/list_loras`, `collective_rpc`,
    `reset_prefix_cache`."""

    def __init__(self, checksum: str = "c", add_ok: bool = True):
        self.llm_engine = self
        self.loras: dict[int, str] = {}
        self.checksum, self.add_ok, self.loaded_from = checksum, add_ok, []

    def add_lora(self, req) -> bool:
        if self.add_ok:
            self.loras[req.lora_int_id] = req.lora_path
        return self.add_ok

    def remove_lora(self, int_id: int) -> None:
        del self.loras[int_id]

    def list_loras(self) -> set[int]:
        return set(self.loras)

    def collective_rpc(self, method: str, args=()):
        assert method == "sync_load_weights"
        self.loaded_from.append(sorted(p.name for p in Path(args[0]).iterdir()))
        return [self.checksum]

    def reset_prefix_cache(self) -> bool:
        return True


def test_an_update_pickles_whole():
    u = PolicyUpdate("weights", 3, {"model.safetensors": b"x"}, "abc")
    assert (u.kind, u.version, u.files, u.checksum) == ("weights", 3, {"model.safetensors": b"x"}, "abc")
    assert pickle.loads(pickle.dumps(u)) == u
    assert "b'x'" not in repr(u)  # file bytes stay out of logs


def test_each_sync_builds_its_engine(tmp_path):
    adapter, full = AdapterSync(tmp_path, 16), FullWeightSync(tmp_path)
    assert isinstance(adapter, PolicySync) and isinstance(full, PolicySync)
    assert adapter.engine_args() == {"enable_lora": True, "max_lora_rank": 16, "max_loras": 1}
    assert full.engine_args() == {"enable_lora": False, "worker_extension_cls": WEIGHT_SYNC_EXTENSION}
    assert (adapter.kind, full.kind) == ("adapter", "weights")


def test_adapter_sync_keeps_one_adapter_and_drops_all_on_failure(tmp_path):
    pytest.importorskip("vllm")
    engine, sync = FakeEngine(), AdapterSync(tmp_path, 8)
    sync.apply(engine, PolicyUpdate("adapter", 1, {"adapter_config.json": b"{}"}))
    sync.apply(engine, PolicyUpdate("adapter", 2, {"adapter_config.json": b"{}"}))
    assert sync.lora_ids(engine) == [2] and sync.lora_request().lora_int_id == 2
    assert [p.name for p in tmp_path.iterdir()] == ["v2_id2"]
    engine.add_ok = False
    with pytest.raises(RuntimeError, match="did not add"):
        sync.apply(engine, PolicyUpdate("adapter", 3, {"adapter_config.json": b"{}"}))
    assert sync.lora_request() is None and sync.lora_ids(engine) == [] and not list(tmp_path.iterdir())


def test_full_weight_sync_checks_the_checksum_and_deletes_the_files(tmp_path):
    engine, sync = FakeEngine(checksum="good"), FullWeightSync(tmp_path)
    sync.apply(engine, PolicyUpdate("weights", 1, {"model.safetensors": b"x"}, "good"))
    assert engine.loaded_from == [["model.safetensors"]] and not list(tmp_path.iterdir())
    with pytest.raises(ValueError, match="checksum mismatch"):
        sync.apply(engine, PolicyUpdate("weights", 2, {"model.safetensors": b"x"}, "bad"))
    with pytest.raises(ValueError, match="plain file name"):
        sync.apply(engine, PolicyUpdate("weights", 3, {"../model.safetensors": b"x"}, "good"))
    assert not list(tmp_path.iterdir()) and sync.lora_request() is None and sync.lora_ids(engine) == []
