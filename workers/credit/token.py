"""Token-level stages over padded completions.

Shapes: `B` completions (flattened prompt groups), `T` padded length.
- `signal`  `[B, T]` float: per-token uncertainty (surprisal or entropy), already clamped.
- `mask`    `[B, T]` bool: True on real completion tokens, False on padding.
- `planning` `[B, T]` bool: True on planning tokens (only meaningful where `mask`).
- `adv`     `[B, T]` float: token advantages.
Every function is vectorised, returns a new tensor, and leaves padding at 0 for advantages.
"""

from __future__ import annotations

import torch
from torch import Tensor


def _masked_mean(x: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
    """Row means of `x` over `mask`: returns (mean [B, 1], count [B, 1]); mean is 0 for an empty row."""
    m = mask.to(x.dtype)
    count = m.sum(dim=-1, keepdim=True)
    mean = (x * m).sum(dim=-1, keepdim=True) / count.clamp_min(1.0)
    return mean, count


def sepa_pool(signal: Tensor, mask: Tensor, planning: Tensor, lam: float | Tensor) -> Tensor:
    """SEPA: pull each completion's execution-token signal toward that completion's execution mean.

    S'(t) = lam * mean_E(S) + (1 - lam) * S(t) on execution tokens E (mask & ~planning); planning tokens and
    padding are unchanged. `lam` is a scalar or a `[B]` tensor in [0, 1].
    """
    execution = mask & ~planning
    exec_mean, _ = _masked_mean(signal, execution)
    lam_t = torch.as_tensor(lam, dtype=signal.dtype, device=signal.device)
    if lam_t.dim() == 1:
        lam_t = lam_t[:, None]
    pooled = lam_t * exec_mean + (1.0 - lam_t) * signal
    return torch.where(execution, pooled, signal)


def gtpo_weights(signal: Tensor, mask: Tensor, beta: float) -> Tensor:
    """GTPO weights w(t) = max(0, 1 + beta * (S(t) / mean S - 1)), mean over the completion's tokens.

    A completion whose mean signal is 0 (all tokens certain) gets weight 1 everywhere. Padding gets 0.
    """
    mean, _ = _masked_mean(signal, mask)
    safe = torch.where(mean > 0, mean, torch.ones_like(mean))
    w = (1.0 + beta * (signal / safe - 1.0)).clamp_min(0.0)
    w = torch.where(mean > 0, w, torch.ones_like(w))
    return torch.where(mask, w, torch.zeros_like(w))


def hicra(adv: Tensor, planning: Tensor, alpha: float) -> Tensor:
    """HICRA: A'(t) = A(t) + alpha * |A(t)| on planning tokens; never flips a sign for alpha in [0, 1]."""
    return adv + alpha * adv.abs() * planning.to(adv.dtype)
