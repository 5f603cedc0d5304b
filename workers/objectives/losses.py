"""Policy-gradient objective: PPO-clipped ratio to the rollout log-probs, loss aggregation, and the per-token
math of the learner interventions (entropy bonus, KL to a reference policy, entropy floors).

Shapes: `[B, T]` padded completion tokens with a bool `mask`. Pure functions; inputs never mutated.
"""

from __future__ import annotations

import torch
import torch.utils.checkpoint
from torch import Tensor

from workers.objectives.settings import AGGREGATIONS, KL_ESTIMATORS


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


LOG_RATIO_CLAMP = 20.0  # verl clamps log pi - log pi_old to +-20 before exp, always


def ppo_token_loss(logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, *, clip_low: float = 0.2,
                   clip_high: float = 0.2, dual_clip: float | None = 3.0) -> tuple[Tensor, Tensor]:
    """Per-token clipped policy loss and a `[B, T]` bool of tokens where the ratio clip was active (verl's
    `pg_clipfrac`: the clipped term was the larger).

    loss = max(-A r, -A clip(r, 1 - clip_low, 1 + clip_high)), r = exp(clamp(logprobs - old_logprobs, +-20));
    with `dual_clip = c > 1` (verl's clip_ratio_c, default 3) the loss of negative-advantage tokens is also
    capped at -A c, so a huge ratio on a token with A < 0 cannot dominate the batch. None: no dual clip.
    """
    ratio = torch.exp((logprobs - old_logprobs).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    loss = torch.maximum(unclipped, clipped)
    was_clipped = clipped > unclipped
    if dual_clip is not None:
        loss = torch.where(advantages < 0, torch.minimum(loss, -advantages * dual_clip), loss)
    return loss, was_clipped


def sequence_logprobs(logits: Tensor, targets: Tensor, temperature: float = 1.0) -> Tensor:
    """Log-probability of each target under softmax(logits / temperature): `[B, T, V]`, `[B, T]` -> `[B, T]`."""
    scaled = logits.float() / temperature
    picked = scaled.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    return picked - torch.logsumexp(scaled, dim=-1)  # no [B, T, V] log-softmax kept around


# --- Learner interventions: entropy bonus, KL to a reference policy, entropy floors -------------------------------

def _entropy_rows(z: Tensor, temperature: float) -> Tensor:
    """`[P, V]` logits -> `[P]` Shannon entropy (nats) of softmax(z / temperature).

    H = logsumexp(z) - sum_v softmax(z)_v z_v, which needs no log-softmax tensor. Half precision is upcast
    because the difference of two large terms loses everything in bf16.
    """
    z = z.float() if z.dtype in (torch.float16, torch.bfloat16) else z
    z = z / temperature
    return torch.logsumexp(z, dim=-1) - (torch.softmax(z, dim=-1) * z).sum(dim=-1)


def entropy_from_logits(logits: Tensor, temperature: float = 1.0, chunk_size: int | None = None) -> Tensor:
    """Full-vocabulary entropy at every position: `[B, T, V]` (any leading dims) -> `[B, T]`.

    With `chunk_size` the flattened `B * T` positions are processed `chunk_size` at a time; the result equals
    the unchunked one. When the logits require grad, each chunk is recomputed in backward (activation
    checkpointing) so that no `[B * T, V]` softmax is kept alive between forward and backward either.
    Logits must be finite; half-precision input gives a float32 result.
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if chunk_size is not None and chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1 or None, got {chunk_size}")
    lead, vocab = logits.shape[:-1], logits.shape[-1]
    flat = logits.reshape(-1, vocab)
    if flat.shape[0] == 0:
        out_dtype = torch.float32 if logits.dtype in (torch.float16, torch.bfloat16) else logits.dtype
        return logits.new_zeros(lead, dtype=out_dtype)
    if chunk_size is None:
        return _entropy_rows(flat, temperature).reshape(lead)
    recompute = torch.is_grad_enabled() and logits.requires_grad
    parts = []
    for start in range(0, flat.shape[0], chunk_size):  # chunks of positions; the vocabulary stays whole
        chunk = flat[start : start + chunk_size]
        if recompute:
            parts.append(torch.utils.checkpoint.checkpoint(
                _entropy_rows, chunk, temperature, use_reentrant=False, preserve_rng_state=False))
        else:
            parts.append(_entropy_rows(chunk, temperature))
    return torch.cat(parts).reshape(lead)


_K3_CLAMP = 10.0


def _kl_base(logprobs: Tensor, ref_logprobs: Tensor, name: str) -> Tensor:
    diff = logprobs - ref_logprobs  # log pi_theta - log pi_ref of the sampled token
    if name in ("kl", "k1"):
        return diff
    if name == "abs":
        return diff.abs()
    if name in ("mse", "k2"):
        return 0.5 * diff.square()
    # k3 with x = log pi_ref - log pi_theta. Clamping x to +-2 * clamp first changes neither the clamped value
    # (|x| >= 20 already gives k3 >= 10) nor its zero gradient there, but keeps exp finite, so backward cannot
    # produce 0 * inf = NaN.
    x = (-diff).clamp(-2 * _K3_CLAMP, 2 * _K3_CLAMP)
    return (x.exp() - x - 1.0).clamp(-_K3_CLAMP, _K3_CLAMP)


def kl_penalty(logprobs: Tensor, ref_logprobs: Tensor, estimator: str) -> Tensor:
    """Per-token KL(pi_theta || pi_ref) estimate from sampled-token log-probs: `[B, T]`, `[B, T]` -> `[B, T]`.

    kl/k1: logp - ref; abs: |logp - ref|; mse/k2: 0.5 (logp - ref)^2; low_var_kl/k3: exp(ref - logp) -
    (ref - logp) - 1 clamped to [-10, 10]. A `+` suffix keeps the named estimator's value but takes k2's
    gradient (straight-through), since k2's gradient is the unbiased KL gradient. Aggregate with `aggregate`.
    """
    if estimator not in KL_ESTIMATORS:
        raise ValueError(f"unknown KL estimator {estimator!r}; allowed: {', '.join(KL_ESTIMATORS)}")
    name = estimator.removesuffix("+")
    value = _kl_base(logprobs, ref_logprobs, name)
    if not estimator.endswith("+"):
        return value
    k2 = _kl_base(logprobs, ref_logprobs, "k2")
    return k2 + (value - k2).detach()


def entropy_floor_penalty(entropy: Tensor, class_masks: dict[str, Tensor], floors: dict[str, float],
                          coefs: dict[str, float]) -> tuple[Tensor, dict[str, float]]:
    """Squared-hinge penalty keeping the mean entropy of each token class above a floor.

    `entropy [B, T]`; `class_masks[c] [B, T]` (bool or float weights, already excluding padding) for every class
    `c` in `floors`; `coefs[c]` likewise. Penalty = sum_c coef_c * max(0, floor_c - mean_c)^2, where mean_c is
    the (conditional) mean entropy over the tokens of class c. The floor is in the units of `entropy` (nats from
    `entropy_from_logits`; pass H / log V for a 0-1 normalised floor). A class without tokens adds exactly 0 and
    its `entropy/{c}_mean` metric is omitted rather than reported as a misleading 0.

    Returns (scalar penalty, differentiable through `entropy`; metrics `entropy/{c}_mean`,
    `entropy/{c}_floor_penalty`, `entropy/{c}_tokens`). With micro-batches the means are per micro-batch.
    """
    missing = [c for c in floors if c not in class_masks or c not in coefs]
    if missing:
        raise ValueError(f"entropy floor classes {missing} need both a mask and a coef")
    total = entropy.new_zeros(())
    metrics: dict[str, float] = {}
    for c, floor in floors.items():
        m = class_masks[c].to(entropy.dtype)
        count = m.sum()
        metrics[f"entropy/{c}_tokens"] = float(count)
        metrics[f"entropy/{c}_floor_penalty"] = 0.0
        if count.item() <= 0:
            continue  # no tokens of this class: no signal, and 0/0 would poison the loss with NaN
        mean = (entropy * m).sum() / count
        term = coefs[c] * torch.relu(floor - mean).square()
        total = total + term
        metrics[f"entropy/{c}_mean"] = float(mean.detach())
        metrics[f"entropy/{c}_floor_penalty"] = float(term.detach())
    return total, metrics


def entropy_floor_surrogate(entropy: Tensor, classes: dict[str, Tensor], targets: dict[str, float],
                            coefs: dict[str, float]) -> tuple[dict[str, float], dict[str, float]]:
    """Entropy floors under micro-batching: the penalty's value from the whole batch (`entropy_floor_penalty`),
    and per class the weight of a gradient surrogate that reproduces its exact gradient (d/dθ of coef * gap^2 =
    -2 coef gap * d mean_c / dθ, gap a constant here). `entropy`, `classes[c]`: `[B, T]`. Returns
    ({class: 2 coef gap / n_class}, metrics incl. `entropy/floor_penalty`)."""
    penalty, metrics = entropy_floor_penalty(entropy, {c: classes[c] for c in targets}, targets, coefs)
    metrics["entropy/floor_penalty"] = float(penalty)
    terms = {}
    for c, target in targets.items():
        if f"entropy/{c}_mean" in metrics:  # absent when the class has no tokens
            gap_c = max(0.0, target - metrics[f"entropy/{c}_mean"])
            terms[c] = 2.0 * coefs[c] * gap_c / float(classes[c].sum())
    return terms, metrics


def truncated_importance_weights(learner_lp: Tensor, rollout_lp: Tensor, mask: Tensor, cap: float | None
                                 ) -> tuple[Tensor, Tensor | None, dict[str, float]]:
    """The per-token truncated importance weights for the vLLM / learner mismatch, `[B, T]`, when the PPO ratio's
    anchor is the recomputed pi_old (verl's decoupled mode with token-level `rollout_is`): each token's loss is
    weighted by min(pi_old / pi_rollout, cap) (no gradient through the weight). Returns (the ratio's anchor
    `learner_lp`, the weights or None without `cap`, metrics)."""
    if cap is None:
        return learner_lp, None, {}
    raw = torch.exp(learner_lp - rollout_lp)
    tis = raw.clamp(max=float(cap)) * mask
    m = mask
    return learner_lp, tis, {
        "tis/weight_mean": float(tis[m].mean()) if m.any() else 1.0,
        "tis/ratio_max": float(raw[m].max()) if m.any() else 1.0,
        "tis/ratio_min": float(raw[m].min()) if m.any() else 1.0,
        "tis/truncated_frac": float((raw[m] > float(cap)).float().mean()) if m.any() else 0.0,
    }




