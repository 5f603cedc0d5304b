"""The campaign file's analysis and scheduling sections (`report:`, `schedule:`, `budget:`, `seeds: {adaptive:}`)
as pydantic models; `orchestrator/campaign/expand.py` holds the campaign schema that uses them."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from orchestrator.config.errors import UserError

MEASURE = re.compile(r"^(auc_(\d+)_(\d+)|final)$")
CONTRAST = re.compile(r"^([A-Za-z0-9][A-Za-z0-9_.]*)-([A-Za-z0-9][A-Za-z0-9_.]*)$")
DEFAULT_PRIMARY = "auc_0_15"


class PrimarySweep(BaseModel):
    """`report.primary_sweep`: which trend over swept values is a sweep campaign's one primary test (the trend of
    `report.primary`'s measure); an unset field takes the first in campaign order (the report says which)."""

    model_config = ConfigDict(extra="forbid")
    condition: str | None = Field(None, description="the condition whose sweep is tested")
    key: str | None = Field(None, description="the swept key, e.g. interventions.entropy_bonus.coeff")
    series: str | None = Field(None, description='the other swept keys\' values, as the report writes them '
                                                 '("interventions.kl.coef=0.1"; "all" with one swept key)')


class ReportSettings(BaseModel):
    """`report:` what `python -m orchestrator report` computes for this campaign (flags override it)."""

    model_config = ConfigDict(extra="forbid")

    effect_of_interest: float | None = Field(
        None, gt=0, description="the smallest difference worth detecting, in the metric's units (0.05 = 5pp for a "
                                "rate); the power table's seeds per arm and power are computed for it")
    contrasts: list[str] = Field(default_factory=list,
                                 description='"A-B": condition A minus condition B, paired by seed ("C4-C3")')
    auc_windows: list[tuple[int, int]] | None = Field(
        None, description="AUC windows [lo, hi] in steps; default from the metric's logging cadence")
    auc_interpolate: bool = Field(False, description="bridge a missing interior step of a run's curve linearly "
                                                     "instead of dropping the run from the window")
    primary: str | None = Field(
        None, description="the primary measure, the one family whose Holm-adjusted `*` the report claims: auc_LO_HI "
                          "or final (the step-k table); default auc_0_15, or when no run reaches step 15 the widest "
                          "AUC window, else final; every other measure is exploratory (no `*`)")

    primary_sweep: PrimarySweep | None = Field(
        None, description="a campaign with a sweep: the trend test that is the report's one primary test (every "
                          "other comparison is exploratory); default the first condition, key and series")

    @field_validator("primary")
    @classmethod
    def _primary(cls, v: str | None) -> str | None:
        m = MEASURE.match(v) if v is not None else None
        if v is not None and (not m or (m.group(2) is not None and int(m.group(2)) >= int(m.group(3)))):
            raise ValueError("must be auc_LO_HI with LO < HI (e.g. auc_0_15) or final")
        return v

    @field_validator("auc_windows")
    @classmethod
    def _windows(cls, v: list[tuple[int, int]] | None) -> list[tuple[int, int]] | None:
        for lo, hi in v or []:
            if not 0 <= lo < hi:
                raise ValueError(f"window [{lo}, {hi}] needs 0 <= lo < hi")
        return v

    def contrast_pairs(self, conditions: list[str], source: str = "report") -> list[tuple[str, str]]:
        """`(A, B)` for each "A-B" contrast; condition names may hold '-', so the split must leave two known
        conditions. Raises UserError naming `<source>: report.contrasts[i]` otherwise."""
        if not self.contrasts:
            return []

        out = []
        for i, text in enumerate(self.contrasts):
            pair = parse_contrast(text, conditions)
            if pair is None:
                raise UserError(f"{source}: report.contrasts[{i}]: {text!r} must be 'A-B' with two different "
                                f"conditions of this campaign ({', '.join(conditions)})")
            out.append(pair)
        return out


class ScheduleConfig(BaseModel):
    """How trials share the cluster (orchestrator/tune/lockstep.py). fifo: Tune's default, each trial runs to its end
    once started. lockstep: rounds of `round_steps` steps; no trial starts round r+1 before every unfinished trial
    has finished round r."""

    model_config = ConfigDict(extra="forbid")
    mode: Literal["fifo", "lockstep"] = "fifo"
    round_steps: int | None = Field(None, ge=1, description="steps per round (lockstep); a multiple of "
                                    "checkpoint.every, so a trial pauses only at a checkpoint")


class BudgetConfig(BaseModel):
    """Ends a lockstep campaign at the first round boundary where the next round would overrun: spent GPU-hours
    plus the last round's cost above `gpu_hours`, or now plus the last round's duration past `deadline`."""

    model_config = ConfigDict(extra="forbid")
    gpu_hours: float | None = Field(None, gt=0)
    deadline: datetime | None = Field(None, description="ISO 8601; without a time zone: UTC")

    @field_validator("deadline")
    @classmethod
    def _utc(cls, v: datetime | None) -> datetime | None:
        return v.replace(tzinfo=UTC) if v is not None and v.tzinfo is None else v


class AdaptiveSeeds(BaseModel):
    """Add `step` seeds to every condition until the `contrast`'s group-sequential interval on `measure` excludes
    zero, or `max` seeds ran (orchestrator/tune/adaptive.py; O'Brien-Fleming-type alpha spending over the looks)."""

    model_config = ConfigDict(extra="forbid")
    start: int = Field(3, ge=3, description="seeds at the first look (a paired interval needs 3)")
    max: int = Field(16, ge=3)
    step: int = Field(1, ge=1)
    contrast: str = Field(description="OTHER-BASE, two condition names, e.g. C4-C1")
    measure: str = Field("auc_0_15", description="auc_LO_HI (normalized AUC over steps LO..HI) or final")
    metric: str | None = Field(None, description="default: eval/success, else eval/pass@1, else "
                               "train/correct_rate (the report's default)")
    alpha: float = Field(0.05, gt=0, lt=0.5, description="the whole procedure's two-sided false-claim rate")

    @field_validator("contrast")
    @classmethod
    def _contrast(cls, v: str) -> str:
        if not CONTRAST.match(v):
            raise ValueError("must be OTHER-BASE, two condition names joined by '-', e.g. C4-C1")
        return v

    @field_validator("measure")
    @classmethod
    def _measure(cls, v: str) -> str:
        m = MEASURE.match(v)
        if not m or (m.group(2) is not None and int(m.group(2)) >= int(m.group(3))):
            raise ValueError("must be auc_LO_HI with LO < HI (e.g. auc_0_15) or final")
        return v

    @model_validator(mode="after")
    def _range(self) -> AdaptiveSeeds:
        if self.max < self.start:
            raise ValueError(f"max ({self.max}) must be at least start ({self.start})")
        return self

    def looks(self) -> list[int]:
        """Seeds per condition at each look: start, start + step, ..., max."""
        return sorted({*range(self.start, self.max, self.step), self.max})


class SeedsConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    adaptive: AdaptiveSeeds


def parse_contrast(text: str, conditions: Sequence[str]) -> tuple[str, str] | None:
    """`(A, B)` for "A-B" when exactly one split at a '-' leaves two different known conditions (names may
    hold '-' themselves), else None."""
    hits = [(text[:j], text[j + 1:]) for j, ch in enumerate(text) if ch == "-"]
    hits = [(a, b) for a, b in hits if a in conditions and b in conditions and a != b]
    return hits[0] if len(hits) == 1 else None


DEFAULT_METRICS = ("eval/success", "eval/pass@1", "train/correct_rate")  # the report's default, in order


def planned_steps(config: dict, key: str) -> np.ndarray | None:
    """The steps a trial's config logs `key` at: `eval/*` at 0, every, 2*every, ... and the last step (as
    `orchestrator.trial.loop` evaluates), any other key at every step; None when the config does not say."""
    steps = config.get("steps")
    if not isinstance(steps, int) or steps < 1:
        return None
    if not key.startswith("eval/"):
        return np.arange(steps, dtype=float)
    every = (config.get("eval") or {}).get("every")
    if not isinstance(every, int):
        return None
    return np.union1d(np.arange(0, steps, every), [steps - 1]).astype(float) if every else np.zeros(0)


def run_measure(steps: np.ndarray, values: np.ndarray, measure: str, grid: np.ndarray | None, *,
                interpolate: bool = False) -> float:
    """One run's value of `measure` from its finite (steps, values) of a metric, the one computation the
    adaptive stop and the report share. auc_LO_HI: the normalized AUC over steps LO..HI on `grid` (the planned
    logging steps; None: the logged ones), NaN when a planned interior step is missing unless `interpolate`
    (the report's AUC rule); final: the value at the last planned step (None: the last logged value)."""
    from orchestrator.stats.paired import window_auc

    if not steps.size:
        return math.nan
    m = MEASURE.match(measure)
    if m.group(2) is not None:
        return window_auc(steps, values, (int(m.group(2)), int(m.group(3))), grid=steps if grid is None else grid,
                          interpolate=interpolate)[0]
    if grid is None or not grid.size:
        return float(values[np.argmax(steps)])
    hit = np.flatnonzero(steps == grid[-1])
    return float(values[hit[-1]]) if hit.size else math.nan


def default_metric(rows_per_run: Sequence[list[dict]]) -> str:
    """The report's default metric over runs' metrics rows: eval/success when any run logged it, else
    eval/pass@1, else train/correct_rate."""
    return next((m for m in DEFAULT_METRICS[:-1] if any(m in r for rows in rows_per_run for r in rows)),
                DEFAULT_METRICS[-1])


def measure_value(rows: list[dict], measure: str, metric: str | None, config: dict | None = None, *,
                  interpolate: bool = False) -> float:
    """One trial's value of `measure` from its metrics rows (`run_measure`; `config`: the trial's, for its
    planned logging grid); NaN when it did not get there. `metric` None: `default_metric` of these rows."""
    metric = metric or default_metric([rows])
    last = {}
    for r in rows:  # the last row wins on a repeated step, as the report reads metrics.jsonl
        v = r.get(metric)
        if isinstance(r.get("step"), (int, float)):
            last[int(r["step"])] = float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else math.nan
    pts = sorted((s, v) for s, v in last.items() if math.isfinite(v))
    steps, values = (np.array(pts, dtype=float).T if pts else (np.zeros(0), np.zeros(0)))
    grid = planned_steps(config, metric) if config else None
    return run_measure(steps, values, measure, grid, interpolate=interpolate)
