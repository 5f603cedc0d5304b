"""Off-policy corrections of the policy loss: the gap between the behaviour policy that sampled a batch (vLLM's
log-probs, pi_behav) and the proximal policy the PPO ratio is anchored to (the learner's recomputed log-probs
before the update, pi_prox). Stale batches (rollout.mode async / one_step_off) widen the gap; a sync trial has
only the engine / learner numerical mismatch. Settings: workers/objectives/settings.py:OffPolicySettings.

w = pi_prox / pi_behav, per token or per sequence (exp of the sequence's summed log-ratio):
- tis:       weight min(w, C)                    (truncated importance sampling; verl's rollout_is)
- decoupled: weight w where w <= C, 0 where not  (AReaL's decoupled PPO with behav_imp_weight_cap: the clip is
             taken against pi_prox, the importance weight to pi_behav is kept apart from it)
- rejection: sequences whose mean of a KL(pi_behav || pi_prox) estimator (k1 / k2 / k3) over their tokens
             exceeds a threshold weigh 0 (k1's mean compared by its absolute value).
The weight multiplies the per-token PPO loss; it carries no gradient (pi_prox and pi_behav are constants).
Rejected and masked tokens stay in the loss's denominators, so a rejection does not rescale the rest.

Shapes: `[B, T]` log-probs over the response window with a bool `mask` (True on trained tokens). Pure
functions, vectorised, inputs never mutated.
"""

from __future__ import annotations

import torch
from torch import Tensor

from workers.objectives.losses import LOG_RATIO_CLAMP, kl_penalty, truncated_importance_weights
from workers.objectives.settings import OffPolicySettings


def mismatch_tokens(prox_lp: Tensor, behav_lp: Tensor, mask: Tensor, measure: str) -> Tensor:
    """`[B, T]` per-token estimate of KL(pi_behav || pi_prox) on tokens sampled from pi_behav (0 off the mask):
    k1 = log pi_behav - log pi_prox, k2 = its square / 2, k3 = r - 1 - log r with r = pi_prox / pi_behav
    (clamped as the KL penalty's k3)."""
    return torch.where(mask, kl_penalty(behav_lp, prox_lp, measure), torch.zeros_like(prox_lp))


def sequence_mismatch(prox_lp: Tensor, behav_lp: Tensor, mask: Tensor, measure: str) -> Tensor:
    """`[B]` each sequence's mean of `mismatch_tokens` over its trained tokens (0 for a sequence without any);
    k1's mean by its absolute value, since k1 per token may be negative."""
    per = mismatch_tokens(prox_lp, behav_lp, mask, measure).sum(-1) / mask.sum(-1).clamp(min=1)
    return per.abs() if measure == "k1" else per


def sequence_log_ratio(prox_lp: Tensor, behav_lp: Tensor, mask: Tensor) -> Tensor:
    """`[B, T]`: each sequence's summed log(pi_prox / pi_behav) over its trained tokens, clamped to +-20 (so exp
    stays finite; every cap is far below e^20), broadcast over its positions."""
    d = torch.where(mask, prox_lp - behav_lp, torch.zeros_like(prox_lp)).sum(-1, keepdim=True)
    return d.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP).expand_as(prox_lp)


def correction_weights(prox_lp: Tensor, behav_lp: Tensor, mask: Tensor, kind: str, level: str, cap: float
                       ) -> tuple[Tensor, dict[str, float]]:
    """`[B, T]` weights of `kind` (tis / decoupled) at `level` with cap C, 0 off the mask; and their metrics
    (`tis/*` or `decoupled/*`). The token-level tis is `truncated_importance_weights` (one_step_off's)."""
    if kind == "tis" and level == "token":
        _, w, metrics = truncated_importance_weights(prox_lp, behav_lp, mask, cap)
        return w, metrics
    log_w = sequence_log_ratio(prox_lp, behav_lp, mask) if level == "sequence" else prox_lp - behav_lp
    raw = torch.exp(log_w.clamp(max=LOG_RATIO_CLAMP))
    over = raw > float(cap)
    if kind == "tis":
        w = raw.clamp(max=float(cap)) * mask
    else:
        w = torch.where(over, torch.zeros_like(raw), raw) * mask
    m = mask
    name = "tis" if kind == "tis" else "decoupled"
    frac = "truncated_frac" if kind == "tis" else "masked_frac"
    return w, {
        f"{name}/weight_mean": float(w[m].mean()) if m.any() else 1.0,
        f"{name}/ratio_max": float(raw[m].max()) if m.any() else 1.0,
        f"{name}/ratio_min": float(raw[m].min()) if m.any() else 1.0,
        f"{name}/{frac}": float(over[m].float().mean()) if m.any() else 0.0,
    }


def offpolicy_weights(prox_lp: Tensor, behav_lp: Tensor, mask: Tensor, s: OffPolicySettings
                      ) -> tuple[Tensor | None, dict[str, float]]:
    """The per-token weights `[B, T]` that multiply the PPO loss under `s` (None: the loss is unchanged, with
    nothing to weigh or under `metrics_only`), and the metrics: the correction's, `mismatch/rejected_frac`
    (sequences) under a rejection, `mismatch/k1|k2|k3` (token means) with `log_mismatch`."""
    weights, metrics = None, {}
    if s.correction != "none":
        weights, metrics = correction_weights(prox_lp, behav_lp, mask, s.correction, s.level, float(s.cap))
    if s.reject_measure is not None:
        seq = sequence_mismatch(prox_lp, behav_lp, mask, s.reject_measure)
        keep = (seq <= float(s.reject_threshold)).unsqueeze(-1)
        base = weights if weights is not None else mask.to(prox_lp.dtype)
        weights = base * keep
        has = mask.any(-1)
        metrics["mismatch/rejected_frac"] = float((~keep.squeeze(-1))[has].float().mean()) if has.any() else 0.0
    if s.log_mismatch:
        n = mask.sum().clamp(min=1)
        for k in ("k1", "k2", "k3"):
            metrics[f"mismatch/{k}"] = float(mismatch_tokens(prox_lp, behav_lp, mask, k).sum() / n)
    return (None if s.metrics_only else weights), metrics
