"""A trial of a shared-base campaign (`resources.shared_base`) reaches the campaign's pool (orchestrator/pool/)
through these two clients: `PoolEngines` and `PoolLearner` are the `Engines` / `Learner` ports (ports.py) over
the pool's actors, every call naming the trial's slot and waited on under the trial's deadlines (calls.py), so
the step does not know it shares. `connect` finds the pool's named actors, takes the trial's slot and opens it
fresh (a new adapter from the trial's seed, zero optimizer moments; the engines drop whatever adapter the slot
held); a resumed trial then restores its checkpoint into it as a separate one would.

The pool's actors are named in the campaign's Ray namespace (the campaign driver and its trials' drivers are one
Ray job) under the pool's id (orchestrator/config/pool_key.py: one pool per base model, the id a pure function of
the trial's config); the names live here so that the pool (which imports this module) and the trial agree on them."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import ray
from ray.exceptions import ActorUnavailableError

from orchestrator.config.pool_key import pool_id
from orchestrator.config.trial import TrialConfig
from orchestrator.trial.actors.calls import Calls, check_health
from orchestrator.trial.actors.engines import fan_out
from workers.learner.inputs import LearnerBatch, RunSettings, StepResult
from workers.rollout.output import Generation
from workers.rollout.worker import SamplingRequest
from workers.sync.policy import PolicyUpdate

POOL = "shared-base-pool"


def learner_name(pool: str) -> str:
    return f"{POOL}/{pool}/learner"


def slots_name(pool: str) -> str:
    return f"{POOL}/{pool}/slots"


def engine_name(pool: str, i: int) -> str:
    return f"{POOL}/{pool}/engine{i}"


class PoolEngines:
    """The `Engines` port over the pool's rollout engines, sampling under the trial's adapter (its `slot`)."""

    def __init__(self, engines: list, slot: int, calls: Calls):
        self.engines, self.slot, self.calls = list(engines), slot, calls
        self.names = [(f"pool.engine[{i}]", e) for i, e in enumerate(self.engines)]

    @property
    def count(self) -> int:
        return len(self.engines)

    def generate(self, prompt_ids: list[list[int]], request: SamplingRequest, seeds: list[int],
                 phase: str) -> list[Generation]:
        return fan_out(self.calls, self.names, lambda e, prompts, req: e.generate.remote(self.slot, prompts, req),
                       prompt_ids, request, seeds, phase)

    def load_policy(self, update: PolicyUpdate) -> int:
        self.calls.get([e.load_policy.remote(self.slot, update) for e in self.engines], "sync", self.names)
        return update.version

    def drop(self) -> None:
        """Evict whatever adapter the slot held (a trial that held it before, or this trial's earlier attempt)."""
        self.calls.get([e.drop.remote(self.slot) for e in self.engines], "setup", self.names)

    def health(self) -> None:
        check_health(self.calls, self.names)

    def sleep(self, level: int) -> None:  # never called: shared_base refuses colocated placement
        raise NotImplementedError("a shared pool's engines do not sleep")

    def wake(self, parts: list[str]) -> None:
        raise NotImplementedError("a shared pool's engines do not sleep")


class PoolLearner:
    """The `Learner` port over the pool's learner, training the trial's adapter (its `slot`)."""

    def __init__(self, learner, slot: int, calls: Calls):
        self.learner, self.slot, self.calls = learner, slot, calls
        self.named = [("pool.learner", learner)]

    def open(self, cfg: TrialConfig) -> None:
        """The slot as a fresh learner of this trial: a pure function of its seed (SharedLearner.open)."""
        run = RunSettings(seed=cfg.seed, total_steps=cfg.steps, dtype=cfg.model.dtype,
                          collective_timeout_s=cfg.timeouts.collective)
        self.calls.get(self.learner.open.remote(self.slot, learner=cfg.learner, credit=cfg.credit,
                                                interventions=cfg.interventions, run=run), "setup", self.named)

    def ready(self) -> bool:
        return True  # the pool waited for its learner before the Tuner started

    def submit_train_step(self, batch: LearnerBatch) -> object:
        return self.learner.train_step.remote(self.slot, batch)

    def result(self, handle: object) -> StepResult:
        return self.calls.get(handle, "train", self.named)

    def export_policy(self, version: int) -> PolicyUpdate:
        return self.calls.get(self.learner.export_policy.remote(self.slot, version), "sync", self.named)

    def release_cache(self) -> None:
        self.calls.get(self.learner.release_cache.remote(), "sync", self.named)

    def write_checkpoint(self, directory: str) -> list[str]:
        files = self.calls.get(self.learner.checkpoint_files.remote(self.slot), "checkpoint", self.named)
        for name, data in files.items():
            path = Path(directory) / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
        return list(files)

    def restore(self, files: dict[str, bytes], source: str) -> None:
        self.calls.get(self.learner.restore.remote(self.slot, files, source), "checkpoint", self.named)

    def placements(self) -> list[dict]:
        return [self.calls.get(self.learner.placement.remote(), "setup", self.named)]

    def shutdown(self) -> None:
        """Nothing to kill: the learner is the pool's (a hang fails this trial only; the pool's health check and
        the campaign decide about the pool)."""


@dataclasses.dataclass
class PoolClients:
    pool: str  # the pool's id (orchestrator/config/pool_key.py)
    slot: int
    engines: PoolEngines
    learner: PoolLearner
    registry: object

    def release(self, trial: str) -> None:
        """Give the slot back (the trial ended or failed); the registry opens it fresh for the next holder."""
        try:
            ray.get(self.registry.release.remote(trial), timeout=30)
        except Exception:  # noqa: BLE001 - a pool already stopped (the campaign ending) has nothing to release
            pass


def await_restarts(actors: list, timeout_s: float, poll_s: float = 0.5) -> None:
    """Return once every pool actor answers: one that Ray is restarting (it died: orchestrator/pool/lifecycle.py)
    refuses calls meanwhile, and a trial retried after that death must not fail again on it."""
    end = time.monotonic() + timeout_s
    while True:
        try:
            ray.get([a.ready.remote() for a in actors], timeout=max(end - time.monotonic(), 1.0))
            return
        except ActorUnavailableError:
            if time.monotonic() > end:
                raise
            time.sleep(poll_s)


def acquire_slot(registry, trial: str, driver: str | None, calls: Calls, timeout_s: float,
                 poll_s: float = 1.0) -> int:
    """The trial's slot, waiting up to `timeout_s` for one to be freed. Tune never runs more of a pool's trials
    at once than it has slots (orchestrator/tune/scheduling.py); the wait covers a trial Tune has seen end (paused,
    failed) whose driver has not yet given its slot back or died. Past the wait: the registry's error."""
    named, end = [("pool.slots", registry)], time.monotonic() + timeout_s
    while time.monotonic() < end:
        slot = calls.get(registry.try_acquire.remote(trial, driver), "setup", named)
        if slot is not None:
            return slot
        time.sleep(poll_s)
    return calls.get(registry.acquire.remote(trial, driver), "setup", named)


def connect(cfg: TrialConfig, calls: Calls) -> PoolClients:
    """The trial's slot in its base model's running pool (the same slot again for a retried trial that still holds
    one), opened fresh: the engines drop the slot's adapter, the learner builds this trial's from its seed."""
    pool = pool_id(cfg)
    registry = ray.get_actor(slots_name(pool))
    count = calls.get(registry.engines.remote(), "setup", [("pool.slots", registry)])
    actors = [ray.get_actor(engine_name(pool, i)) for i in range(count)], ray.get_actor(learner_name(pool))
    await_restarts([*actors[0], actors[1]], cfg.timeouts.setup)
    slot = acquire_slot(registry, cfg.name, ray.get_runtime_context().get_actor_id(), calls, cfg.timeouts.setup)
    engines, learner = PoolEngines(actors[0], slot, calls), PoolLearner(actors[1], slot, calls)
    engines.drop()
    learner.open(cfg)
    # the slot's initial adapter (B = 0: the base model's outputs) on the engines at once, so that no request of a
    # shared engine goes without a LoRA: at 4 slots, a slot left on the bare base sampled some step-0 batches
    # mixed with other slots' adapters with another adapter's weights (README, Shared base)
    engines.load_policy(learner.export_policy(0))
    return PoolClients(pool, slot, engines, learner, registry)


def pool_record(clients: PoolClients, health: list[dict]) -> dict:
    """The pool's part of a shared trial's placement.json: its id, the slot, the learner's and each engine's process
    (pid, node, placement group) and the engines' child processes: the same for every trial of that pool."""
    where = clients.learner.calls.get([e.placement.remote() for e in clients.engines.engines], "setup",
                                      clients.engines.names)
    return {"id": clients.pool, "slot": clients.slot, "learner": clients.learner.placements()[0],
            "workers": [{**w, "engine_pids": [c["pid"] for c in h.get("children", [])]}
                        for w, h in zip(where, health, strict=True)]}
