"""The policy update that travels from the learner to the rollout workers, and how a worker's engine takes it.

One interface for every way of syncing the policy: the learner's `export_policy` returns a `PolicyUpdate`; the
driver hands it to every worker with `push` (one object-store copy, every worker reads it); each worker applies
it with the `PolicySync` its engine was built for (`RolloutWorker.apply_policy`). The driver never branches on
the kind: a new transport is a new `PolicySync` (and, where the payload is not files, a new `PolicyUpdate` kind),
see workers/sync/__init__.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable


@dataclass(frozen=True)
class PolicyUpdate:
    """One version of the policy as the rollout engines take it.

    `kind`: "adapter" (PEFT adapter files, `learner.mode: lora`) or "weights" (safetensors files of the full HF
    state dict, `learner.mode: full`); `files`: plain file name -> bytes (nodes share no filesystem, so bytes
    travel through Ray); `checksum`: for "weights", the learner's `full_weights.weights_checksum` in the
    engine's dtype, which each engine compares with its own after loading (None for adapters)."""

    kind: str
    version: int
    files: dict[str, bytes] = field(repr=False)
    checksum: str | None = None


@runtime_checkable
class PolicySync(Protocol):
    """How one rollout worker's vLLM engine takes a `PolicyUpdate` of `kind`. Stateful, one per worker: it
    owns whatever the engine needs between updates (adapter ids and directories, a load counter).

    The worker keeps the policy version and the broken flag: `apply` raises on any failure (after cleaning up
    what it can), and the worker then refuses to sample until a later `apply` succeeds."""

    kind: str

    def engine_args(self) -> dict[str, Any]:
        """The `vllm.LLM` keyword arguments the engine must be built with for this kind of update."""
        ...

    def apply(self, llm, update: PolicyUpdate) -> None:
        """Install `update` in the running engine `llm` (a `vllm.LLM`); raise if it did not take."""
        ...

    def lora_request(self):
        """The `LoRARequest` `generate` must pass (None: the engine's own weights are the policy)."""
        ...

    def lora_ids(self, llm) -> list[int]:
        """Adapter ids the engine `llm` holds (debug view; empty when the policy is not an adapter)."""
        ...


def push(workers: list, update: PolicyUpdate, wait=None) -> int:
    """`update` on every rollout worker actor (`RolloutWorker.apply_policy`), put in the object store once.
    Returns its version once every worker holds it; a worker's failure raises here. `wait(refs)`: how to wait
    for the workers (default `ray.get`; the trial loop's waits under a deadline)."""
    import ray

    ref = ray.put(update)
    (wait or ray.get)([w.apply_policy.remote(ref) for w in workers])
    return update.version


def write_files(path: Path, files: dict[str, bytes], kind: str) -> None:
    """`files` (plain file name -> bytes, as they came from the learner) into a new directory `path`."""
    if not files:
        raise ValueError(f"no {kind} files given")
    path.mkdir(parents=True)
    for name, data in files.items():
        if Path(name).name != name or name in ("", ".", ".."):
            raise ValueError(f"{kind} file name must be a plain file name, got {name!r}")
        (path / name).write_bytes(data)
