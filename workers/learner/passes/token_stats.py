"""Per-token statistics of the response window (log-prob of the sampled token, entropy, an uncertainty signal)
computed over chunks of positions, so no micro-batch holds `[tokens, vocabulary]` float32 logits at once.

The source is either the decoder's last hidden states `[b, T, H]` with the LM head (unsharded learner: the head
runs per chunk) or the model's logits `[b, T, V]` (bf16 on a GPU: the FSDP root returns them; each chunk is
upcast on its own). Each chunk's logits are divided by the temperature in float32 and reduced to its per-token
values; with grad, the chunk is recomputed in backward (activation checkpointing, as `entropy_from_logits`
does), so backward too holds one chunk's logits at a time. Row-wise ops only: the result equals the unchunked
pass, and a window within one chunk runs as one piece (the same ops as unchunked, bit for bit).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from workers.objectives.losses import entropy_from_logits


@dataclass(frozen=True)
class TokenStats:
    """`[b, T]` float32 per-token values; `first`: the fp32 logits / temperature at the first response position
    `[b, V]` (the probability floor's action position), when asked for."""

    lp: Tensor
    entropy: Tensor | None = None
    signal: Tensor | None = None
    first: Tensor | None = None


def _scaled(x: Tensor, head: Callable[[Tensor], Tensor] | None, temperature: float) -> Tensor:
    """fp32 logits / T of `x`; in place only on a tensor made here (never the caller's logits)."""
    z = (head(x) if head is not None else x).float()
    return z.div_(temperature) if z is not x else z / temperature


def _chunk_values(x: Tensor, targets: Tensor, head: Callable[[Tensor], Tensor] | None, temperature: float,
                  entropy: bool, signal: str | None) -> Tensor:
    """One chunk: `x` `[..., H]` hidden (with `head`) or `[..., V]` logits -> `[..., k]` stacked values (log-prob,
    then the entropy and the signal when asked)."""
    z = _scaled(x, head, temperature)
    out = [z.gather(-1, targets[..., None]).squeeze(-1) - torch.logsumexp(z, dim=-1)]
    if entropy:
        out.append(entropy_from_logits(z))
    if signal is not None:
        from workers.credit import token_uncertainty

        out.append(token_uncertainty(signal, logits=z, temperature=1.0))
    return torch.stack(out, -1)


def token_stats(source: Tensor, targets: Tensor, temperature: float, chunk: int | None, *,
                head: Callable[[Tensor], Tensor] | None = None, entropy: bool = False, signal: str | None = None,
                first: bool = False) -> TokenStats:
    """The statistics of `targets` `[b, T]` under `source` (see the module docstring), `chunk` positions at a time
    (None: all at once). `signal`: an uncertainty kind that reads the logits (not surprisal)."""
    b, t = targets.shape
    n = b * t
    if chunk is None or n <= chunk:
        pieces = [(source, targets)]  # one piece: exactly the unchunked ops
    else:
        flat, tgt = source.reshape(n, source.shape[-1]), targets.reshape(n)
        pieces = list(zip(flat.split(chunk), tgt.split(chunk), strict=True))
    recompute = torch.is_grad_enabled() and source.requires_grad and len(pieces) > 1
    parts = []
    for x, y in pieces:
        if recompute:
            parts.append(torch.utils.checkpoint.checkpoint(
                _chunk_values, x, y, head, temperature, entropy, signal, use_reentrant=False,
                preserve_rng_state=False))
        else:
            parts.append(_chunk_values(x, y, head, temperature, entropy, signal))
    values = torch.cat([p.reshape(-1, p.shape[-1]) for p in parts]).reshape(b, t, -1)
    k = iter(range(1, values.shape[-1]))
    z0 = None
    if first:  # one position per row: small
        z0 = _scaled(source[:, 0], head, temperature)
    return TokenStats(values[..., 0], values[..., next(k)] if entropy else None,
                      values[..., next(k)] if signal is not None else None, z0)
