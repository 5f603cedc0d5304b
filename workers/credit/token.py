"""Token-level stages over padded completions.

Shapes: `B` completions (flattened prompt groups), `T` padded length.
- `signal`   `[B, T]` float: per-token uncertainty (surprisal or entropy), already clamped.
- `mask`     `[B, T]` bool (or 0/1 float): real completion tokens; padding is False.
- `planning` `[B, T]` bool (or 0/1 float): planning tokens (ignored on padding).
- `adv`      `[B, T]` float: token advantages.
Every function is vectorised and returns a new tensor (inputs are never mutated). Masks may be passed as 0/1
floats so a caller composing several stages converts them once; the arithmetic avoids boolean indexing and
temporaries because these run over every generated token of a step.
"""

from __future__ import annotations

import torch
from torch import Tensor


def as_weights(mask: Tensor, like: Tensor) -> Tensor:
    """A bool or 0/1 mask as a float tensor of `like`'s dtype (no copy when it already is one)."""
    return mask.to(like.dtype)


def masked_row_mean(x: Tensor, w: Tensor) -> tuple[Tensor, Tensor]:
    """Per-row mean of `x` over 0/1 weights `w`: returns (mean [B], count [B]); 0 for an empty row."""
    count = w.sum(dim=-1)
    total = torch.linalg.vecdot(x, w)  # fused multiply-sum, no [B, T] temporary
    return total / count.clamp_min(1.0), count


def sepa_pool(signal: Tensor, mask: Tensor, planning: Tensor, lam: float | Tensor) -> Tensor:
    """SEPA: pull each completion's execution-token signal toward that completion's execution mean.

    S'(t) = lam * mean_E(S) + (1 - lam) * S(t) on execution tokens E (mask and not planning); planning tokens and
    padding are unchanged. `lam` is a scalar or a `[B]` tensor in [0, 1].
    """
    execution = (1.0 - as_weights(planning, signal)).mul_(as_weights(mask, signal))
    exec_mean, _ = masked_row_mean(signal, execution)
    lam_t = torch.as_tensor(lam, dtype=signal.dtype, device=signal.device)
    lam_col = lam_t[:, None] if lam_t.dim() == 1 else lam_t
    # S + E * lam * (mean - S): exactly S off the execution set.
    delta = (exec_mean[:, None] - signal).mul_(lam_col).mul_(execution)
    return delta.add_(signal)


def gtpo_weights(signal: Tensor, mask: Tensor, beta: float) -> Tensor:
    """GTPO weights w(t) = max(0, 1 + beta * (S(t) / mean S - 1)), mean over the completion's tokens.

    A completion whose mean signal is 0 (all tokens certain) gets weight 1 everywhere. Padding gets 0.
    """
    w_mask = as_weights(mask, signal)
    mean, _ = masked_row_mean(signal, w_mask)
    zero = mean <= 0
    safe = torch.where(zero, torch.ones_like(mean), mean)
    # padding is zeroed first: a huge pad signal over a tiny mean would overflow to inf, and inf * 0 is NaN
    w = (signal * w_mask).div_(safe[:, None]).mul_(beta).add_(1.0 - beta).clamp_(min=0.0)
    if bool(zero.any()):
        w.masked_fill_(zero[:, None], 1.0)
    return w.mul_(w_mask)


def hicra(adv: Tensor, planning: Tensor, alpha: float) -> Tensor:
    """HICRA: A'(t) = A(t) + alpha * |A(t)| on planning tokens; never flips a sign for alpha in [0, 1]."""
    return adv.abs().mul_(as_weights(planning, adv)).mul_(alpha).add_(adv)
