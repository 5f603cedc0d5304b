"""The memory one learner GPU needs, computed before launch from the model's config, and the check that refuses a
trial that cannot fit (one line, exit 2) instead of letting it die of CUDA OOM inside an actor.

Parameter counts are exact: the model class is built from its config on the meta device and its parameters (and
the LoRA targets' shapes) counted. Per GPU, with N = resources.learner_ranks, as the learner holds them
(workers/learner/modules.py):
- trained weights (full mode: every weight of the policy, and of a full critic; a LoRA critic's adapter) sharded
  over N: fp32 master weights, fp32 gradients, AdamW's two fp32 moments: 16 bytes per parameter / N;
- frozen weights: the LoRA base (bf16 on one rank, fp32 when sharded: FSDP2 keeps one dtype per unit), the frozen
  KL reference under full mode when KL is on or measured (bf16), / N;
- the unsharded parameters FSDP gathers at a time: the largest decoder layer plus the root's (embeddings, head,
  final norm), in bf16, twice (the next unit is prefetched);
- activations of one micro-batch of `tokens` (max_tokens_per_micro_batch, or the model's whole context when one
  sequence is longer, else micro_batch_size x max_model_len; prompt tokens counted as if they were response
  tokens, an upper bound), in the compute dtype (bf16; fp32 under model.dtype float32), by `activation_bytes`:
  per token and decoder layer 10 hidden-sized and 3 intermediate-sized tensors kept for backward (with gradient
  checkpointing: the layer's input only, and one layer's full set while it is recomputed), the embedding output
  and the final hidden states, and the LM head's pass: the log-prob / entropy pass runs over chunks of
  learner.optim.logits_chunk positions (workers/learner/passes/token_stats.py), each recomputed in backward, so one
  chunk's float32 logits exist at a time, about 6 copies of them (logits, the softmax and its product,
  their gradients). A sharded learner gets the bf16 logits of the whole micro-batch from its FSDP root (kept, a
  gathered copy and the gradient: 3 per token). Under checkpointing the head's backward ends before the layers
  are recomputed: the larger of the two counts, not both. Checked against torch's measured peak on CPU
  (tests/unit/preflight/test_activation_estimate.py), not yet on a GPU;
- cpu_offload moves the sharded fp32 state (weights, gradients, moments) off the GPU;
- offload_between_steps keeps the state in host memory between steps (workers/learner/offload.py): what the rank
  holds while a colocated engine is awake (`resident`) loses the gradients and Adam moments, and under full mode
  every weight but the policy's, which the weight sync reads back while the engine is awake.
Approximate are the activation constants and what the allocator fragments: the check keeps 10% of the GPU free.

A shared-base pool's learner (`resources.shared_base: {slots: N}`, `SharedLearnerMemory`) holds the frozen base
ONCE and, per slot, one trial's trained parameters' fp32 weights, gradients and two Adam moments (16 bytes a
parameter: the policy's adapter and a critic's head and adapter); the gradients are counted per slot, an upper
bound (a slot's are freed after its step only when zero_grad drops them). The activations and gathered layers
are ONE micro-batch's (the learner trains one slot per call), as in the separate estimate.
"""

from __future__ import annotations

from dataclasses import dataclass

from orchestrator.config.errors import UserError
from orchestrator.config.trial import TrialConfig

GIB = 2**30
RESERVE = 0.10  # of the GPU kept free: CUDA context, NCCL buffers, allocator fragmentation
# GPU memory by Ray's accelerator_type label (ray.util.accelerators): GiB the device reports
GPU_MEMORY_GIB = {"H100": 79.6, "H200": 139.8, "B200": 178.0, "A100": 79.2, "A100-80G": 79.2, "A100-40G": 39.4,
                  "L40S": 44.4, "L4": 22.0, "A10G": 22.0, "V100": 31.7, "T4": 14.6}


@dataclass(frozen=True)
class ModelCounts:
    params: int  # every parameter of the causal LM (tied ones once)
    decoder: int  # the decoder without the LM head (the full critic's trunk)
    largest_layer: int
    root: int  # parameters outside the decoder layers: embeddings, head, final norm
    lora: int  # LoRA parameters at the policy's rank and targets
    lora_dims: tuple[tuple[str, int], ...]  # per LoRA-able Linear name: in + out features summed over the model
    hidden: int
    intermediate: int
    layers: int
    vocab: int
    kv_per_token: int = 0  # bytes of the engine's bf16 KV cache per token (K and V of every layer)


def _config_here(model_path: str) -> bool:
    """Whether the model's config.json is on this machine: a local directory, or the local hub cache."""
    from pathlib import Path

    if (Path(model_path).expanduser() / "config.json").is_file():
        return True
    from huggingface_hub import try_to_load_from_cache

    return isinstance(try_to_load_from_cache(model_path, "config.json"), str)


def model_counts(model_path: str, cfg: TrialConfig, local_only: bool = False) -> ModelCounts | None:
    """Exact counts from the model's config, or None when the config cannot be read here (`local_only`: from a
    local path or the local hub cache only, never the network)."""
    if local_only and not _config_here(model_path):
        return None  # nothing to count here: decided without importing transformers or torch
    import torch  # the model is built on the meta device: shapes only, no weights
    from transformers import AutoConfig, AutoModelForCausalLM

    try:
        config = AutoConfig.from_pretrained(model_path, local_files_only=local_only)
    except (OSError, ValueError):
        return None
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    layers = [m for m in model.modules() if type(m).__name__.endswith("DecoderLayer")]
    total = sum(p.numel() for p in model.parameters())
    in_layers = sum(p.numel() for layer in layers for p in layer.parameters())
    head = model.get_output_embeddings()
    tied = head is not None and head.weight is model.get_input_embeddings().weight
    dims: dict[str, int] = {}
    for name, m in model.named_modules():
        if isinstance(m, torch.nn.Linear):
            key = name.rsplit(".", 1)[-1]
            dims[key] = dims.get(key, 0) + m.in_features + m.out_features
    lora_dims = tuple(sorted(dims.items()))
    text = getattr(config, "text_config", None) or config
    return ModelCounts(params=total, decoder=total - (0 if tied or head is None else head.weight.numel()),
                       largest_layer=max((sum(p.numel() for p in m.parameters()) for m in layers), default=0),
                       root=total - in_layers, lora=lora_params(lora_dims, cfg.learner.lora),
                       lora_dims=lora_dims, hidden=text.hidden_size,
                       intermediate=getattr(text, "intermediate_size", 4 * text.hidden_size),
                       layers=len(layers), vocab=text.vocab_size, kv_per_token=_kv_per_token(text, len(layers)))


def _kv_per_token(text, layers: int) -> int:
    heads = text.num_attention_heads
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // heads
    return 2 * 2 * layers * (getattr(text, "num_key_value_heads", None) or heads) * head_dim


def lora_params(dims: tuple[tuple[str, int], ...], lora) -> int:
    """LoRA parameters of one adapter: rank x (in + out) of every targeted Linear."""
    return sum(lora.rank * d for name, d in dims if name in lora.target_modules)


@dataclass(frozen=True)
class LearnerMemory:
    """Bytes one learner GPU holds, by kind."""

    weights: float
    grads: float
    optimizer: float
    gathered: float
    activations: float
    ranks: int
    offloaded: float = 0.0  # of weights + grads + optimizer, what offload_between_steps holds on the host

    @property
    def total(self) -> float:
        return self.weights + self.grads + self.optimizer + self.gathered + self.activations

    @property
    def resident(self) -> float:
        """What the rank keeps between steps (the gathered layers and activations are freed after each step; the
        offloaded state waits in host memory)."""
        return self.weights + self.grads + self.optimizer - self.offloaded

    def describe(self) -> str:
        parts = ("weights", "grads", "optimizer", "gathered", "activations")
        return f"{self.total / GIB:.1f} GiB (" + ", ".join(
            f"{p} {getattr(self, p) / GIB:.1f}" for p in parts) + ")"


def learner_memory(cfg: TrialConfig, counts: ModelCounts, ranks: int | None = None) -> LearnerMemory:
    """Per-GPU bytes of the learner of `cfg` (see module docstring) on `ranks` ranks (default: the trial's)."""
    n = ranks or cfg.resources.learner_ranks
    lrn, iv = cfg.learner, cfg.interventions
    full, sharded = lrn.mode == "full", n > 1 or lrn.cpu_offload or lrn.mode == "full"
    trained = counts.params if full else counts.lora
    frozen_bytes = 0.0 if full else counts.params * (4 if sharded else 2)
    if cfg.credit.uses_critic:  # its own trunk (critic.model full), or an adapter on the policy's base
        critic = lrn.critic
        trained += counts.hidden + 1 + (counts.decoder if critic.model == "full"
                                        else lora_params(counts.lora_dims, critic.lora or lrn.lora))
    if full and (iv.kl.is_active or iv.kl.measure):
        frozen_bytes += 2 * counts.params
    offload = 0.0 if lrn.cpu_offload else 1.0
    weights = (4 * trained * offload + frozen_bytes) / n
    grads, optimizer = 4 * trained * offload / n, 8 * trained * offload / n
    gathered = 2 * 2 * (counts.largest_layer + counts.root) if sharded else 0.0
    activations = activation_bytes(counts, micro_batch_tokens(cfg), lrn.optim.logits_chunk,
                                   checkpointing=lrn.gradient_checkpointing, logits_from_model=sharded,
                                   act_bytes=4 if cfg.model.dtype == "float32" else 2)
    offloaded = 0.0
    if lrn.offload_between_steps:  # the policy's fp32 weights come back for the weight sync (full mode)
        offloaded = grads + optimizer + (weights - 4 * counts.params * offload / n if full else 0.0)
    return LearnerMemory(weights, grads, optimizer, gathered, activations, n, offloaded)


def micro_batch_tokens(cfg: TrialConfig) -> int:
    """The most tokens one micro-batch holds: the token budget (a longer sequence goes alone: the context), else
    micro_batch_size whole contexts."""
    optim, context = cfg.learner.optim, cfg.model.max_model_len
    if optim.max_tokens_per_micro_batch:
        return max(optim.max_tokens_per_micro_batch, context)
    return optim.micro_batch_size * context


LOGIT_COPIES = 6  # float32 [chunk, V] tensors alive in the head's pass (measured: test_activation_estimate.py)


def activation_bytes(counts: ModelCounts, tokens: int, chunk: int | None, *, checkpointing: bool,
                     logits_from_model: bool, act_bytes: int = 2, positions: int | None = None) -> float:
    """Peak activation bytes of one micro-batch's forward and backward (module docstring). `positions`: the
    response positions the head scores (default: every token, an upper bound); `chunk`: logits_chunk."""
    positions = tokens if positions is None else positions
    layer = act_bytes * (10 * counts.hidden + 3 * counts.intermediate) * tokens  # one layer's kept tensors
    around = 2 * act_bytes * counts.hidden * tokens  # the embedding output and the final hidden states
    head = min(positions, chunk or positions) * counts.vocab * (4 * LOGIT_COPIES + (act_bytes if act_bytes < 4 else 0))
    if logits_from_model:
        around += 3 * act_bytes * counts.vocab * positions
    if checkpointing:
        return around + act_bytes * counts.hidden * counts.layers * tokens + max(head, layer)
    return around + layer * counts.layers + head


def gpu_memory_gib(cfg: TrialConfig) -> float | None:
    """One learner GPU's memory: resources.gpu_memory_gb, else by accelerator_type, else unknown."""
    r = cfg.resources
    if r.gpu_memory_gb is not None:
        return r.gpu_memory_gb * 1e9 / GIB
    return GPU_MEMORY_GIB.get(r.accelerator_type or "")


def check_learner_memory(cfg: TrialConfig, model_path: str, source: str, name: str,
                         local_only: bool = False) -> str | None:
    """UserError (one line) when the trial's learner cannot fit its GPUs; the estimate as a line otherwise (None
    when there is no learner GPU or the model's config cannot be read here)."""
    if cfg.resources.learner_gpus <= 0:
        return None
    counts = model_counts(model_path, cfg, local_only)
    if counts is None:
        return None
    need = learner_memory(cfg, counts)
    have = gpu_memory_gib(cfg)
    line = f"trial {name}: the learner needs about {need.describe()} per GPU on {need.ranks} rank(s)"
    if have is None or need.total / GIB <= have * (1 - RESERVE):
        if have is not None and cfg.resources.placement == "colocated":
            return line + f" of {have:.0f} GiB; " + _colocated(cfg, need, have, source)
        return line + (f" of {have:.0f} GiB" if have is not None else " (GPU memory unknown: set "
                       "resources.accelerator_type or resources.gpu_memory_gb to check it)")
    fits = next((k for k in range(need.ranks + 1, 257)
                 if learner_memory(cfg, counts, k).total / GIB <= have * (1 - RESERVE)), None)
    how = (f"raise resources.learner_ranks to {fits}" if fits is not None
           else "more ranks alone will not do")
    gpu = cfg.resources.accelerator_type or "learner GPU"
    raise UserError(f"{source}: resources.learner_ranks: {line} and a{'n' if gpu[0] in 'AEHILMNORSX' else ''} "
                    f"{gpu} has {have:.0f} GiB ({RESERVE:.0%} kept free): {how}, or set learner.gradient_checkpointing, "
                    "learner.cpu_offload, or a smaller learner.optim.max_tokens_per_micro_batch or logits_chunk")


def _colocated(cfg: TrialConfig, need: LearnerMemory, have: float, source: str) -> str:
    """Both phases of a colocated GPU (orchestrator/preflight/colocated_memory.py) as a line, or UserError."""
    from orchestrator.preflight.colocated_memory import phase_fit, refusal

    util = cfg.rollout.engine.gpu_memory_utilization
    fit = phase_fit(util, need.total / GIB, need.resident / GIB, have, RESERVE)
    why = refusal(fit, util, cfg.learner.offload_between_steps)
    if why is not None:
        raise UserError(f"{source}: {why[0]}: resources.placement 'colocated' on a {have:.0f} GiB GPU: {why[1]}")
    return (f"colocated with an engine at {util:g}: generate phase {fit.generate:.1f} GiB, train phase "
            f"{fit.train:.1f} GiB of {fit.usable:.1f} usable")


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
