"""Overlong samples (DAPO, Yu et al. 2025, section 3.4): what a sample that hit its length limit contributes.

- overlong filtering (`mask`): a truncated sample's tokens leave the loss; its reward still enters its group's
  statistics (the group's other samples are judged against it as sampled).
- soft overlong punishment (`penalty`): with limit L_max and buffer L_cache, a sample of length |y| gets
      R_len(y) = 0                                    |y| <= L_max - L_cache
               = ((L_max - L_cache) - |y|) / L_cache  L_max - L_cache < |y| <= L_max
               = -1                                   |y| > L_max
  scaled by `penalty` and added to its reward. Samples cannot exceed L_max here, so -1 is reached at the limit.
"""

from __future__ import annotations

from torch import Tensor


def soft_overlong_penalty(lengths: Tensor, limit: int, buffer: int, penalty: float) -> Tensor:
    """`[S]` sample lengths -> `[S]` float64 reward terms in [-penalty, 0] (DAPO's R_len x penalty)."""
    if buffer < 1 or buffer > limit:
        raise ValueError(f"buffer must be in [1, limit={limit}], got {buffer}")
    over = (lengths.double() - (limit - buffer)) / buffer
    return -penalty * over.clamp(0.0, 1.0)
