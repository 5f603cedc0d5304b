"""What every actor of the project shares at start-up, whoever starts it (a trial, the shared pool, the offline
evaluation): where it runs (`where_am_i`, for placement records), the dtype its engine runs in, and how a trial's
config becomes rollout-engine settings (`rollout_settings`)."""

from __future__ import annotations

import os

import ray
import torch

from orchestrator.config.placement import colocated
from orchestrator.config.trial import TrialConfig
from workers.rollout.worker import RolloutWorkerSettings


def where_am_i() -> dict:
    ctx = ray.get_runtime_context()
    return {"placement_group": ctx.get_placement_group_id(), "gpu_ids": [str(g) for g in ray.get_gpu_ids()],
            "pid": os.getpid(), "actor_id": ctx.get_actor_id()}  # a restarted actor: the same id, a new pid


def engine_dtype(dtype: str) -> str:
    """'auto' is decided where the engine runs: bf16 on a real GPU, fp32 on CPU (logical GPUs included)."""
    if dtype != "auto":
        return dtype
    return "bfloat16" if torch.cuda.is_available() else "float32"


def rollout_engine(cfg: TrialConfig) -> dict:
    """`rollout.engine` as the workers get it. `in_process: null` is decided by the worker (on for the CPU build),
    except when generation runs ahead (`one_step_off`, async with max_staleness > 0): separate processes: generation then overlaps the learner, and vLLM's
    CPU worker inside the actor fought the learner for the same cores (measured on 2 cores, benchmarks/async.py:
    one_step_off ran at 0.24x sync's steps/s in-process, 0.93x with separate processes)."""
    engine = cfg.rollout.engine.model_dump()
    if engine["in_process"] is None and cfg.rollout.staleness_bound > 0:  # one_step_off, async k > 0
        engine["in_process"] = False
    return engine


def rollout_settings(cfg: TrialConfig) -> RolloutWorkerSettings:
    """How the trial's rollout workers build their engines. Full mode: no LoRA in the engine, the weights
    themselves are reloaded."""
    return RolloutWorkerSettings(
        dtype=cfg.model.dtype, seed=cfg.seed, max_model_len=cfg.model.max_model_len,
        max_lora_rank=cfg.learner.lora.rank, engine=rollout_engine(cfg), enable_lora=cfg.learner.mode == "lora",
        sleep_mode=colocated(cfg))
