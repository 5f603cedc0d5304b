"""Per-token uncertainty signals.

- `surprisal`: -log p of the sampled token, from per-token log-probabilities `[..., T]`.
- `shannon_entropy`: H = -sum_v p log p, from full logits `[..., T, V]`.
- `varentropy`: Var_{v~p}[-log p(v)] = sum_v p (log p)^2 - H^2, from full logits `[..., T, V]`.

The logit-based functions work over chunks of positions so a learner can evaluate a 150k vocabulary without
materialising probabilities for every position at once. They are plain torch ops, so gradients flow when the
logits require grad.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .errors import CreditError

KINDS = ("surprisal", "shannon_entropy", "varentropy")


def surprisal(logprobs: Tensor) -> Tensor:
    """`[..., T]` sampled-token log-probabilities -> `[..., T]` surprisal (-logprob)."""
    return -logprobs


def _entropy_moments(logits: Tensor, temperature: float) -> tuple[Tensor, Tensor]:
    """`[P, V]` logits -> (H [P], E_p[(log p)^2] [P]) in float32 or better."""
    x = logits.float() if logits.dtype in (torch.float16, torch.bfloat16) else logits
    logp = torch.log_softmax(x / temperature, dim=-1)
    p = logp.exp()
    h = -(p * logp).sum(dim=-1)
    m2 = (p * logp.square()).sum(dim=-1)
    return h, m2


def _chunked(logits: Tensor, chunk_size: int, temperature: float, want: str) -> Tensor:
    if chunk_size < 1:
        raise CreditError(f"chunk_size must be >= 1, got {chunk_size}")
    lead, vocab = logits.shape[:-1], logits.shape[-1]
    flat = logits.reshape(-1, vocab)
    outs = []
    for start in range(0, flat.shape[0], chunk_size):  # loop over chunks of positions, not tokens
        h, m2 = _entropy_moments(flat[start : start + chunk_size], temperature)
        outs.append(h if want == "entropy" else (m2 - h.square()).clamp_min(0.0))
    if not outs:
        return logits.new_zeros(lead, dtype=torch.float32)
    return torch.cat(outs).reshape(lead)


def shannon_entropy(logits: Tensor, chunk_size: int = 1024, temperature: float = 1.0) -> Tensor:
    """`[..., T, V]` logits -> `[..., T]` Shannon entropy of softmax(logits / temperature) in nats."""
    return _chunked(logits, chunk_size, temperature, "entropy")


def varentropy(logits: Tensor, chunk_size: int = 1024, temperature: float = 1.0) -> Tensor:
    """`[..., T, V]` logits -> `[..., T]` variance of -log p under p (the 'varentropy')."""
    return _chunked(logits, chunk_size, temperature, "varentropy")


def token_uncertainty(
    kind: str,
    *,
    logprobs: Tensor | None = None,
    logits: Tensor | None = None,
    chunk_size: int = 1024,
    temperature: float = 1.0,
) -> Tensor:
    """Dispatch by kind. `surprisal` needs `logprobs`; the other kinds need `logits`."""
    if kind not in KINDS:
        raise CreditError(f"unknown uncertainty_kind {kind!r}; allowed: {', '.join(KINDS)}")
    if kind == "surprisal":
        if logprobs is None:
            raise CreditError("uncertainty_kind 'surprisal' needs the sampled tokens' logprobs")
        return surprisal(logprobs)
    if logits is None:
        raise CreditError(f"uncertainty_kind {kind!r} needs full logits")
    fn = shannon_entropy if kind == "shannon_entropy" else varentropy
    return fn(logits, chunk_size=chunk_size, temperature=temperature)
