"""Surprisal vs entropy: how much of the per-token surprisal variance is the policy's own uncertainty and how
much is sampling noise (the diagnostic the SEPA paper lists as missing).

Per token t with sampled token y_t under the policy p_t (at the sampling temperature):
- surprisal  S(t) = -log p_t(y_t)                      (what GTPO/SEPA consume)
- entropy    H(t) = -sum_v p_t(v) log p_t(v)            (the policy's own uncertainty, full vocabulary)
- noise      N(t) = S(t) - H(t)                         (the sampling artifact of using surprisal)

E[S(t) | context] = H(t), so N has conditional mean 0 and conditional variance equal to the varentropy:
on-policy samples give Cov(H, N) ~ 0 and Var(N) ~ mean varentropy. Over a token class (execution or
planning tokens under a mask), with population moments:

    Var(S) = Var(H) + Var(N) + 2 Cov(H, N)                                   (exact)
    Var(S) = Cov(S, H) + Cov(S, N)       entropy part + noise part            (exact)

`noise_share = Cov(S, N) / Var(S)` is the fraction of surprisal variance that is sampling noise (the
regression attribution: it splits the covariance term evenly and needs no ordering of the two parts).

SEPA pools the execution signal linearly, S' = P S, so P S = P H + P N and the variance SEPA removes splits
exactly the same way:

    Var(S) - Var(S') = [Cov(S, H) - Cov(S', P H)] + [Cov(S, N) - Cov(S', P N)]
                       entropy part removed           noise part removed

Shapes: `surprisal`, `entropy`, `mask`, `planning` are `[..., T]` (any leading dims, e.g. `[B, T]` or
`[N, G, T]`); masks are bool. Everything is vectorised (masked sums, no per-token loops) and computed in
float64 so the identities hold to rounding.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor

PARTS = ("n", "surprisal_mean", "entropy_mean", "surprisal_var", "entropy_var", "noise_var", "cov",
         "entropy_part", "noise_part", "noise_share")


def class_moments(surprisal: Tensor, entropy: Tensor, weights: Tensor) -> dict[str, Tensor]:
    """Population moments of S, H and N = S - H over the tokens where `weights` (0/1, same shape) is 1.

    Returns scalar float64 tensors keyed by `PARTS`; with no selected token every value but `n` is NaN.
    `surprisal_var == entropy_var + noise_var + 2 cov == entropy_part + noise_part` up to rounding.
    """
    w = weights.to(torch.float64)
    s, h = surprisal.to(torch.float64) * w, entropy.to(torch.float64) * w  # zero outside the class
    n = w.sum()
    denom = n if float(n) > 0 else torch.tensor(math.nan, dtype=torch.float64)
    ms, mh = s.sum() / denom, h.sum() / denom
    ds, dh = (s - ms) * w, (h - mh) * w  # centred, still zero outside the class
    dn = ds - dh
    var_s, var_h, var_n = (ds * ds).sum() / denom, (dh * dh).sum() / denom, (dn * dn).sum() / denom
    cov = (dh * dn).sum() / denom
    ent_part, noise_part = (ds * dh).sum() / denom, (ds * dn).sum() / denom
    share = noise_part / var_s if float(n) > 0 and float(var_s) > 0 else torch.tensor(math.nan, dtype=torch.float64)
    return {"n": n, "surprisal_mean": ms, "entropy_mean": mh, "surprisal_var": var_s, "entropy_var": var_h,
            "noise_var": var_n, "cov": cov, "entropy_part": ent_part, "noise_part": noise_part,
            "noise_share": share}


def decompose(surprisal: Tensor, entropy: Tensor, mask: Tensor, planning: Tensor | None = None, *,
              sepa_lambda: float | None = None,
              pool: Callable[[Tensor, Tensor, Tensor, float], Tensor] | None = None) -> dict[str, float]:
    """The decomposition for execution (`exec`) and planning (`plan`) tokens, as flat metric names.

    Args:
        surprisal, entropy: `[..., T]` per-token S and H of the sampled tokens (same temperature).
        mask: `[..., T]` bool, real completion tokens.
        planning: `[..., T]` bool planning tokens (None: every token is an execution token).
        sepa_lambda: when given (and > 0), also the split of the execution variance SEPA removes at this
            lambda: `exec_surprisal_var_after`, `exec_removed`, `exec_removed_entropy`, `exec_removed_noise`,
            `exec_removed_noise_share`. Pooling runs over the last dim (one completion per row).
        pool: the pooling operator `pool(signal [B, T], mask, planning, lam)` (default: SEPA's
            `workers.credit.token.sepa_pool`); it must be linear in `signal` for the split to be exact.
    Returns:
        `{f"{cls}_{part}": float}` for cls in (exec, plan) and part in `PARTS` (NaN for an empty class), plus
        the removal keys above.
    """
    if not (surprisal.shape == entropy.shape == mask.shape):
        raise ValueError(f"shapes differ: surprisal {tuple(surprisal.shape)}, entropy {tuple(entropy.shape)}, "
                         f"mask {tuple(mask.shape)}")
    mask = mask.bool()
    plan = torch.zeros_like(mask) if planning is None else planning.bool() & mask
    if plan.shape != mask.shape:
        raise ValueError(f"planning shape {tuple(plan.shape)} != mask shape {tuple(mask.shape)}")
    s = torch.where(mask, surprisal.to(torch.float64), 0.0)  # padding may hold anything (inf, NaN)
    h = torch.where(mask, entropy.to(torch.float64), 0.0)
    out: dict[str, float] = {}
    for cls, sel in (("exec", mask & ~plan), ("plan", plan)):
        for k, v in class_moments(s, h, sel).items():
            out[f"{cls}_{k}"] = float(v)
    if sepa_lambda is not None and sepa_lambda > 0:
        if pool is None:
            from workers.credit.token import sepa_pool as pool
        width = s.shape[-1]
        s2, h2, m2, p2 = s.reshape(-1, width), h.reshape(-1, width), mask.reshape(-1, width), plan.reshape(-1, width)
        ps, ph = pool(s2, m2, p2, float(sepa_lambda)), pool(h2, m2, p2, float(sepa_lambda))
        sel = (m2 & ~p2).to(torch.float64)
        after = class_moments(ps, ph, sel)  # N' = P S - P H = P N by linearity
        before = {k: out[f"exec_{k}"] for k in ("surprisal_var", "entropy_part", "noise_part")}
        removed = before["surprisal_var"] - float(after["surprisal_var"])
        removed_noise = before["noise_part"] - float(after["noise_part"])
        out.update({
            "exec_surprisal_var_after": float(after["surprisal_var"]),
            "exec_removed": removed,
            "exec_removed_entropy": before["entropy_part"] - float(after["entropy_part"]),
            "exec_removed_noise": removed_noise,
            "exec_removed_noise_share": removed_noise / removed if removed > 0 else math.nan,
        })
    return out


def decomposition_metrics(surprisal: Tensor, entropy: Tensor, mask: Tensor, planning: Tensor | None = None, *,
                          sepa_lambda: float | None = None, prefix: str = "credit/decomp_") -> dict[str, float]:
    """`decompose` with metric names `credit/decomp_<cls>_<part>` (the learner's logged row)."""
    return {f"{prefix}{k}": v for k, v in decompose(surprisal, entropy, mask, planning,
                                                    sepa_lambda=sepa_lambda).items()}
