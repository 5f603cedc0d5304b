"""Plugins by dotted path: `package.module.attribute` -> the callable.

Plugin interfaces (see docs/credit.md):
- advantage_mode:  f(rewards: list[float]) or f(rewards, params) -> G advantages, called once per group.
- transform_mode:  f(ctx: TransformContext) -> token advantages `[B, T]` (a tensor, per-completion lists, or an
                   object with a `token_advs` attribute holding either).
- algorithm_mode:  f(ctx: AlgorithmContext) -> token advantages shaped like the signals.
- planning_detector: same signature as `workers.credit.planning.planning_mask`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from .errors import CreditError


@dataclass(frozen=True)
class TransformContext:
    """What a transform plugin sees. Shapes: B completions, T padded tokens."""

    episode_advantages: Tensor  # [B]
    signals: Tensor  # [B, T] clamped uncertainty
    mask: Tensor  # [B, T] bool
    planning: Tensor  # [B, T] bool
    sepa_lambda: float
    params: dict[str, Any] = field(default_factory=dict)
    step: int = 0


@dataclass(frozen=True)
class AlgorithmContext:
    """What an algorithm plugin sees: the raw inputs of `compute_advantages`."""

    rewards: Tensor  # [N, G]
    signals: Tensor  # [N, G, T]
    mask: Tensor  # [N, G, T] bool
    planning: Tensor  # [N, G, T] bool
    sepa_lambda: float
    params: dict[str, Any] = field(default_factory=dict)
    step: int = 0


def as_token_tensor(out: Any, mask: Tensor, role: str) -> Tensor:
    """Normalise a plugin's token-advantage output to a float tensor shaped like `mask` (padding -> 0)."""
    out = getattr(out, "token_advs", out)
    shape = tuple(mask.shape)
    if isinstance(out, Tensor):
        if tuple(out.shape) != shape:
            raise CreditError(f"{role}: returned shape {tuple(out.shape)}, expected {shape}")
        t = out.to(torch.float32)
    else:
        try:
            rows = [list(map(float, r)) for r in out]
        except TypeError as exc:
            raise CreditError(f"{role}: must return a tensor or per-completion lists, got {type(out).__name__}") from exc
        flat_mask = mask.reshape(-1, shape[-1])
        lengths = flat_mask.sum(-1).tolist()
        if len(rows) != len(lengths) or any(len(r) != n for r, n in zip(rows, lengths, strict=True)):
            got = [len(r) for r in rows]
            raise CreditError(f"{role}: returned rows of lengths {got}, expected {lengths}")
        t = torch.zeros(flat_mask.shape, dtype=torch.float32)
        for i, r in enumerate(rows):  # per completion, not per token
            t[i, : len(r)] = torch.tensor(r, dtype=torch.float32)
        t = t.reshape(shape)
    if not torch.isfinite(t[mask]).all():
        raise CreditError(f"{role}: returned non-finite token advantages")
    return torch.where(mask, t, torch.zeros_like(t))
