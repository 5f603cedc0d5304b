"""The small records the learner's parts share: how this learner is laid out, how a step scores tokens, the
policy's optimiser, and what one step's update reads. Frozen: a part reads them, never changes them (the
tensors and the probe dict inside are the step's own working data)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch
    from torch import Tensor, nn

    from workers.learner.batch import Batch, Scored
    from workers.learner.ranks import Ranks


@dataclass(frozen=True)
class Layout:
    """Where and how this learner runs: `full` (every weight trains) or LoRA, FSDP-`sharded` or not, the compute
    `dtype` (the rollout engine's), the `device` and this process's place in the learner group."""

    full: bool
    sharded: bool
    dtype: torch.dtype
    device: str
    ranks: Ranks


@dataclass(frozen=True)
class Scoring:
    """How a step's tokens are scored: at the sampling `temperature`; with `floor = (action_token_ids,
    min_prob)` the first response token (the action position) under the probability-floored distribution;
    `signal`: the uncertainty kind the scoring pass computes from the logits (None: none, or surprisal)."""

    temperature: float
    floor: tuple[list[int], float] | None = None
    signal: str | None = None


@dataclass(frozen=True)
class PolicyOptim:
    """The policy's trained parameters (never the critic adapter's), their AdamW and LR schedule."""

    params: list[nn.Parameter]
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler


@dataclass(frozen=True)
class UpdatePlan:
    """What one training step's PPO updates read. `[B, T]` tensors over the response window.

    adv          token advantages
    returns      the critic's targets (GAE), or None without a critic
    scoring      temperature and probability floor of the forward passes
    scale        multiplies the policy loss (the reward-variance filter's scaling)
    step         the training step: seeds the mini-batch shuffle
    floor_terms  per token class, the entropy-floor surrogate's weight
    classes      `[B, T]` bool masks of the token classes ("all", "planning", "execution")
    ratio_base   the PPO ratio's pi_old (None: the rollout's log-probs)
    tis          per-token off-policy weights (workers/objectives/offpolicy.py: tis, decoupled, rejection), or None
    probe        old_logprobs 'rollout': `{"lp", "entropy"}` `[B, T]` tensors the first update fills with its
                 rows' pre-update log-probs and entropy; else None
    """

    b: Batch
    scored: Scored
    adv: Tensor
    returns: Tensor | None
    scoring: Scoring
    scale: float
    step: int
    floor_terms: dict[str, float]
    classes: dict[str, Tensor]
    ratio_base: Tensor | None = None
    tis: Tensor | None = None
    probe: dict[str, Tensor] | None = None


@dataclass(frozen=True)
class MicroRows:
    """One micro-batch's place in its mini-batch: the mini-batch's `rows`, the micro-batch's rows `r`, its loss
    mask `m` `[b, T]` (on the device) and the mini-batch's loss denominators `totals`."""

    rows: Tensor
    r: Tensor
    m: Tensor
    totals: dict[str, float]
