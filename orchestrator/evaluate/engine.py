"""The engine `python -m orchestrator eval` samples with (offline_eval.py): a trial's rollout engine whose policy
is a checkpoint.

`load_checkpoint` turns the checkpoint's learner files into the policy as `export` does
(workers/learner/export.py): a PEFT adapter, loaded as a LoRA on the engine's shared base model, or the full
model gathered from the shards, loaded in place in the engine's dtype (checked by checksum, as a weight sync is).
Every `generate` starts from an empty prefix cache: the trial's shards are sampled one after another here, each
as a fresh engine of the trial sampled it.
"""

from __future__ import annotations

import dataclasses
import tempfile
from pathlib import Path

import ray

from orchestrator.actors.models import resolve_model
from orchestrator.actors.setup import engine_dtype
from orchestrator.config.trial import ModelConfig
from workers.learner.config import LearnerConfig
from workers.models.gpu_runtime import check_gpu_runtime
from workers.rollout.output import Generation
from workers.rollout.worker import RolloutWorker, RolloutWorkerSettings, SamplingRequest


@ray.remote(concurrency_groups={"health": 1})  # as the trial's rollout actor: the same process and threads
class EvalEngine(RolloutWorker):
    def __init__(self, model_cfg: dict, settings: RolloutWorkerSettings):
        check_gpu_runtime()
        self.model_path = resolve_model(ModelConfig(**model_cfg))
        super().__init__(self.model_path, dataclasses.replace(settings, dtype=engine_dtype(settings.dtype)))

    def load_checkpoint(self, files: dict[str, bytes], learner: LearnerConfig, version: int, source: str) -> int:
        """The checkpoint's policy (`files`: its learner blob and shards by name) as the engine's; its version."""
        import torch

        from workers.learner.export import export_policy_dir
        from workers.sync.full_weights import iter_safetensors, pack_weights, weights_checksum
        from workers.sync.policy import PolicyUpdate

        with tempfile.TemporaryDirectory(prefix="eval-policy-") as d:
            kind = export_policy_dir(files, self.model_path, learner, d, source=source)
            if kind == "adapter":
                update = PolicyUpdate("adapter", version, {p.name: p.read_bytes() for p in Path(d).iterdir()
                                                           if p.is_file() and p.name.startswith("adapter_")})
            else:
                state, dtype = dict(iter_safetensors(d)), getattr(torch, str(self.engine_kwargs["dtype"]))
                update = PolicyUpdate("weights", version, pack_weights(state, dtype), weights_checksum(state, dtype))
        return self.apply_policy(update)

    def generate(self, prompt_token_ids: list[list[int]], request: SamplingRequest) -> Generation:
        if not self._llm.reset_prefix_cache():
            raise RuntimeError("vLLM did not reset its prefix cache before an evaluation shard")
        return super().generate(prompt_token_ids, request)

    @ray.method(concurrency_group="health")
    def health(self) -> dict:
        return super().health()
