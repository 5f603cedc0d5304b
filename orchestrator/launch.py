"""Tuner assembly. A single trial is a one-trial Tune experiment on the same path campaigns will use."""

from __future__ import annotations

import os
from pathlib import Path

import ray
from ray import tune

from orchestrator.config import TrialConfig
from orchestrator.trial import bundles, run_trial


def ensure_ray(min_cpus: float) -> None:
    """Start a private local Ray sized for the trial (logical CPUs may exceed the cores) unless one is up."""
    if ray.is_initialized():
        return
    if os.environ.get("RAY_ADDRESS"):
        ray.init()
        return
    cpus = max(os.cpu_count() or 1, int(min_cpus + 0.999))
    ray.init(address="local", num_cpus=cpus, include_dashboard=False,
             runtime_env={"env_vars": {"VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"),
                                       "TOKENIZERS_PARALLELISM": "false"}})


def trainable_for(cfg: TrialConfig):
    return tune.with_resources(run_trial, tune.PlacementGroupFactory(bundles(cfg), strategy="PACK"))


def run_single_trial(cfg: TrialConfig, storage: Path, max_failures: int = 0):
    """Run one trial to completion; returns the Tune Result (None if it errored)."""
    storage.mkdir(parents=True, exist_ok=True)
    need = sum(b.get("CPU", 0) for b in bundles(cfg))
    ensure_ray(need)
    if cfg.output_dir is None:
        cfg = cfg.model_copy(update={"output_dir": str(storage / cfg.name / "trial")})
    tuner = tune.Tuner(
        trainable_for(cfg),
        param_space=cfg.model_dump(),
        run_config=tune.RunConfig(
            name=cfg.name, storage_path=str(storage),
            checkpoint_config=tune.CheckpointConfig(num_to_keep=cfg.checkpoint.keep),
            failure_config=tune.FailureConfig(max_failures=max_failures),
        ),
    )
    results = tuner.fit()
    result = results[0]
    if result.error:
        print(f"trial {cfg.name} failed: {result.error}")
        return None
    print(f"trial {cfg.name} finished; metrics in {cfg.output_dir}/metrics.jsonl")
    return result
