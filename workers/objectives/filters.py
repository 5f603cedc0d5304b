"""Reward-variance (RV) filter: which prompt groups of a batch reach the learner.

Per group x the score is s(x) = Bessel-corrected std of its rewards (a group of size 1 scores 0). Strategy
`top_p` ranks the candidate groups largest-score-first (ties: lower original index first), gives them
probabilities (`softmax` over the scores, or `linear`: score / sum of scores) and keeps the smallest prefix
whose cumulative probability reaches `value`, never fewer than one group. Filtered groups are dropped whole.

Choices where the spec is silent:
- `linear` with every candidate score 0: uniform probabilities (all groups are equally (un)informative).
- `include_zero=False` when every group has zero score: fall back to all groups as candidates, so that at least
  one group is still kept.
- `value == 1` keeps every candidate, even groups whose probability is 0 (linear) or underflows (softmax).
- the cumulative sum is compared with `value - 1e-9`, so rounding cannot push an exact boundary one group on.
- `loss_scale` = 1 (none), kept_ratio (linear) or sqrt(kept_ratio) (sqrt); kept_ratio = groups kept / groups.
- `enabled=False` keeps every group with loss_scale 1; metrics are still computed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from torch import Tensor

from workers.objectives.interventions import RVFilterConfig

ZERO_STD = 1e-10  # |s| below this counts as "all rewards identical"
_CUM_TOL = 1e-9


@dataclass(frozen=True)
class RVFilterResult:
    keep: list[int]  # sorted original group indices
    loss_scale: float
    metrics: dict[str, float] = field(default_factory=dict)


def group_reward_std(rewards: Tensor) -> Tensor:
    """`[N, G]` rewards -> `[N]` Bessel-corrected std in float64; groups of size 1 give 0 (not NaN)."""
    r = rewards.double()
    if r.shape[-1] < 2:
        return r.new_zeros(r.shape[0])
    # Plain two-pass formula rather than torch.std: for rewards like 0/1 or k/4 every step is exact, so groups
    # with the same spread (e.g. rewards shifted by a constant) tie exactly and the index tie-break applies.
    dev = r - r.mean(dim=-1, keepdim=True)
    return (dev.square().sum(dim=-1) / (r.shape[-1] - 1)).sqrt()


def _probs(scores: Tensor, mode: str) -> Tensor:
    """`[K]` sorted candidate scores -> `[K]` selection probabilities."""
    if mode == "softmax":
        return torch.softmax(scores, dim=0)  # the seed uses the raw scores as logits
    total = scores.sum()
    if total <= 0:
        return torch.full_like(scores, 1.0 / scores.numel())
    return scores / total


def _top_p(scores: Tensor, candidates: Tensor, value: float, mode: str) -> Tensor:
    """Original indices kept among `candidates [K]` (long) given all `scores [N]`."""
    cand_scores = scores[candidates]
    # Stable ascending sort of -score: largest score first, ties keep the lower original index first.
    order = torch.sort(-cand_scores, stable=True).indices
    ranked = candidates[order]
    if value >= 1.0:
        return ranked
    cum = torch.cumsum(_probs(cand_scores[order], mode), dim=0)
    reached = torch.nonzero(cum >= value - _CUM_TOL)
    n_keep = int(reached[0]) + 1 if reached.numel() else ranked.numel()
    return ranked[:n_keep]


def rv_filter(rewards: Tensor, cfg: RVFilterConfig) -> RVFilterResult:
    """Select prompt groups from `rewards [N, G]` (N groups of G rollouts each) per `cfg`; see module doc."""
    if rewards.ndim != 2 or rewards.shape[0] == 0 or rewards.shape[1] == 0:
        raise ValueError(f"rewards must be [N>=1, G>=1], got shape {tuple(rewards.shape)}")
    scores = group_reward_std(rewards)
    n = scores.numel()
    nonzero = scores.abs() >= ZERO_STD
    if not cfg.enabled:
        kept = torch.arange(n)
    else:
        candidates = torch.arange(n) if cfg.include_zero or not nonzero.any() else torch.nonzero(nonzero)[:, 0]
        kept = _top_p(scores, candidates, cfg.value, cfg.prob_mode)
    keep = sorted(kept.tolist())
    ratio = len(keep) / n
    scale = {"none": 1.0, "linear": ratio, "sqrt": math.sqrt(ratio)}[cfg.loss_scaling]
    metrics = {
        "rv_filter/kept_ratio": ratio,
        "rv_filter/groups_kept": float(len(keep)),
        "rv_filter/groups_total": float(n),
        "rv_filter/zero_std_groups": float((~nonzero).sum()),
        "rv_filter/std_all_mean": float(scores.mean()),
        "rv_filter/std_kept_mean": float(scores[keep].mean()),
        "rv_filter/loss_scale": scale,
    }
    return RVFilterResult(keep=keep, loss_scale=scale, metrics=metrics)


# --------------------------------------------------------------------------------------- non-finite groups
@dataclass(frozen=True)
class FiniteCheck:
    """Result of `nonfinite_groups`.

    bad: sorted indices of groups with a non-finite (NaN, +-inf) reward, or a non-finite rollout log-prob at a
    sampled position (loss mask True); the trial drops them whole so nothing non-finite reaches the learner.
    rewards: the input rewards with every reward of a bad group replaced by 0.0 (a bad group counts as
    unrewarded in the step's statistics and filters; it is never trained on)."""

    bad: list[int]
    rewards: list[list[float]]
    reward_groups: int  # bad groups with a non-finite reward
    logprob_groups: int  # bad groups with a non-finite sampled log-prob

    @property
    def metrics(self) -> dict[str, int]:
        return {"train/nonfinite_groups": len(self.bad), "train/nonfinite_reward_groups": self.reward_groups,
                "train/nonfinite_logprob_groups": self.logprob_groups}


def _all_finite(values) -> bool:
    try:
        return all(math.isfinite(float(v)) for v in values)
    except (TypeError, ValueError):  # None or a non-number where a number belongs: as bad as NaN
        return False


def nonfinite_groups(rewards: list[list[float]], logprobs: list[list[list[float]]] | None = None,
                     loss_mask: list[list[list[bool]]] | None = None) -> FiniteCheck:
    """Which groups of a step carry a non-finite reward or sampled-token log-prob (pure).

    rewards: `[N][G]`; logprobs: `[N][G][T]` rollout log-probs, checked where `loss_mask` (same shape) is True
    (all positions without a mask: positions outside the mask, e.g. environment observations, are never read
    by the learner)."""
    bad_reward = [not _all_finite(g) for g in rewards]
    bad_logprob = [False] * len(rewards)
    if logprobs is not None:
        for i, group in enumerate(logprobs):
            masks = loss_mask[i] if loss_mask is not None else [None] * len(group)
            for seq, mask in zip(group, masks, strict=True):
                sampled = seq if mask is None else [lp for lp, m in zip(seq, mask, strict=False) if m]
                if not _all_finite(sampled):
                    bad_logprob[i] = True
                    break
    bad = [i for i in range(len(rewards)) if bad_reward[i] or bad_logprob[i]]
    dropped = set(bad)
    cleaned = [[0.0] * len(g) if i in dropped else [float(r) for r in g] for i, g in enumerate(rewards)]
    return FiniteCheck(bad, cleaned, sum(bad_reward), sum(bad_logprob))
