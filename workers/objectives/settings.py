"""The names the objectives' settings are checked against, and the schedules they follow: pure Python, so the
trial schema and `plan` read them without importing torch."""

from __future__ import annotations

import math
from dataclasses import dataclass
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


CORRECTIONS = ("none", "tis", "decoupled")
CORRECTION_LEVELS = ("token", "sequence")
MISMATCH_MEASURES = ("k1", "k2", "k3")


@dataclass(frozen=True)
class OffPolicySettings:
    """What the learner does with the gap between the behaviour policy (vLLM's log-probs at sampling) and the
    proximal one (its own recomputed log-probs before the update): workers/objectives/offpolicy.py.

    correction        none | tis (weight min(w, cap)) | decoupled (weight w where w <= cap, else 0), w = pi_prox /
                      pi_behav
    level             token (w per token) | sequence (w = exp of the sequence's summed log-ratio, on all its tokens)
    cap               the cap C of tis / decoupled (None only with correction none)
    reject_measure    k1 | k2 | k3: reject whole sequences whose mean mismatch exceeds `reject_threshold`; None: no
                      rejection
    metrics_only      compute and log everything, change no loss
    log_mismatch      log mismatch/k1, k2, k3 (the batch's token means) and the rejection's share
    """

    correction: str = "none"
    level: str = "token"
    cap: float | None = None
    reject_measure: str | None = None
    reject_threshold: float | None = None
    metrics_only: bool = False
    log_mismatch: bool = False

    def __post_init__(self) -> None:
        if self.correction not in CORRECTIONS or self.level not in CORRECTION_LEVELS:
            raise ValueError(f"correction {self.correction!r} / level {self.level!r}: allowed {CORRECTIONS} / "
                             f"{CORRECTION_LEVELS}")
        if (self.correction == "none") != (self.cap is None):
            raise ValueError("a cap goes with a correction (tis, decoupled) and only with one")
        if (self.reject_measure is None) != (self.reject_threshold is None) or \
                self.reject_measure not in (None, *MISMATCH_MEASURES):
            raise ValueError(f"rejection needs a measure in {MISMATCH_MEASURES} and a threshold")

    @property
    def active(self) -> bool:
        """Whether anything is computed (a weight, a rejection or the mismatch's metrics)."""
        return self.correction != "none" or self.reject_measure is not None or self.log_mismatch
