"""The names the objectives' settings are checked against, and the schedules they follow: pure Python, so the
trial schema and `plan` read them without importing torch."""

from __future__ import annotations

import math
from typing import Literal

Aggregation = Literal["token-mean", "seq-mean-token-sum", "seq-mean-token-mean"]


AGGREGATIONS = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean")


_KL_BASE = ("kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3")


KL_ESTIMATORS = _KL_BASE + tuple(f"{name}+" for name in _KL_BASE)


SCHEDULES = ("constant", "linear", "cosine")


def scheduled_value(start: float, end: float, progress: float, kind: str = "constant") -> float:
    """Value at training `progress` (clamped to [0, 1]) going from `start` to `end`.

    constant: start throughout; linear: straight line; cosine: half-cosine (slow, fast, slow).
    """
    p = min(max(progress, 0.0), 1.0)
    if kind == "constant":
        return start
    if kind == "linear":
        return start + (end - start) * p
    if kind == "cosine":
        return end + (start - end) * 0.5 * (1.0 + math.cos(math.pi * p))
    raise ValueError(f"unknown schedule kind {kind!r}; allowed: {', '.join(SCHEDULES)}")
