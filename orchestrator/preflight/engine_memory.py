"""The rollout engine's memory per GPU, before launch: vLLM takes `rollout.engine.gpu_memory_utilization` of the
device, holds the model's weights (bf16, split over tensor_parallel_size GPUs) and fills the rest with KV cache;
an engine whose share cannot hold one `model.max_model_len` sequence beside its weights fails at start. The share
vLLM also keeps for its own activations and CUDA graphs is not counted (a few GiB at most: an upper bound on the
KV cache, not a lower one). And, for a trial placed `separate`, what `colocated` would need on the same GPU."""

from __future__ import annotations

from dataclasses import dataclass

from orchestrator.config.errors import UserError
from orchestrator.config.trial import TrialConfig
from orchestrator.preflight.learner_memory import GIB, RESERVE, LearnerMemory, ModelCounts


@dataclass(frozen=True)
class EngineMemory:
    """Bytes one engine GPU gives vLLM, and how they split."""

    utilization: float
    share: float
    weights: float
    kv_tokens: int  # tokens the rest holds as KV cache

    def describe(self) -> str:
        return (f"{self.share / GIB:.1f} GiB ({self.utilization:g} of the GPU: weights {self.weights / GIB:.1f}, "
                f"KV cache {(self.share - self.weights) / GIB:.1f} for about {self.kv_tokens:,} tokens)")


def engine_memory(cfg: TrialConfig, counts: ModelCounts, have_gib: float) -> EngineMemory:
    eng = cfg.rollout.engine
    tp = eng.tensor_parallel_size
    share = eng.gpu_memory_utilization * have_gib * GIB
    weights = counts.params * (4 if cfg.model.dtype == "float32" else 2) / tp
    per_token = max(counts.kv_per_token / tp, 1)
    return EngineMemory(eng.gpu_memory_utilization, share, weights, max(int((share - weights) // per_token), 0))


def engine_line(cfg: TrialConfig, counts: ModelCounts, have_gib: float, source: str) -> str:
    """The engine's share as a line; UserError (one line) when it cannot hold the weights and one sequence."""
    mem = engine_memory(cfg, counts, have_gib)
    if mem.kv_tokens < cfg.model.max_model_len:
        raise UserError(f"{source}: rollout.engine.gpu_memory_utilization: an engine at {mem.utilization:g} of a "
                        f"{have_gib:.0f} GiB GPU holds {mem.share / GIB:.1f} GiB: weights {mem.weights / GIB:.1f} "
                        f"and KV cache for {mem.kv_tokens:,} tokens, less than one model.max_model_len "
                        f"({cfg.model.max_model_len}) sequence: raise it, or raise tensor_parallel_size")
    return f"engine per GPU: {mem.describe()}"


def colocated_variant(cfg: TrialConfig, need: LearnerMemory, have_gib: float) -> str:
    """What resources.placement 'colocated' would need on the trial's GPU (a separate trial's other option)."""
    from orchestrator.preflight.colocated_memory import phase_fit, refusal

    util = cfg.rollout.engine.gpu_memory_utilization
    fit = phase_fit(util, need.total / GIB, need.resident / GIB, have_gib, RESERVE)
    why = refusal(fit, util, cfg.learner.offload_between_steps)
    head = (f"colocated instead (engine at {util:g} beside each rank): generate phase {fit.generate:.1f} GiB, "
            f"train phase {fit.train:.1f} GiB of {fit.usable:.1f} usable")
    if why is None:
        return head + ": fits"
    if fit.train <= fit.usable and fit.max_utilization >= 0.05:
        return head + f": fits with rollout.engine.gpu_memory_utilization {int(fit.max_utilization * 100) / 100:.2f}"
    return head + ": does not fit"
