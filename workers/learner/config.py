"""Typed settings of the learner (`learner:` in a trial's YAML): mode, LoRA, optimizer, PPO loss, critic.

Embedded in the trial config (orchestrator/config/trial.py) and handed to `workers.learner.learner.Learner` as
objects, so the YAML, the trial's config and what the learner reads are the same. No torch here: `plan` reads
these without importing it.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from workers.objectives.settings import Aggregation

FULL_MODE_LR = 1e-6  # verl's / RAGEN's actor lr for full fine-tuning


class _StrictLearnerConfig(BaseModel):
    """A learner config section whose unknown keys are errors."""

    model_config = ConfigDict(extra="forbid")


class LoraSettings(_StrictLearnerConfig):
    rank: Literal[1, 8, 16, 32, 64, 128, 256] = 8
    alpha: float = 16.0
    dropout: float = Field(0.0, ge=0.0, lt=1.0)
    target_modules: list[str] = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


class OptimConfig(_StrictLearnerConfig):
    lr: float = Field(2e-3, gt=0.0)
    betas: tuple[float, float] = (0.9, 0.99)
    weight_decay: float = Field(0.0, ge=0.0)
    grad_clip: float = Field(1.0, gt=0.0)
    schedule: Literal["constant", "cosine"] = "constant"
    warmup_steps: int = Field(0, ge=0)
    micro_batch_size: int = Field(64, ge=1)
    mini_batch_size: int | None = Field(None, ge=1, description=(
        "trajectories per optimizer step (PPO mini-batches, shuffled each epoch); None = the whole batch"))
    ppo_epochs: int = Field(1, ge=1, description="passes over the batch per training step")
    max_tokens_per_micro_batch: int | None = Field(None, ge=1, description=(
        "micro-batches by a token budget (sequences packed greedily, padded length x rows <= budget) instead of "
        "micro_batch_size sequences; None = by count"))
    logits_chunk: int | None = Field(1024, ge=1, description=(
        "positions whose full-vocabulary float32 logits exist at once in the log-prob / entropy pass (each chunk "
        "recomputed in backward: workers/learner/passes/token_stats.py); None = the whole micro-batch at once"))


class LossConfig(_StrictLearnerConfig):
    clip_low: float = Field(0.2, ge=0.0, lt=1.0)
    clip_high: float = Field(0.2, ge=0.0)
    dual_clip: float | None = Field(3.0, gt=1.0, description=(
        "cap the loss of negative-advantage tokens at -A * dual_clip (verl's clip_ratio_c, always on there); "
        "None: off. The log-ratio is always clamped to +-20 before exp, as in verl"))
    aggregation: Aggregation = "token-mean"


class CriticConfig(_StrictLearnerConfig):
    """The value model of `credit.advantage_mode: gae` (workers/learner/critic.py): a LoRA adapter on the policy's base
    weights plus a scalar head, or (`model: full`) its own full model plus a head; trained with its own optimizer
    on the same mini-batches as the policy."""

    lr: float = Field(1e-5, gt=0.0)
    betas: tuple[float, float] = (0.9, 0.999)
    weight_decay: float = Field(0.0, ge=0.0)
    grad_clip: float = Field(1.0, gt=0.0)
    cliprange_value: float = Field(0.5, gt=0.0, description="value updates are clipped to old value +- this")
    warmup_steps: int = Field(0, ge=0, description=(
        "verl's critic_warmup: the policy is first updated at training step warmup_steps - 1 (counted from 0), so "
        "N > 0 gives N - 1 critic-only steps, as in verl"))
    lora: LoraSettings | None = Field(None, description="the critic adapter's settings; None = the policy's")
    model: Literal["full", "lora"] | None = Field(None, description=(
        "full: the critic is its own full model (the policy's initial weights) with a value head, every weight "
        "trained (RAGEN's shape; full mode only); lora: a LoRA adapter + value head on the policy's base weights, "
        "no second model (under full mode the base is the trained policy: the critic reads the current policy's "
        "hidden states and its loss never moves them). None: the same as learner.mode"))


class LearnerConfig(_StrictLearnerConfig):
    mode: Literal["lora", "full"] = Field("lora", description=(
        "lora: the policy is a LoRA adapter on frozen base weights, the KL reference is the base (adapter "
        "disabled), vLLM hot-swaps the adapter. full: every weight of the policy trains (seed 004's verl FSDP "
        "actor), the reference is a frozen copy loaded only when KL is on or measured, and vLLM reloads the full "
        "weights every step. optim.lr defaults to 1e-6 under full"))
    lora: LoraSettings = LoraSettings()
    optim: OptimConfig = OptimConfig()
    loss: LossConfig = LossConfig()
    critic: CriticConfig = CriticConfig()
    gradient_checkpointing: bool = Field(False, description="recompute activations in backward (less memory)")
    cpu_offload: bool = Field(False, description=(
        "keep the sharded parameters, gradients and optimizer state in CPU memory and step the optimizer there "
        "(FSDP2's CPUOffloadPolicy): less GPU memory, slower steps"))
    offload_between_steps: bool = Field(False, description=(
        "between training steps, move the optimizer state (and under mode full the weights: policy, reference, "
        "critic) to pinned host memory and drop the gradients; they come back at the next step's start (and for "
        "the weight sync and checkpoints). Frees the GPU for a colocated engine while it generates; on a CPU "
        "learner a reported no-op. Logs memory/offloaded_bytes, time/offload_s, time/reload_s"))
    loss_mask: Literal["sampled", "assistant_segments"] = Field("sampled", description=(
        "which response tokens the policy loss covers (agentic tasks). sampled: the ids vLLM sampled; "
        "assistant_segments: RAGEN's, the whole assistant segment of every turn: its role header, the protocol's "
        "prefill (<think>), the sampled ids and the end-of-turn token, never an observation; needs old_logprobs "
        "'recompute' and no rollout.tis_cap (the forced tokens have no vLLM log-probs)"))
    old_logprobs: Literal["recompute", "rollout"] = Field("recompute", description=(
        "the PPO ratio's anchor pi_old. recompute: the learner's log-probs from a no-grad scoring pass (eval mode) "
        "before the step's first update (verl's default, 'decoupled'; rollout.tis_cap adds the truncated importance "
        "weight for the vLLM / learner mismatch); rollout: vLLM's processed log-probs (verl's 'bypass' mode), and "
        "the scoring pass is skipped (only when nothing else needs it)"))
