"""Episode-level advantages: rewards of one prompt group -> one advantage per completion.

All functions take rewards of shape `[..., G]` (G completions per prompt, any leading batch dims such as
`[N, G]` for N prompt groups) and return a float tensor of the same shape. They read rewards only (the
paper's interface contract for episode-level operators). Inputs are never mutated.
"""

from __future__ import annotations

import torch
from torch import Tensor


def grpo(rewards: Tensor) -> Tensor:
    """GRPO: A_i = r_i - mean(r) within each group. Sums to zero per group."""
    r = rewards.to(torch.float64 if rewards.dtype == torch.float64 else torch.float32)
    return r - r.mean(dim=-1, keepdim=True)


def maxrl(rewards: Tensor, eps: float = 1e-6) -> Tensor:
    """MaxRL: A_i = (r_i - mean r) / (mean r + eps); all zero in a group whose mean is <= eps.

    For binary rewards with K successes out of N this gives (N-K)/K (up to eps) to correct completions and -1
    to incorrect ones.
    """
    r = rewards.to(torch.float64 if rewards.dtype == torch.float64 else torch.float32)
    mean = r.mean(dim=-1, keepdim=True)
    adv = (r - mean) / (mean + eps)
    return torch.where(mean > eps, adv, torch.zeros_like(adv))


def uniform_groups(rewards: Tensor) -> tuple[Tensor, Tensor]:
    """Groups whose rewards are all equal (no learning signal).

    Returns `(uniform [...], all_correct [...])` boolean tensors over the group dims: a uniform group is
    "all correct" when its common reward is > 0.5 and "all wrong" otherwise.
    """
    uniform = (rewards == rewards[..., :1]).all(dim=-1)
    all_correct = uniform & (rewards[..., 0] > 0.5)
    return uniform, all_correct


BUILTIN = {"grpo": grpo, "maxrl": maxrl}
