"""The held-out evaluation's estimator: the unbiased pass@k.

The evaluation itself is each rollout source's `evaluate` (orchestrator/trial/collect/sources.py): single-turn tasks
score their held-out problems, agentic tasks a fixed set of validation levels that training never draws."""

from __future__ import annotations

import numpy as np


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples with c correct: 1 - C(n - c, k) / C(n, k)."""
    if n - c < k:
        return 1.0
    return 1.0 - float(np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))
