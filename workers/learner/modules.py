"""The learner's models, by `learner.mode`, and how they are sharded over the learner group.

- lora: the policy is a PEFT LoRA adapter on frozen base weights; the KL reference is the same model with the
  adapter disabled (no second copy).
- full: every weight of the policy trains; the reference is a frozen copy, loaded only when KL is on or measured.
In both, the weights are float32 on CPU; on GPU a sharded learner keeps float32 master weights and computes in
bfloat16 (FSDP2's mixed precision: bf16 params, fp32 gradient reduction), while an unsharded LoRA learner loads
the frozen base in the model's bf16 as before.

Sharding (`shard`): FSDP2's `fully_shard` on every decoder layer, then on the root, over a 1-D mesh of the group;
it runs on CPU with gloo too (torch 2.13), so the CPU tests exercise the same code path a GPU cluster runs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

if TYPE_CHECKING:
    from workers.learner.config import LoraSettings

DECODER_LAYER_SUFFIX = "DecoderLayer"  # LlamaDecoderLayer, Qwen2DecoderLayer, Qwen3DecoderLayer, ...


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The transformer blocks of a HF causal LM (each becomes one FSDP unit: gathered one at a time)."""
    return [m for m in model.modules() if type(m).__name__.endswith(DECODER_LAYER_SUFFIX)]


def shard(model: nn.Module, world: int, *, cuda: bool, cpu_offload: bool,
          param_dtype: torch.dtype = torch.bfloat16) -> nn.Module:
    """FSDP2-shard `model` in place over the `world` ranks of the default process group; `param_dtype` is the
    compute dtype (bf16 on GPU: the fp32 master weights are cast per layer as they are gathered).

    The gradient divide factor is 1: each rank's loss already carries the whole mini-batch's denominators, so the
    reduced gradient must be the sum over ranks, not their mean."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import (
        CPUOffloadPolicy,
        FSDPModule,
        MixedPrecisionPolicy,
        OffloadPolicy,
        fully_shard,
    )

    mesh = init_device_mesh("cuda" if cuda else "cpu", (world,))
    mp = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32) \
        if param_dtype != torch.float32 else MixedPrecisionPolicy()
    kw = {"mesh": mesh, "mp_policy": mp, "offload_policy": CPUOffloadPolicy() if cpu_offload else OffloadPolicy()}
    for layer in decoder_layers(model):
        fully_shard(layer, **kw)
    fully_shard(model, **kw)
    for m in model.modules():
        if isinstance(m, FSDPModule):
            m.set_gradient_divide_factor(1.0)
            m.set_force_sum_reduction_for_comms(True)  # a plain SUM: gloo has no PREMUL_SUM
    return model


def load_causal_lm(path: str, dtype: torch.dtype, device: str, gradient_checkpointing: bool = False) -> nn.Module:
    from workers.models.loading import load_model

    model = load_model(path, dtype=dtype, device=device)
    if gradient_checkpointing:
        checkpoint_activations(model)
    return model


def checkpoint_activations(model: nn.Module) -> None:
    """Activations recomputed in backward (train mode only)."""
    model.config.use_cache = False
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


def lora_config(settings: LoraSettings):
    from peft import LoraConfig

    return LoraConfig(r=settings.rank, lora_alpha=settings.alpha, lora_dropout=settings.dropout,
                      target_modules=settings.target_modules, task_type="CAUSAL_LM")


def frozen_copy(path: str, dtype: torch.dtype, device: str) -> nn.Module:
    """The KL reference of full mode: the initial policy, never trained, in eval mode."""
    model = load_causal_lm(path, dtype, device)
    model.requires_grad_(False)
    return model.eval()


def hf_model(model: nn.Module) -> nn.Module:
    """The transformers model under a PEFT wrapper (or the model itself in full mode)."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def response_source(model: nn.Module, ids: torch.Tensor, mask: torch.Tensor, idx: torch.Tensor,
                    head_only: bool, sharded: bool) -> tuple[torch.Tensor, nn.Module | None]:
    """What the response window's logits at positions `idx [b, T]` (the position before each response token) are
    computed from: (`[b, T, H]` hidden states, the LM head) or (`[b, T, V]` logits, None).

    Sharded: through the root module (FSDP gathers its own parameters in the root's forward hooks, so no
    sub-module may be called on its own), with the LM head on the span of positions any row needs
    (`logits_to_keep`): logits. Unsharded with a linear head: the decoder over the sequence, its hidden states at
    the response positions and the head, which the caller applies per chunk (workers/learner/passes/token_stats.py).
    Otherwise full logits, then gathered."""
    if sharded:
        lo, hi = int(idx.min()), int(idx.max()) + 1
        logits = model(input_ids=ids, attention_mask=mask, logits_to_keep=torch.arange(lo, hi, device=ids.device),
                       use_cache=False).logits
        return logits.gather(1, (idx - lo)[..., None].expand(-1, -1, logits.shape[-1])), None
    if head_only:
        hf = hf_model(model)
        hidden = getattr(hf, hf.base_model_prefix)(input_ids=ids, attention_mask=mask).last_hidden_state
        return hidden.gather(1, idx[..., None].expand(-1, -1, hidden.shape[-1])), hf.get_output_embeddings()
    logits = model(input_ids=ids, attention_mask=mask).logits
    return logits.gather(1, idx[..., None].expand(-1, -1, logits.shape[-1])), None


def full_state(model: nn.Module, *, trainable_only: bool = False, sharded: bool) -> dict[str, torch.Tensor]:
    """The model's whole (unsharded) state dict on the CPU, on rank 0 (other ranks of a group get {}). A
    collective call on a sharded model."""
    if not sharded:
        return {k: v.detach().cpu() for k, v in model.state_dict().items()
                if not trainable_only or _trainable(model, k)}
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(model, options=StateDictOptions(
        full_state_dict=True, cpu_offload=True, ignore_frozen_params=trainable_only))


def _trainable(model: nn.Module, key: str) -> bool:
    param = dict(model.named_parameters()).get(key)
    return param is not None and param.requires_grad


def clip_grad_norm(params: list[nn.Parameter], max_norm: float) -> float:
    """`torch.nn.utils.clip_grad_norm_` over parameters some of which may be FSDP-sharded (DTensor gradients,
    their norm reduced over the group) and some replicated; returns the total norm before clipping."""
    from torch.distributed.tensor import DTensor

    grads = [p.grad for p in params if p.grad is not None]
    if not any(isinstance(g, DTensor) for g in grads):
        return float(torch.nn.utils.clip_grad_norm_(params, max_norm))
    parts = []
    for group in ([g for g in grads if isinstance(g, DTensor)], [g for g in grads if not isinstance(g, DTensor)]):
        if group:
            n = torch.nn.utils.get_total_norm(group)
            parts.append(float(n.full_tensor() if isinstance(n, DTensor) else n))
    total = sum(x * x for x in parts) ** 0.5
    coef = min(max_norm / (total + 1e-6), 1.0)  # torch's formula: clip_coef clamped to 1
    for g in grads:
        g.mul_(coef)
    return total


def sum_grads(params: list[nn.Parameter]) -> None:
    """Sum the gradients of replicated (unsharded) parameters over the group."""
    import torch.distributed as dist

    for p in params:
        if p.grad is not None:
            dist.all_reduce(p.grad)
