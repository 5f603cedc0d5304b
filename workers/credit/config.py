"""Typed configuration of the credit-assignment stack.

These pydantic models are embedded in the trial config (`orchestrator/config/trial.py`), so the YAML a user writes,
the config a trial receives and the checkpoint's copy are the same objects. Field names equal YAML keys.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

StageName = Literal["sepa", "gtpo", "hicra"]
UncertaintyKind = Literal["surprisal", "shannon_entropy", "varentropy"]

# Named transform modes of the docs -> ordered token stages (the paper's one-step algorithm: SEPA cleans the
# signal before GTPO weights by it; HICRA amplifies GTPO's output).
NAMED_TRANSFORMS: dict[str, tuple[str, ...]] = {
    "none": (),
    "gtpo": ("gtpo",),
    "gtpo_hicra": ("gtpo", "hicra"),
    "gtpo_sepa": ("sepa", "gtpo"),
    "sepa_gtpo_hicra": ("sepa", "gtpo", "hicra"),
}
BUILTIN_ADVANTAGES = ("grpo", "maxrl", "gae")


def is_dotted_path(name: str) -> bool:
    """A plugin reference looks like `package.module.function` (at least one dot, identifiers only)."""
    parts = name.split(".")
    return len(parts) >= 2 and all(p.isidentifier() for p in parts)


class SepaConfig(BaseModel):
    """SEPA schedule (see docs/credit.md): linear ramp, optional auto schedule, sticky correctness gate."""

    model_config = ConfigDict(extra="forbid")

    schedule: Literal["linear", "auto"] = "linear"
    steps: int = Field(100, ge=0, description="linear ramp length in steps (0: the linear ramp stays at 0)")
    delay_steps: int = Field(0, ge=0, description="steps before the linear ramp starts")
    correct_rate_gate: float = Field(0.0, ge=0.0, le=1.0, description="batch correct rate that opens the gate")
    ema_decay: float = Field(0.99, ge=0.0, le=1.0)
    warmup: int = Field(50, ge=1, description="steps of EMA before the auto baseline variance is frozen")
    threshold: float = Field(0.2, gt=0.0)


class GaeConfig(BaseModel):
    """Token-level GAE from the critic's values (`advantage_mode: gae`); see workers/credit/gae.py."""

    model_config = ConfigDict(extra="forbid")

    gamma: float = Field(1.0, ge=0.0, le=1.0)
    lam: float = Field(1.0, ge=0.0, le=1.0)
    whiten: bool = Field(True, description="standardise advantages over the batch's sampled tokens")
    reward_placement: Literal["episode_end", "turn_end"] = Field(
        "episode_end", description="episode_end: the return on the last sampled token; turn_end: each turn's "
        "reward on that turn's last sampled token")


class CreditConfig(BaseModel):
    """Everything the credit stack needs, as the user writes it under `credit:`."""

    model_config = ConfigDict(extra="forbid")

    advantage_mode: str = Field("grpo", description=(
        "grpo | maxrl | gae (token-level, from a critic) | dotted path to f(rewards[, params])"))
    advantage_params: dict[str, Any] = Field(default_factory=dict)
    maxrl_eps: float = Field(1e-6, gt=0.0)
    transform_mode: str | list[StageName] = Field(
        "none",
        description="none | gtpo | gtpo_hicra | gtpo_sepa | sepa_gtpo_hicra | a list of stages in order | "
        "dotted path to f(TransformContext)",
    )
    transform_params: dict[str, Any] = Field(default_factory=dict)
    algorithm_mode: str | None = Field(None, description="dotted path replacing the whole composition")
    algorithm_params: dict[str, Any] = Field(default_factory=dict)
    uncertainty_kind: UncertaintyKind = "surprisal"
    uncertainty_clamp: float = Field(50.0, gt=0.0, description="uncertainties are clamped at this value")
    gtpo_beta: float = Field(0.1, ge=0.0)
    hicra_alpha: float = Field(0.2, ge=0.0)
    strategic_grams: list[str] | None = Field(None, description="planning grams; default: the paper's 18")
    planning_detector: str | None = Field(None, description="dotted path with planning_mask's interface")
    sepa: SepaConfig | None = None
    gae: GaeConfig = GaeConfig()
    log_decomposition: bool = Field(False, description=(
        "log credit/decomp_* (surprisal variance split into entropy and sampling noise, workers.credit."
        "decomposition) every step; also on whenever the uncertainty signal is computed from logits"))

    @field_validator("advantage_mode")
    @classmethod
    def _check_advantage(cls, v: str) -> str:
        if v not in BUILTIN_ADVANTAGES and not is_dotted_path(v):
            raise ValueError(f"must be one of {', '.join(BUILTIN_ADVANTAGES)} or a dotted path, got {v!r}")
        return v

    @field_validator("transform_mode")
    @classmethod
    def _check_transform(cls, v: str | list[str]) -> str | list[str]:
        if isinstance(v, list):
            if len(set(v)) != len(v):
                raise ValueError(f"stages must not repeat, got {v}")
            return v
        if v not in NAMED_TRANSFORMS and not is_dotted_path(v):
            raise ValueError(f"must be one of {', '.join(NAMED_TRANSFORMS)}, a stage list or a dotted path, got {v!r}")
        return v

    @field_validator("algorithm_mode", "planning_detector")
    @classmethod
    def _check_dotted(cls, v: str | None) -> str | None:
        if v is not None and not is_dotted_path(v):
            raise ValueError(f"must be a dotted path like 'package.module.function', got {v!r}")
        return v

    @field_validator("strategic_grams", mode="before")
    @classmethod
    def _split_grams(cls, v: Any) -> Any:
        # The docs allow a comma-separated string as well as a list.
        if isinstance(v, str):
            v = [g for g in (p.strip() for p in v.split(",")) if g]
        if isinstance(v, list) and not v:
            raise ValueError("needs at least one gram")
        return v

    @model_validator(mode="after")
    def _gae_composes_with_stages_only(self) -> CreditConfig:
        if self.advantage_mode == "gae" and (self.algorithm_mode is not None or (
                isinstance(self.transform_mode, str) and self.transform_mode not in NAMED_TRANSFORMS)):
            raise ValueError("advantage_mode gae composes with the built-in token stages only "
                             "(plugin transforms and algorithms take episode-level advantages)")
        return self

    @model_validator(mode="after")
    def _sepa_needs_settings(self) -> CreditConfig:
        if "sepa" in self.stages and self.sepa is None:
            raise ValueError("transform_mode uses sepa, so `sepa:` settings (steps, schedule, ...) are required")
        return self

    @property
    def stages(self) -> tuple[str, ...]:
        """Ordered built-in token stages; empty for a plugin transform."""
        if isinstance(self.transform_mode, list):
            return tuple(self.transform_mode)
        return NAMED_TRANSFORMS.get(self.transform_mode, ())

    @property
    def uses_critic(self) -> bool:
        return self.advantage_mode == "gae"

    @property
    def needs_planning(self) -> bool:
        """Whether the composition reads the planning mask (plugins always get one)."""
        return bool({"sepa", "hicra"} & set(self.stages)) or self.algorithm_mode is not None or (
            isinstance(self.transform_mode, str) and self.transform_mode not in NAMED_TRANSFORMS
        )
