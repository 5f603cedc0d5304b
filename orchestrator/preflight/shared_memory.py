"""The memory of a shared-base pool (`resources.shared_base: {slots: N}`), before launch: the pool's learner GPU
holds the base model ONCE and, per slot, one trial's adapter with its gradients and AdamW moments; the pool's
engine GPU holds the base once, vLLM's LoRA buffers for `max_loras` = N adapters, and a KV cache the N trials'
sequences share.

- learner (one rank, LoRA): base = the frozen weights of the separate estimate (`LearnerMemory`, bf16 on one
  rank); per slot = the trained parameters' fp32 weights + gradients + two Adam moments (16 bytes a parameter: the
  policy's adapter and a critic's head and adapter). Gradients are counted per slot, an upper bound: the learner
  trains one slot per call, and a slot's gradients are freed after its step only when zero_grad drops them. The
  activations and gathered layers are those of ONE micro-batch (slots train one at a time), as in the separate
  estimate.
- engine: vLLM's share (gpu_memory_utilization x the device) = base weights + N adapters in the engine's dtype
  (vLLM allocates the `max_loras` slots up front) + KV cache; each slot's share of the KV cache must hold at
  least one `model.max_model_len` sequence, else a trial's longest sequence could wait behind the others'
  forever. vLLM's own activations / CUDA graphs and the punica kernels' buffers are not counted, as in the
  separate engine estimate (engine_memory.py): the KV figure is an upper bound.
The functions below are pure functions of byte counts, so the unit tests check them in closed form.
"""

from __future__ import annotations

from dataclasses import dataclass

from orchestrator.preflight.learner_memory import GIB, LearnerMemory


@dataclass(frozen=True)
class SharedLearnerMemory:
    base: float  # frozen base weights, once
    per_slot: float  # one trial's adapter (+ critic) fp32 weights, gradients and Adam moments
    working: float  # one micro-batch's activations + gathered layers (one slot trains at a time)
    slots: int

    @property
    def total(self) -> float:
        return self.base + self.slots * self.per_slot + self.working

    def describe(self) -> str:
        return (f"{self.total / GIB:.1f} GiB (base {self.base / GIB:.1f} once, {self.slots} slot(s) x "
                f"{self.per_slot / GIB:.2f} adapter + grads + Adam, activations {self.working / GIB:.1f})")


def shared_learner(mem: LearnerMemory, slots: int) -> SharedLearnerMemory:
    """The pool's learner GPU from a separate trial's estimate: its trained weights' bytes equal its gradients'
    (both 4 bytes a trained parameter), the rest of its weights is the frozen base."""
    return SharedLearnerMemory(base=mem.weights - mem.grads, per_slot=2 * mem.grads + mem.optimizer,
                               working=mem.gathered + mem.activations, slots=slots)


def slots_fitting_learner(mem: LearnerMemory, usable: float) -> int:
    """The most slots whose shared learner fits `usable` bytes (0: not even one)."""
    one = shared_learner(mem, 0)
    room = usable - one.total
    if room < 0:
        return 0
    return int(room // one.per_slot) if one.per_slot > 0 else 10**6


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
    from orchestrator.preflight.engine_memory import engine_memory

    one = engine_memory(cfg, counts, have_gib)
    tp = cfg.rollout.engine.tensor_parallel_size
    adapter = counts.lora * (4 if cfg.model.dtype == "float32" else 2) / tp
    return shared_engine(one.share, one.weights, adapter, counts.kv_per_token / tp, slots)


def pool_kv_tokens(cfg, slots: int, resolve=None) -> int | None:
    """Tokens the KV caches of the pool's engines hold together (None: the model's config is not on this machine,
    or the GPU's memory is not named)."""
    from orchestrator.preflight.learner_memory import gpu_memory_gib, model_counts
    from orchestrator.trial.actors.models import resolve_model_quietly

    have = gpu_memory_gib(cfg)
    counts = model_counts((resolve or resolve_model_quietly)(cfg.model), cfg, local_only=True) if have else None
    if counts is None:
        return None
    return pool_engine(cfg, counts, have, slots).kv_tokens * cfg.rollout.num_workers


def shared_lines(cfg, counts, have_gib: float, slots: int, source: str, refuse: bool) -> list[str]:
    """The pool's learner and engine GPU for `slots` trials of this shape as lines, with the most slots each GPU
    holds; `refuse` (the campaign sets resources.shared_base): UserError (one line) when `slots` do not fit."""
    from orchestrator.config.errors import UserError
    from orchestrator.preflight.learner_memory import RESERVE, learner_memory

    usable = have_gib * (1 - RESERVE) * GIB
    mem = learner_memory(cfg, counts, 1)
    lrn = shared_learner(mem, slots)
    eng = pool_engine(cfg, counts, have_gib, slots)
    adapter = eng.adapters / max(slots, 1)
    per_token = counts.kv_per_token / cfg.rollout.engine.tensor_parallel_size
    most_l = slots_fitting_learner(mem, usable)
    most_e = slots_fitting_engine(eng.share, eng.weights, adapter, per_token, cfg.model.max_model_len)
    if refuse and (slots > most_l or slots > most_e):
        what = (f"the pool's learner needs {lrn.describe()} of {usable / GIB:.1f} usable" if slots > most_l else
                f"the pool's engine KV cache holds {eng.kv_per_slot:,} tokens a slot, less than one model.max_model_len "
                f"({cfg.model.max_model_len}) sequence")
        raise UserError(f"{source}: resources.shared_base.slots: {slots} slots on a {have_gib:.0f} GiB GPU: {what}: "
                        f"at most {min(most_l, most_e)} slot(s) fit (learner {most_l}, engine {most_e})")
    return [f"shared base, {slots} slot(s): learner GPU {lrn.describe()} of {have_gib:.0f} GiB; at most {most_l} "
            "slot(s) fit",
            f"  engine GPU {eng.describe()}; at most {most_e} slot(s) hold a {cfg.model.max_model_len}-token sequence "
            "each"]
