"""What one training step reports: the step's metrics, the critic's, and the per-token uncertainty samples.

Pure functions of the batch, the scoring pass and the loss parts the optimiser summed (no model access).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from workers.learner.batch import Batch
from workers.learner.context import UpdatePlan
from workers.objectives.interventions import InterventionsConfig
from workers.objectives.losses import kl_penalty


def token_samples(before: Tensor, after: Tensor | None, mask: Tensor, planning: Tensor,
                   cap: int = 4096, entropy: Tensor | None = None) -> dict[str, list[float]]:
    """Per-token uncertainty of execution / planning tokens before and after the token stages, at most `cap`
    evenly spaced values per array (the report's mechanistic histogram; bounded so logs stay small); with
    `entropy`, also each token's full-vocabulary entropy (`<cls>_entropy`, aligned with `<cls>_before`)."""
    after = before if after is None else after.reshape(before.shape)
    out = {}
    for cls, sel in (("exec", mask & ~planning), ("plan", mask & planning)):
        extra = (("entropy", entropy),) if entropy is not None else ()
        for name, values in (("before", before), ("after", after), *extra):
            v = values[sel]
            if v.numel() > cap:
                v = v[torch.linspace(0, v.numel() - 1, cap).long()]
            out[f"{cls}_{name}"] = v.tolist()
    return out



def critic_metrics(values: Tensor, returns: Tensor, mask: Tensor, sums: dict, ppo_epochs: int = 1
                   ) -> dict[str, float]:
    """Value loss, clip fraction, explained variance of the pre-update values (0 when the returns have no
    variance beyond float rounding), value / return means.

    vf_clip_frac: clipped tokens over the tokens the critic's updates saw, i.e. every token once per epoch
    (the mini-batches of an epoch partition the batch); verl's mean of per-mini-batch fractions when the
    mini-batches hold equal token counts."""
    v, r = values[mask], returns[mask]
    var_r = float(r.var()) if r.numel() > 1 else 0.0
    if var_r <= 1e-10 * max(1.0, float(r.abs().max()) ** 2 if r.numel() else 1.0):
        var_r = 0.0  # equal returns: 1 - var(r - v) / ~1e-17 would read as -1e14
    n = max(float(mask.sum()), 1.0) * max(ppo_epochs, 1)
    return {
        "loss/value": sums["value_loss"],
        "critic/vf_clip_frac": sums["value_clipped"] / n,
        "critic/grad_norm": sums["critic_grad_norm"],
        "critic/value_mean": float(v.mean()) if v.numel() else 0.0,
        "critic/return_mean": float(r.mean()) if r.numel() else 0.0,
        "critic/explained_variance": 1.0 - float((r - v).var()) / var_r if var_r > 0 else 0.0,
        "critic/optimizer_steps": sums["critic_steps"],
    }



def step_metrics(plan: UpdatePlan, sums: dict[str, float], floor_metrics: dict[str, float], *,
                 iv: InterventionsConfig, ppo_epochs: int, lr: float) -> dict[str, float]:
    """Losses, optimiser, log-prob gap, entropy, KL to the reference and probability-floor metrics of the step
    `plan` describes (its batch, scoring pass, loss scale and probability floor)."""
    b, scored, scale, floor = plan.b, plan.scored, plan.scale, plan.scoring.floor
    mask = b.mask
    total_tokens = float(mask.sum())
    gap = (scored.learner_lp - b.old_lp).abs()[b.sampled & mask]  # vLLM's log-probs exist on sampled ids only
    grad_norm = sums["grad_norm"]
    metrics = {
        # the objective itself (the floor's gradient surrogate is not its value)
        "loss/total": scale * (sums["pg"] + iv.kl.coef * sums["kl"] - iv.entropy_bonus.coeff * sums["ent"]
                               + floor_metrics.get("entropy/floor_penalty", 0.0)),
        "loss/policy": sums["pg"],
        "train/grad_norm": grad_norm if math.isfinite(grad_norm) else float("nan"),
        "train/clip_frac": sums["clipped"] / max(total_tokens * ppo_epochs, 1.0),
        "train/optimizer_steps": sums["policy_steps"],
        "train/lr": lr,
        "train/logprob_gap_mean": float(gap.mean()) if gap.numel() else 0.0,
        "train/logprob_gap_max": float(gap.max()) if gap.numel() else 0.0,
        "train/tokens": total_tokens,
        "train/loss_scale": scale,
        "policy/entropy_mean": float(scored.entropy[mask].mean()) if mask.any() else 0.0,
    }
    if iv.entropy_bonus.is_active:
        metrics["loss/entropy_bonus"] = sums["ent"]
    if scored.ref_lp is not None:
        per_token = kl_penalty(scored.learner_lp, scored.ref_lp, iv.kl.estimator)
        metrics["kl/ref"] = float(per_token[mask].mean()) if mask.any() else 0.0
        metrics["kl/ref_k3"] = float(kl_penalty(scored.learner_lp, scored.ref_lp, "k3")[mask].mean()) \
            if mask.any() else 0.0
        if iv.kl.is_active:
            metrics["loss/kl"] = sums["kl"]
    metrics.update(floor_metrics)
    if floor is not None:
        first = scored.learner_lp[:, 0][mask[:, 0]]
        metrics["floor/action_logprob_min"] = float(first.min()) if first.numel() else 0.0
        metrics["floor/learner_min_valid_prob"] = scored.action_min
    return metrics


def probe_metrics(b: Batch, probe: dict[str, Tensor]) -> dict[str, float]:
    """old_logprobs: rollout. Log-prob gap and entropy of the rows the first update scored before stepping."""
    seen = b.mask & ~probe["lp"].isnan()
    gap = (probe["lp"] - b.old_lp).abs()[seen]
    return {"train/logprob_gap_mean": float(gap.mean()) if gap.numel() else 0.0,
            "train/logprob_gap_max": float(gap.max()) if gap.numel() else 0.0,
            "policy/entropy_mean": float(probe["entropy"][seen].mean()) if gap.numel() else 0.0}
