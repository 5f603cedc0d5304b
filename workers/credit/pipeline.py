"""Composition of the credit stack: rewards + token signals -> token advantages and stats.

One step, following the paper's algorithm:
1. episode level per prompt group (grpo | maxrl | plugin); uniform-reward groups get 0 and are counted;
2. token stages in the configured order over the clamped uncertainty signal:
   `sepa` pools execution-token signal, `gtpo` multiplies advantages by signal weights, `hicra` amplifies
   planning-token advantages;
or a transform plugin replaces step 2, or an algorithm plugin replaces both.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import torch
from torch import Tensor

from . import episode, token
from .config import CreditConfig
from .errors import CreditError
from .plugin_paths import load_plugin, positional_arity
from .plugins import AlgorithmContext, TransformContext, as_token_tensor


@dataclass(frozen=True)
class CreditResult:
    """Output of `compute_advantages`; tensors are shaped like the inputs."""

    token_advantages: Tensor  # like signals, float32, 0 on padding
    episode_advantages: Tensor  # like rewards, float32
    signal_after: Tensor  # like signals: the uncertainty after the signal stages (SEPA), clamped
    stats: dict[str, float]


@lru_cache(maxsize=32)
def _plugin(path: str, role: str):
    return load_plugin(path, role)


def episode_advantages(rewards: Tensor, config: CreditConfig) -> Tensor:
    """`[N, G]` rewards -> `[N, G]` advantages with uniform groups zeroed."""
    mode = config.advantage_mode
    if mode == "grpo":
        adv = episode.grpo(rewards)
    elif mode == "maxrl":
        adv = episode.maxrl(rewards, eps=config.maxrl_eps)
    else:
        fn = _plugin(mode, "advantage_mode")
        two = positional_arity(fn) >= 2
        rows = []
        for group in rewards.tolist():  # one call per prompt group, as the plugin interface promises
            out = fn(group, config.advantage_params) if two else fn(group)
            try:
                vals = [float(v) for v in out]
            except TypeError as exc:
                raise CreditError(f"advantage_mode: {mode!r} must return a sequence of numbers") from exc
            if len(vals) != len(group):
                raise CreditError(f"advantage_mode: {mode!r} returned {len(vals)} values for a group of {len(group)}")
            rows.append(vals)
        adv = torch.tensor(rows, dtype=torch.float32).reshape(rewards.shape)
        if not torch.isfinite(adv).all():
            raise CreditError(f"advantage_mode: {mode!r} returned non-finite advantages")
    uniform, _ = episode.uniform_groups(rewards)
    return torch.where(uniform[:, None], torch.zeros_like(adv), adv).to(torch.float32)


def apply_token_stages(
    ep_adv: Tensor, signal: Tensor, mask: Tensor, planning: Tensor, config: CreditConfig, sepa_lambda: float
) -> tuple[Tensor, Tensor]:
    """Built-in stages over flat `[B, T]` tensors; `ep_adv` is `[B]` (episode level, broadcast over tokens) or
    `[B, T]` (a token-level source such as GAE); masks bool or 0/1 float.

    Returns (token advantages, signal after the stages).
    """
    w_mask, w_plan = token.as_weights(mask, signal), token.as_weights(planning, signal)
    base = ep_adv.to(signal.dtype)
    adv = (base[:, None] if base.dim() == 1 else base) * w_mask
    sig = signal
    for stage in config.stages:
        if stage == "sepa":
            sig = token.sepa_pool(sig, w_mask, w_plan, sepa_lambda)
        elif stage == "gtpo":
            adv = adv.mul_(token.gtpo_weights(sig, w_mask, config.gtpo_beta))
        elif stage == "hicra":
            adv = token.hicra(adv, w_plan, config.hicra_alpha)
        else:  # unreachable through CreditConfig validation
            raise CreditError(f"unknown token stage {stage!r}; allowed: sepa, gtpo, hicra")
    return adv, sig


def _class_moments(x: Tensor, weights: dict[str, Tensor]) -> dict[str, tuple[float, float]]:
    """Mean and population variance of `x` over each 0/1 weight mask (0, 0 when empty).

    Fused dot products over one shared `x**2` keep this to a single `[B, T]` temporary: no boolean indexing.
    """
    flat, sq = x.reshape(-1), x.square().reshape(-1)
    out = {}
    for name, w in weights.items():
        wf = w.reshape(-1)
        n = float(wf.sum())
        if n == 0:
            out[name] = (0.0, 0.0)
            continue
        mean = float(torch.dot(flat, wf)) / n
        out[name] = (mean, max(float(torch.dot(sq, wf)) / n - mean * mean, 0.0))
    return out


def batch_stats(
    rewards: Tensor, signal: Tensor, signal_after: Tensor, mask: Tensor, planning: Tensor,
    token_adv: Tensor, kind: str, sepa_lambda: float,
) -> dict[str, float]:
    """Per-batch diagnostics. Flat `[B, T]` tensors (masks bool or 0/1 float, planning 0 on padding),
    `[N, G]` rewards. Variances are population variances over all tokens of the class in the batch."""
    uniform, all_correct = episode.uniform_groups(rewards)
    w_mask, w_plan = token.as_weights(mask, signal), token.as_weights(planning, signal)
    w_exec = w_mask - w_plan
    n_tok = max(float(w_mask.sum()), 1.0)
    stats: dict[str, float] = {
        "groups": float(rewards.shape[0]),
        "groups_skipped": float(uniform.sum()),
        "groups_skipped_all_correct": float(all_correct.sum()),
        "groups_skipped_all_wrong": float((uniform & ~all_correct).sum()),
        "planning_token_frac": float(w_plan.sum()) / n_tok,
        "adv_token_mean": float(token_adv.sum()) / n_tok,
        "adv_token_abs_mean": float(token_adv.abs().sum()) / n_tok,
        "sepa_lambda": float(sepa_lambda),
    }
    weights = {"exec": w_exec, "plan": w_plan}
    before = _class_moments(signal, weights)
    after = before if signal_after is signal else _class_moments(signal_after, weights)
    for name in weights:
        for when, moments in (("", before), ("_after", after)):
            stats[f"{name}_{kind}_mean{when}"], stats[f"{name}_{kind}_var{when}"] = moments[name]
    return stats


def _check_shapes(rewards: Tensor, signals: Tensor, mask: Tensor, planning: Tensor | None) -> None:
    if rewards.dim() not in (1, 2):
        raise CreditError(f"rewards must be [G] or [N, G], got shape {tuple(rewards.shape)}")
    want = (*rewards.shape, signals.shape[-1]) if signals.dim() == rewards.dim() + 1 else None
    if want is None or tuple(signals.shape) != want:
        raise CreditError(f"signals must be rewards' shape + [T], got {tuple(signals.shape)} for rewards {tuple(rewards.shape)}")
    if tuple(mask.shape) != tuple(signals.shape) or mask.dtype != torch.bool:
        raise CreditError(f"mask must be a bool tensor shaped like signals {tuple(signals.shape)}")
    if planning is not None and (tuple(planning.shape) != tuple(signals.shape) or planning.dtype != torch.bool):
        raise CreditError(f"planning must be a bool tensor shaped like signals {tuple(signals.shape)}")


def compute_advantages(
    rewards: Tensor,
    signals: Tensor,
    mask: Tensor,
    config: CreditConfig,
    *,
    planning: Tensor | None = None,
    sepa_lambda: float = 0.0,
    step: int = 0,
    token_advantages: Tensor | None = None,
) -> CreditResult:
    """Token-level advantages for one batch.

    Args:
        rewards: `[G]` (one prompt group) or `[N, G]` (N groups of G completions).
        signals: `[G, T]` / `[N, G, T]` per-token uncertainty of kind `config.uncertainty_kind`
            (e.g. `workers.credit.surprisal(logprobs)`); values at padding are ignored.
        mask: bool, shaped like `signals`; True on real completion tokens.
        config: the credit configuration.
        planning: bool, shaped like `signals`; planning tokens (required when a stage or plugin reads it;
            treated as all-execution when omitted).
        sepa_lambda: pooling strength for this step (from `SepaController.lambda_for(step)`).
        step: training step, passed to plugins.
        token_advantages: shaped like `signals`; the token-level advantage source when
            `config.advantage_mode == "gae"` (GAE from the critic, `workers.credit.gae`), required then. The
            token stages reweight it exactly as they reweight broadcast episode advantages.
    Returns:
        CreditResult with token advantages shaped like `signals`, episode advantages like `rewards`, the
        signal after the signal stages, and per-batch stats (see `batch_stats`).
    """
    _check_shapes(rewards, signals, mask, planning)
    shape = tuple(signals.shape)
    n_tok = shape[-1]
    r = rewards.reshape(-1, rewards.shape[-1]).to(torch.float32 if rewards.dtype != torch.float64 else torch.float64)
    flat_mask = mask.reshape(-1, n_tok)
    dtype = torch.float64 if signals.dtype == torch.float64 else torch.float32
    sig = signals.reshape(-1, n_tok).to(dtype)
    sig = torch.where(flat_mask, sig, 0.0).clamp_(max=config.uncertainty_clamp)
    plan = (planning.reshape(-1, n_tok) if planning is not None else torch.zeros_like(flat_mask)) & flat_mask
    w_mask, w_plan = flat_mask.to(dtype), plan.to(dtype)  # 0/1 weights, converted once for all stages

    if config.algorithm_mode is not None:
        fn = _plugin(config.algorithm_mode, "algorithm_mode")
        ctx = AlgorithmContext(
            rewards=r, signals=sig.reshape(*r.shape, n_tok), mask=flat_mask.reshape(*r.shape, n_tok),
            planning=plan.reshape(*r.shape, n_tok), sepa_lambda=sepa_lambda,
            params=dict(config.algorithm_params), step=step,
        )
        tok = as_token_tensor(fn(ctx), ctx.mask, "algorithm_mode").reshape(-1, n_tok)
        ep = torch.zeros_like(r, dtype=torch.float32)
        sig_after = sig
    elif config.uses_critic:
        if token_advantages is None or tuple(token_advantages.shape) != shape:
            raise CreditError(f"advantage_mode gae needs token_advantages shaped like signals {shape}")
        ep = torch.zeros_like(r, dtype=torch.float32)  # no episode-level advantage: the critic's GAE is the source
        tok, sig_after = apply_token_stages(token_advantages.reshape(-1, n_tok).to(dtype), sig, w_mask, w_plan,
                                            config, sepa_lambda)
    else:
        ep = episode_advantages(r, config)
        ep_flat = ep.reshape(-1).to(dtype)
        if isinstance(config.transform_mode, str) and config.stages == () and config.transform_mode != "none":
            fn = _plugin(config.transform_mode, "transform_mode")
            ctx = TransformContext(
                episode_advantages=ep_flat, signals=sig, mask=flat_mask, planning=plan,
                sepa_lambda=sepa_lambda, params=dict(config.transform_params), step=step,
            )
            tok, sig_after = as_token_tensor(fn(ctx), flat_mask, "transform_mode"), sig
        else:
            tok, sig_after = apply_token_stages(ep_flat, sig, w_mask, w_plan, config, sepa_lambda)

    stats = batch_stats(r, sig, sig_after, w_mask, w_plan, tok, config.uncertainty_kind, sepa_lambda)
    return CreditResult(
        token_advantages=tok.to(torch.float32).reshape(shape),
        episode_advantages=ep.to(torch.float32).reshape(rewards.shape),
        signal_after=sig_after.to(torch.float32).reshape(shape),
        stats=stats,
    )


