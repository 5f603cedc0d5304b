"""The campaign file's schema (pydantic, extra="forbid") and what a loaded campaign is: its config, where it came
from, its directory and its expanded trials (orchestrator/campaign/expand.py builds them)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, field_validator

from orchestrator.campaign.sections import (
    AdaptiveSeeds,
    BudgetConfig,
    ReportSettings,
    ScheduleConfig,
    SeedsConfig,
)
from orchestrator.config.sections import PluginsConfig, ResourcesConfig, WandbConfig
from orchestrator.config.trial import TrialConfig

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


class CampaignResources(ResourcesConfig):
    """Per-trial resources: one placement group of driver + rollout workers + learner."""

    rollout_workers: int = Field(2, ge=1, description="not used under placement colocated (an engine per rank)")


class CampaignConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    description: str = ""
    base: dict[str, Any] = Field(default_factory=dict, description="a trial config (keys of TrialConfig)")
    conditions: dict[str, dict[str, Any]] = Field(min_length=1)
    # a list, or {adaptive: {...}} (seeds 0 .. max-1, added look by look); the tag picks the branch to validate
    seeds: Annotated[Annotated[list[int], Tag("list")] | Annotated[SeedsConfig, Tag("table")],
                     Discriminator(lambda v: "table" if isinstance(v, dict | SeedsConfig) else "list")]
    sweep: dict[str, list[Any]] = Field(default_factory=dict, description="key path -> values, crossed")
    resources: CampaignResources | None = Field(None, description="overrides base.resources/rollout.num_workers")
    max_concurrent_trials: int | None = Field(None, ge=1)
    max_failures: int = Field(2, ge=0, description="Tune retries per trial (each resumes from its checkpoint)")
    storage: str = Field("results", description="absolute path or URI; relative paths: from the campaign file")
    storage_shared: bool = Field(False, description="declare a plain path visible to every node (NFS, ...)")
    wandb: WandbConfig = WandbConfig()
    report: ReportSettings = ReportSettings()
    schedule: ScheduleConfig = ScheduleConfig()
    budget: BudgetConfig | None = None
    plugins: PluginsConfig = Field(PluginsConfig(), description=(
        "plugins.paths: directories (relative: from the campaign file) that `task: {name: module:Class}` "
        "plugins are imported from, on every worker; default: the campaign file's directory"))

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not NAME.match(v):
            raise ValueError("must start with a letter or digit and use only letters, digits, '_', '.', '-'")
        return v

    @field_validator("conditions")
    @classmethod
    def _conditions(cls, v: dict) -> dict:
        for name, override in v.items():
            if not NAME.match(str(name)):
                raise ValueError(f"condition name {name!r} must use only letters, digits, '_', '.', '-'")
            if override is None:
                v[name] = {}
        return v

    @field_validator("seeds")
    @classmethod
    def _seeds(cls, v: list[int] | SeedsConfig) -> list[int] | SeedsConfig:
        if isinstance(v, SeedsConfig):
            return v
        if not v:
            raise ValueError("needs at least one seed")
        dup = sorted({s for s in v if v.count(s) > 1})
        if dup:
            raise ValueError(f"seeds must not repeat (repeated: {dup})")
        return v

    @field_validator("sweep")
    @classmethod
    def _sweep(cls, v: dict) -> dict:
        for key, values in v.items():
            if not values:
                raise ValueError(f"sweep key {key!r} needs at least one value")
        return v

    def seed_list(self) -> list[int]:
        """Every seed a trial may run with: the list, or 0 .. max-1 for adaptive seeds."""
        return list(range(self.seeds.adaptive.max)) if isinstance(self.seeds, SeedsConfig) else list(self.seeds)

    @property
    def adaptive(self) -> AdaptiveSeeds | None:
        return self.seeds.adaptive if isinstance(self.seeds, SeedsConfig) else None


@dataclass(frozen=True)
class ExpandedTrial:
    name: str
    condition: str
    seed: int
    sweep: dict[str, Any]
    config: dict[str, Any] = field(repr=False)  # the validated trial config, dumped (what trials receive)
    trial: TrialConfig = field(repr=False, compare=False)  # the same, as the typed object

    def row(self) -> dict[str, Any]:
        return {"name": self.name, "condition": self.condition, "seed": self.seed, "sweep": self.sweep,
                "config": self.config}


@dataclass(frozen=True)
class Campaign:
    config: CampaignConfig
    source: str  # the file it came from (for messages)
    directory: str  # <storage>/<name>: the Tune experiment directory (absolute path or URI)
    storage: str
    trials: list[ExpandedTrial]
