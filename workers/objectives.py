"""Policy-gradient objective: PPO-clipped ratio to the rollout log-probs, and loss aggregation.

Shapes: `[B, T]` padded completion tokens with a bool `mask`. Pure functions; inputs never mutated.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

Aggregation = Literal["token-mean", "seq-mean-token-sum", "seq-mean-token-mean"]
AGGREGATIONS = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean")


def aggregate(values: Tensor, mask: Tensor, mode: str, *, total_tokens: float | None = None,
              total_seqs: float | None = None) -> Tensor:
    """Reduce per-token `values [B, T]` to a scalar.

    With micro-batches pass the whole batch's `total_tokens` / `total_seqs` so the accumulated gradient equals
    the full-batch one.
    """
    m = mask.to(values.dtype)
    if mode == "token-mean":
        denom = total_tokens if total_tokens is not None else m.sum().clamp_min(1.0)
        return (values * m).sum() / denom
    seqs = total_seqs if total_seqs is not None else float(values.shape[0])
    per_seq = (values * m).sum(-1)
    if mode == "seq-mean-token-mean":
        per_seq = per_seq / m.sum(-1).clamp_min(1.0)
    elif mode != "seq-mean-token-sum":
        raise ValueError(f"unknown loss aggregation {mode!r}; allowed: {', '.join(AGGREGATIONS)}")
    return per_seq.sum() / seqs


def ppo_token_loss(logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, *, clip_low: float = 0.2,
                   clip_high: float = 0.2, dual_clip: float | None = None) -> tuple[Tensor, Tensor]:
    """Per-token clipped policy loss and a `[B, T]` bool of tokens where clipping was active.

    loss = max(-A r, -A clip(r, 1 - clip_low, 1 + clip_high)), r = exp(logprobs - old_logprobs); with
    `dual_clip = c > 1` the loss of negative-advantage tokens is also capped at -A c.
    """
    ratio = torch.exp(logprobs - old_logprobs)
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    loss = torch.maximum(unclipped, clipped)
    was_clipped = clipped > unclipped
    if dual_clip is not None:
        cap = -advantages * dual_clip
        dual = (advantages < 0) & (loss > cap)
        loss = torch.where(dual, cap, loss)
        was_clipped = was_clipped | dual
    return loss, was_clipped


def sequence_logprobs(logits: Tensor, targets: Tensor, temperature: float = 1.0) -> Tensor:
    """Log-probability of each target under softmax(logits / temperature): `[B, T, V]`, `[B, T]` -> `[B, T]`."""
    scaled = logits.float() / temperature
    picked = scaled.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    return picked - torch.logsumexp(scaled, dim=-1)  # no [B, T, V] log-softmax kept around
