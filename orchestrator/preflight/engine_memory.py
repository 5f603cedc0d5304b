"""The rollout engine's memory per GPU, before launch: vLLM takes `rollout.engine.gpu_memory_utilization` of the
device, holds the model's weights (bf16, split over tensor_parallel_size GPUs) and fills the rest with KV cache;
an engine whose share cannot hold one `model.max_model_len` sequence beside its weights fails at start. The share
vLLM also keeps for its own activations and CUDA graphs is not counted (a few GiB at most: an upper bound on the
KV cache, not a lower one). And, for a trial placed `separate`, what `colocated` would need on the same GPU.

A shared-base pool's engine (`resources.shared_base: {slots: N}`, `SharedEngineMemory`): the same share holds the
base once, vLLM's LoRA buffers for `max_loras` = N adapters in the engine's dtype (allocated up front), and a KV
cache the N trials' sequences share; each slot's share of it must hold one `model.max_model_len` sequence, else a
trial's longest sequence could wait behind the others' forever. vLLM's punica buffers are not counted either."""

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


@dataclass(frozen=True)
class SharedEngineMemory:
    share: float  # bytes vLLM takes
    weights: float
    adapters: float  # N adapters in the engine's dtype
    kv_tokens: int  # tokens the rest holds, for all slots together
    slots: int

    @property
    def kv_per_slot(self) -> int:
        return self.kv_tokens // max(self.slots, 1)

    def describe(self) -> str:
        kv = self.share - self.weights - self.adapters
        return (f"{self.share / GIB:.1f} GiB (weights {self.weights / GIB:.1f} once, {self.slots} adapter(s) "
                f"{self.adapters / GIB:.2f}, KV cache {kv / GIB:.1f} for about {self.kv_tokens:,} tokens: "
                f"{self.kv_per_slot:,} a slot)")


def shared_engine(share: float, weights: float, adapter: float, kv_per_token: float, slots: int) -> SharedEngineMemory:
    """One engine GPU of the pool: `share` bytes for vLLM, `weights` the base on this GPU, `adapter` one adapter's
    bytes, `kv_per_token` the KV cache's bytes a token on this GPU."""
    adapters = slots * adapter
    kv = max(int((share - weights - adapters) // max(kv_per_token, 1)), 0)
    return SharedEngineMemory(share, weights, adapters, kv, slots)


def slots_fitting_engine(share: float, weights: float, adapter: float, kv_per_token: float, context: int) -> int:
    """The most slots whose engine holds, beside the base and their adapters, one `context` sequence each."""
    per_slot = adapter + context * max(kv_per_token, 1)
    room = share - weights
    return max(int(room // per_slot), 0)


def pool_engine(cfg, counts, have_gib: float, slots: int) -> SharedEngineMemory:
    """One engine GPU of the pool of `slots` trials of `cfg`'s shape on a `have_gib` GPU."""
    one = engine_memory(cfg, counts, have_gib)
    tp = cfg.rollout.engine.tensor_parallel_size
    adapter = counts.lora * (4 if cfg.model.dtype == "float32" else 2) / tp
    return shared_engine(one.share, one.weights, adapter, counts.kv_per_token / tp, slots)
