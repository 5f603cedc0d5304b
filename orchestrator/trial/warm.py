"""Warm actors: the rollout workers and learner rank of a trial that ended or paused, kept in the trial driver's
process for the next trial Tune starts in that process (`TuneConfig(reuse_actors=True)`,
orchestrator/tune/launch.py), instead of new processes that import vLLM, torch and PEFT again and build their
models (about 35 CPU-seconds a trial start on the 2-core CPU box; on a GPU the engine's start is the larger part).
A campaign with more trials than slots (lockstep rounds pause and resume every trial each round) pays it once per
slot instead of once per trial start.

A trial takes them only if they would have been built the same way (`warm_key`): the same model, the same engine
settings (every `RolloutWorkerSettings` field but the seed: every request carries its own seed, and that the
engine's seed changes no token or log-prob is held by benchmarks/engine_start.py's smoke run), the same slots of
the same placement group; LoRA (a full-weights engine's base weights were overwritten), one learner rank (a
process group belongs to the trial that formed it), separate placement (colocated engines sleep beside their
ranks). They are reset first: each engine drops its adapters and its prefix cache, the learner rank builds a new
Learner (model, optimizer, seeds) in its process. A trial on warm actors reports the metrics a fresh start
reports (tests/integration/trial/test_interventions.py). Otherwise the parked actors are killed and new ones start.
"""

from __future__ import annotations

import dataclasses
import json
import os
from contextlib import contextmanager
from dataclasses import dataclass

import ray

from orchestrator.config.placement import colocated, learner_slots, worker_slots
from orchestrator.config.trial import TrialConfig
from orchestrator.trial.actors import (
    learner_args,
    rollout_names,
    rollout_settings,
    shutdown_actors,
    start_actors,
)
from orchestrator.trial.calls import Calls
from orchestrator.trial.learner_group import LearnerGroup

# Tune's reset of a reused trainable waits this long for the previous trial's thread to end (after a pause it
# unwinds from `tune.report` through `kept` below); past it the next trial fails. Tune's default is 2 s.
os.environ.setdefault("TUNE_FUNCTION_THREAD_TIMEOUT_S", "60")


@dataclass
class Parked:
    key: str
    trial: str
    workers: list
    ranks: list


_parked: Parked | None = None  # this process's warm actors, between two trials


def warm_key(cfg: TrialConfig, pg) -> str | None:
    """What the trial's actors are built from, as one string (None: this trial's actors are never reused)."""
    if cfg.learner.mode != "lora" or cfg.resources.learner_ranks != 1 or colocated(cfg):
        return None
    return json.dumps({
        "model": cfg.model.model_dump(mode="json"),
        "rollout": dataclasses.asdict(dataclasses.replace(rollout_settings(cfg), seed=0)),
        "slots": [dataclasses.asdict(s) for s in worker_slots(cfg) + learner_slots(cfg)],
        "placement_group": pg.id.hex() if pg is not None else None,
    }, sort_keys=True, default=str)


def _kill(parked: Parked) -> None:
    for actor in parked.workers + parked.ranks:
        ray.kill(actor)


def take(cfg: TrialConfig, pg, calls: Calls) -> tuple[list, LearnerGroup, str | None]:
    """The trial's rollout workers and learner group: the parked ones reset, when `warm_key` matches, else new
    ones (`start_actors`; parked ones of another shape are killed first, freeing their slots). The third value
    names the trial the actors come from (None: new)."""
    global _parked
    parked, _parked = _parked, None
    if parked is not None and parked.key == warm_key(cfg, pg):
        try:
            calls.get([w.reset.remote() for w in parked.workers], "setup", rollout_names(parked.workers))
            calls.get([r.reset.remote(cfg.model.model_dump(), **learner_args(cfg)) for r in parked.ranks], "setup",
                      [("learner[0]", parked.ranks[0])])
            return parked.workers, LearnerGroup(parked.ranks, full=False, calls=calls), parked.trial
        except Exception as exc:  # noqa: BLE001 - a dead or broken warm actor: start afresh instead
            print(f"[{cfg.name}] warm actors of {parked.trial} unusable ({type(exc).__name__}: {exc}); "
                  "starting new ones", flush=True)
    if parked is not None:
        _kill(parked)
    workers, learner = start_actors(cfg, pg, calls)
    return workers, learner, None


@contextmanager
def kept(cfg: TrialConfig, pg, workers: list, learner: LearnerGroup):
    """Around a trial's run on `workers` and `learner`: at its end, or when Tune stops it at a report (a pause,
    a budget stop: `tune.report` raises SystemExit there, right after a checkpoint), they are parked for the next
    trial in this process when it may reuse them (`warm_key`), else killed; on any error they are killed (the
    retry starts new ones)."""
    try:
        yield
    except SystemExit:
        _park(cfg, pg, workers, learner)
        raise
    except BaseException:
        shutdown_actors(workers, learner)
        raise
    _park(cfg, pg, workers, learner)


def _park(cfg: TrialConfig, pg, workers: list, learner: LearnerGroup) -> None:
    global _parked
    key = warm_key(cfg, pg)
    if key is None:
        shutdown_actors(workers, learner)
        return
    _parked = Parked(key, cfg.name, list(workers), list(learner.ranks))
