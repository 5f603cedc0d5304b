"""Typed configuration of the learner interventions: entropy bonus, KL to a reference policy, reward-variance
filter, entropy floors. Every default means "off", so an empty `interventions:` block changes nothing.

Seed names (RAGEN / verl sweeps) -> ours: `entropy_coeff` -> `entropy_bonus.coeff`, `kl_loss_coef` /
`kl_loss_type` -> `kl.coef` / `kl.estimator`, `rollout_filter_value` -> `rv_filter.value`,
`rollout_filter_strategy` -> `rv_filter.strategy`, `rollout_filter_include_zero` -> `rv_filter.include_zero`,
`filter_loss_scaling` -> `rv_filter.loss_scaling`. The math lives in `workers/objectives/losses.py` and
`workers/objectives/filters.py`.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from workers.objectives.settings import KL_ESTIMATORS, scheduled_value

FLOOR_CLASSES = ("planning", "execution", "all")


class _StrictFiniteConfig(BaseModel):
    """An interventions section whose unknown keys, and infinite or NaN numbers, are errors."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class EntropyBonusConfig(_StrictFiniteConfig):
    """loss = pg - coeff * H, H the token-mean full-vocabulary entropy over response tokens."""

    coeff: float = Field(0.0, ge=0.0, description="entropy bonus coefficient (seed: entropy_coeff); 0 = off")
    chunk_size: int = Field(1024, ge=1, description=(
        "no longer read: the learner computes the entropy in its chunked log-prob pass, sized by "
        "learner.optim.logits_chunk; kept so configs written before still load, and only at its default"))

    @field_validator("chunk_size")
    @classmethod
    def _unread(cls, v: int) -> int:
        if v != 1024:
            raise ValueError("is no longer read: the entropy is computed in the learner's chunked log-prob pass; "
                             "set learner.optim.logits_chunk instead (or remove this key)")
        return v

    @property
    def is_active(self) -> bool:
        return self.coeff > 0


class KLConfig(_StrictFiniteConfig):
    """loss = pg + coef * KL, KL the token-mean of a per-token estimator against the frozen initial policy."""

    coef: float = Field(0.0, ge=0.0, description="KL loss coefficient (seed: kl_loss_coef); 0 = off, no ref pass")
    estimator: str = Field("low_var_kl", description=f"one of {', '.join(KL_ESTIMATORS)} (seed: kl_loss_type)")
    measure: bool = Field(False, description="log the KL to the reference even when coef is 0 (one extra "
                                             "no-grad forward pass with the adapter disabled)")

    @field_validator("estimator")
    @classmethod
    def _check_estimator(cls, v: str) -> str:
        if v not in KL_ESTIMATORS:
            raise ValueError(f"unknown KL estimator {v!r}; allowed: {', '.join(KL_ESTIMATORS)}")
        return v

    @property
    def is_active(self) -> bool:
        return self.coef > 0


class RVFilterConfig(_StrictFiniteConfig):
    """Reward-variance filter: keep the top-p nucleus of prompt groups ranked by reward std."""

    enabled: bool = Field(False, description="apply the filter before the learner")
    strategy: Literal["top_p"] = Field("top_p", description="selection strategy (seed: rollout_filter_strategy)")
    value: float = Field(1.0, gt=0.0, le=1.0, description="top-p mass to keep (seed: rollout_filter_value)")
    prob_mode: Literal["softmax", "linear"] = Field(
        "softmax", description="group probabilities: softmax over stds (seed) or proportional to std")
    include_zero: bool = Field(True, description="False drops zero-std groups before selection")
    loss_scaling: Literal["none", "linear", "sqrt"] = Field(
        "none", description="multiply the loss by 1, kept_ratio or sqrt(kept_ratio) (seed: filter_loss_scaling)")

    @property
    def is_active(self) -> bool:
        """Whether the filter can drop anything (value 1 with include_zero keeps every group)."""
        return self.enabled and (self.value < 1.0 or not self.include_zero)


class FloorSpec(_StrictFiniteConfig):
    """One token class's entropy floor: penalty coef * max(0, floor - mean entropy of the class)^2."""

    floor: float = Field(0.0, ge=0.0, description="minimum mean entropy, in the units the learner passes (nats)")
    coef: float = Field(0.0, ge=0.0, description="penalty coefficient")


class FloorSchedule(_StrictFiniteConfig):
    """Multiplies every floor by a factor going from start_factor to end_factor over training progress."""

    kind: Literal["constant", "linear", "cosine"] = "constant"
    start_factor: float = Field(1.0, ge=0.0)
    end_factor: float = Field(1.0, ge=0.0)


class EntropyFloorConfig(_StrictFiniteConfig):
    """Per token class (planning / execution / all response tokens) entropy floors; unset classes are off."""

    planning: FloorSpec | None = Field(None, description="floor on the planning tokens' mean entropy")
    execution: FloorSpec | None = Field(None, description="floor on the non-planning tokens' mean entropy")
    all: FloorSpec | None = Field(None, description="floor on all response tokens' mean entropy")
    schedule: FloorSchedule | None = Field(None, description="optional schedule of the floors; None = constant")

    def specs(self) -> dict[str, FloorSpec]:
        """The configured classes, in FLOOR_CLASSES order."""
        return {c: s for c in FLOOR_CLASSES if (s := getattr(self, c)) is not None}

    @property
    def is_active(self) -> bool:
        return any(s.coef > 0 and s.floor > 0 for s in self.specs().values())

    def floors_at(self, progress: float) -> dict[str, float]:
        """Floors at training progress in [0, 1], schedule applied."""
        sch = self.schedule
        factor = 1.0 if sch is None else scheduled_value(sch.start_factor, sch.end_factor, progress, sch.kind)
        return {c: s.floor * factor for c, s in self.specs().items()}

    def coefs(self) -> dict[str, float]:
        return {c: s.coef for c, s in self.specs().items()}


class ProbabilityFloorConfig(_StrictFiniteConfig):
    """Hard floor on every valid action's probability at the action position of tasks that declare an action set
    (see workers/objectives/probability_floor.py); the sampler and the learner apply the same floored distribution."""

    min_prob: float = Field(0.0, ge=0.0, lt=1.0, description="requested floor; capped at 0.99 / n_valid; 0 = off")

    @property
    def is_active(self) -> bool:
        return self.min_prob > 0


class InterventionsConfig(_StrictFiniteConfig):
    """All learner interventions, each off by default."""

    entropy_bonus: EntropyBonusConfig = Field(default_factory=EntropyBonusConfig)
    kl: KLConfig = Field(default_factory=KLConfig)
    rv_filter: RVFilterConfig = Field(default_factory=RVFilterConfig)
    entropy_floor: EntropyFloorConfig = Field(default_factory=EntropyFloorConfig)
    probability_floor: ProbabilityFloorConfig = Field(default_factory=ProbabilityFloorConfig)


def scoring_pass_needs(credit, iv: InterventionsConfig) -> str | None:
    """What reads the learner's no-grad scoring pass, by its config key (None: nothing, so `learner.old_logprobs:
    rollout` may skip it). `credit`: a `workers.credit.CreditConfig`. The trial config refuses the combination up
    front (orchestrator/config/trial.py); the learner refuses it for direct callers."""
    for needed, what in (
        (credit.uncertainty_kind != "surprisal", f"credit.uncertainty_kind '{credit.uncertainty_kind}'"),
        (credit.log_decomposition, "credit.log_decomposition"),
        (credit.uses_critic, "the critic (credit.advantage_mode gae)"),
        (iv.kl.is_active or iv.kl.measure, "interventions.kl (the KL to the reference)"),
        (iv.entropy_bonus.is_active, "interventions.entropy_bonus"),
        (iv.entropy_floor.is_active, "interventions.entropy_floor"),
        (iv.probability_floor.is_active, "interventions.probability_floor"),
    ):
        if needed:
            return what
    return None
