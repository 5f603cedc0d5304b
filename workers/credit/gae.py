"""Token-level GAE: rewards and critic values over a padded `[B, T]` window -> advantages and returns.

Pure and vectorised over the batch; one backward scan over positions. Positions where `mask` is False
(observation tokens between turns, padding) are skipped: they carry the next value and the running estimate
through unchanged, so a turn's last sampled token bootstraps from the first sampled token of the next turn.

    delta_t = r_t + gamma * V(next sampled position) - V_t          (V past the last sampled token = 0)
    A_t     = delta_t + gamma * lam * A(next sampled position)
    R_t     = A_t + V_t                                              (returns, before whitening)

Whitening (optional) standardises the advantages over the masked tokens of the whole batch. Outputs are 0 where
`mask` is False.
"""

from __future__ import annotations

import torch
from torch import Tensor


def token_rewards(mask: Tensor, reward_positions: list[list[int]], turn_rewards: list[list[float]],
                  placement: str = "episode_end") -> Tensor:
    """`[B, T]` float32 token rewards from per-turn rewards.

    placement `episode_end`: the episode's summed reward on its last sampled token; `turn_end`: each turn's reward
    on that turn's last sampled token (`reward_positions[b][k]`, an index into the `[B, T]` window).
    """
    out = torch.zeros(mask.shape, dtype=torch.float32)
    for b, (pos, rew) in enumerate(zip(reward_positions, turn_rewards, strict=True)):
        if len(pos) != len(rew):
            raise ValueError(f"sequence {b}: {len(pos)} reward positions for {len(rew)} turn rewards")
        if not pos:
            continue
        if placement == "episode_end":
            out[b, max(pos)] = float(sum(rew))
        elif placement == "turn_end":
            for p, r in zip(pos, rew, strict=True):
                out[b, p] += float(r)
        else:
            raise ValueError(f"unknown reward_placement {placement!r}; allowed: episode_end, turn_end")
    return out


def masked_whiten(x: Tensor, mask: Tensor, eps: float = 1e-8) -> Tensor:
    """(x - mean) / sqrt(var + eps) over the True positions of `mask` (unbiased variance); 0 elsewhere."""
    w = mask.to(x.dtype)
    n = w.sum()
    if n < 2:
        return torch.zeros_like(x)
    mean = (x * w).sum() / n
    var = ((x - mean).square() * w).sum() / (n - 1)
    return (x - mean) * torch.rsqrt(var + eps) * w


def gae(rewards: Tensor, values: Tensor, mask: Tensor, gamma: float = 1.0, lam: float = 1.0,
        whiten: bool = True) -> tuple[Tensor, Tensor]:
    """GAE over `[B, T]` float `rewards` and `values` with a `[B, T]` bool `mask` -> (advantages, returns).

    returns = advantages + values before whitening; both 0 where `mask` is False. Inputs are not mutated.
    """
    if not (rewards.shape == values.shape == mask.shape) or rewards.dim() != 2:
        raise ValueError(f"rewards, values and mask must share one [B, T] shape, got {tuple(rewards.shape)}, "
                         f"{tuple(values.shape)}, {tuple(mask.shape)}")
    dtype = torch.float64 if rewards.dtype == torch.float64 else torch.float32
    r, v, m = rewards.to(dtype), values.to(dtype), mask.to(dtype)
    n_rows, n_pos = r.shape
    next_value = torch.zeros(n_rows, dtype=dtype, device=r.device)
    running = torch.zeros(n_rows, dtype=dtype, device=r.device)
    adv = torch.zeros_like(r)
    for t in range(n_pos - 1, -1, -1):
        delta = r[:, t] + gamma * next_value - v[:, t]
        here = delta + gamma * lam * running
        keep = m[:, t]
        running = here * keep + running * (1.0 - keep)
        next_value = v[:, t] * keep + next_value * (1.0 - keep)
        adv[:, t] = here * keep
    returns = (adv + v) * m
    if whiten:
        adv = masked_whiten(adv, mask)
    return adv, returns
