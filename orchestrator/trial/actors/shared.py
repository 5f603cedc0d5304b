"""A trial of a shared-base campaign (`resources.shared_base`) reaches the campaign's pool (orchestrator/pool/)
through these two clients: `PoolEnginesClient` and `PoolLearnerClient` are the `EnginesPort` / `LearnerPort`
(ports.py) over the pool's actors, every call naming the trial's slot by its lease (the slot and its epoch:
workers/fence.py) and waited on under the trial's deadlines (calls.py), so the step does not know it shares.
`connect` finds the pool's named actors, takes the trial's slot and opens it fresh under the lease (a new adapter
from the trial's seed, zero optimizer moments; the engines drop whatever adapter the slot held), giving the slot
back when anything after the acquire fails; a resumed trial then restores its checkpoint into it as a separate one
would. What `connect` returns, `PoolSlot`, is the trial's backend on the pool (backend.py: `open_backend` picks
it): its clients, its `slot` event, its placement record, and `close`, the slot's release.

The pool's actors are named in the campaign's Ray namespace (the campaign driver and its trials' drivers are one
Ray job) under the pool's id (orchestrator/config/pool_key.py: one pool per base model, the id a pure function of
the trial's config). A pool of L learners and E engines: the trial's slot s trains on learner s mod L and samples on
`rollout.num_workers` of the engines (pool_key.py:slot_learner, slot_engines), splitting its prompts over them as
a separate trial over its own; only these actors are the trial's (waited for, recovered, recorded), so a learner's
restart is seen by its own slots' trials only."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from pathlib import Path

import ray
from ray.exceptions import ActorUnavailableError

from orchestrator import storage as store
from orchestrator.config.placement import engines as trial_engines
from orchestrator.config.pool_key import (
    engine_name,
    learner_name,
    pool_id,
    slot_engines,
    slot_learner,
    slots_name,
)
from orchestrator.config.trial import TrialConfig
from orchestrator.storage import EVENTS_FILE
from orchestrator.trial.actors.calls import Calls, check_health, judge_health
from orchestrator.trial.actors.engine_recovery import EngineRecovery, Job
from orchestrator.trial.actors.engines import shares
from orchestrator.trial.actors.leak_guard import check_rollout_policy
from orchestrator.trial.actors.ports import LearnerRestarted
from orchestrator.trial.actors.restart import await_learner, first_line, learner_lost, ready_within
from orchestrator.trial.actors.start import placement_record
from workers.fence import SlotLease
from workers.learner.inputs import LearnerBatch, RunSettings, StepResult
from workers.rollout.isolation import IsolationProbe
from workers.rollout.output import Generation
from workers.rollout.worker import SamplingRequest
from workers.sync.policy import PolicyUpdate

POOL_INITIAL_VERSIONS: frozenset[int | None] = frozenset({0})  # the slot's v0 (`connect`), never the bare base
# learner restarts `connect` waits through before a last, unguarded try: more than the pool's restart budget
# (orchestrator/pool/lifecycle.py:RESTARTS), past which the learner is dead for good and says so in one line
LEARNER_RESTARTS_AT_CONNECT = 5


class PoolEnginesClient:
    """The `EnginesPort` over the pool's rollout engines, sampling under the trial's adapter (its slot's `lease`).
    An engine that restarts under a call costs the trial only time: its slot is reopened with the adapter last
    pushed and the call redone (engine_recovery.py; waiting up to `wait_s` for the engine to be back)."""

    def __init__(self, engines: list, lease: SlotLease, calls: Calls, wait_s: float = 3600.0,
                 record: Callable[[dict], None] | None = None, indices: list[int] | None = None):
        self.engines, self.lease, self.calls = list(engines), lease, calls
        # `indices`: each engine's index in the pool (pool_key.py:slot_engines), for the names in errors and events
        self.indices = list(range(len(self.engines))) if indices is None else list(indices)
        self.names = [(f"pool.engine[{i}]", e) for i, e in zip(self.indices, self.engines, strict=True)]
        self.recovery = EngineRecovery(lease, calls, wait_s, record=record)

    @property
    def count(self) -> int:
        return len(self.engines)

    @property
    def initial_versions(self) -> frozenset[int | None]:
        return POOL_INITIAL_VERSIONS

    def generate(self, prompt_ids: list[list[int]], request: SamplingRequest, seeds: list[int],
                 phase: str) -> list[Generation]:
        jobs = [Job(name, e, _generate_call(self.lease, prompts, req))
                for name, e, prompts, req in shares(self.names, prompt_ids, request, seeds)]
        return self.recovery.gather(jobs, phase)

    def load_policy(self, update: PolicyUpdate) -> int:
        self.recovery.current = update  # what a restarted engine gets back (engine_recovery.py)
        self.recovery.gather([Job(name, e, lambda e: e.load_policy.remote(self.lease, update))
                              for name, e in self.names], "sync")
        return update.version

    def drop(self) -> None:
        """Evict whatever adapter the slot held (a trial that held it before, or this trial's earlier attempt) and
        open it under the lease: the engines refuse older ones from now on. Through the recovery like every call:
        an engine may die while the trial connects (a restarted one is opened the same way)."""
        self.recovery.gather([Job(name, e, lambda e: e.drop.remote(self.lease)) for name, e in self.names], "setup")

    def placements(self) -> list[dict]:
        """Each engine's process (pid, node, placement group), answered by the process running now."""
        return self.recovery.gather([Job(name, e, lambda e: e.placement.remote()) for name, e in self.names],
                                    "setup")

    def isolation(self, sequences: list[list[int]]) -> list[IsolationProbe]:
        """Every engine's isolation probe of the slot (workers/rollout/shared.py:isolation), through the recovery."""
        return self.recovery.gather([Job(name, e, lambda e: e.isolation.remote(self.lease, sequences))
                                     for name, e in self.names], "generate")

    def health(self) -> None:
        """Every engine answers `health` (one that died is waited for and its slot reopened first) and is ok."""
        # one call, through the recovery: a second, unguarded call could meet an engine killed in between
        answers = self.recovery.gather([Job(name, e, lambda e: e.health.remote()) for name, e in self.names],
                                       "health")
        judge_health(self.calls, self.names, answers)

    def sleep(self, level: int) -> None:
        self._refuse("sleep")

    def wake(self, parts: list[str]) -> None:
        self._refuse("wake")

    @staticmethod
    def _refuse(what: str) -> None:
        """A pool's engines serve other trials: never put to sleep by one. A shared base refuses colocated
        placement before launch (orchestrator/campaign/shared.py), so reaching this is a bug, said as such."""
        raise RuntimeError(f"a shared pool's engines serve every trial of the pool and do not {what} for one "
                           "(resources.shared_base refuses placement: colocated before launch)")


def _generate_call(lease: SlotLease, prompts: list[list[int]], request: SamplingRequest):
    """An engine's share of a generate call, as a submit that can be made again (the same prompts and seeds)."""
    return lambda engine: engine.generate.remote(lease, prompts, request)


class PoolLearnerClient:
    """The `LearnerPort` over the pool's learner, training the trial's adapter (its slot's `lease`).

    The pool's learner restarting under the trial (its process killed, or exiting on a poisoned CUDA context:
    orchestrator/pool/actors.py) is absorbed here: the call that meets it waits (up to the setup deadline) for the
    learner to be back, reopens the slot under the same lease and raises `LearnerRestarted`, on which the loop
    restores the trial's newest checkpoint in process. Each restart spends one of the pool's (Ray's `max_restarts`
    of the learner actor), none of the trial's `max_failures`; once they are spent the call fails in one line.
    Every step's result passes the leak guard (leak_guard.py)."""

    def __init__(self, learner, lease: SlotLease, calls: Calls, index: int = 0):
        self.learner, self.lease, self.calls, self.index = learner, lease, calls, index  # index: learner j of the pool
        self.named = [(f"pool.learner[{index}]", learner)]
        self.cfg: TrialConfig | None = None  # what `open` built the slot from, to reopen it after a restart

    def open(self, cfg: TrialConfig) -> None:
        """The slot as a fresh learner of this trial: a pure function of its seed (SharedLearner.open), opened
        under the lease (older ones refused from now on)."""
        self.cfg = cfg
        run = RunSettings(seed=cfg.seed, total_steps=cfg.steps, dtype=cfg.model.dtype,
                          collective_timeout_s=cfg.timeouts.collective)
        self.calls.get(self.learner.open.remote(self.lease, learner=cfg.learner, credit=cfg.credit,
                                                interventions=cfg.interventions, run=run), "setup", self.named)

    def open_fresh(self, cfg: TrialConfig) -> PolicyUpdate:
        """`connect`'s opening: `open` and the slot's version-0 adapter. A learner that restarts meanwhile is
        waited for and the slot opened again on its new process (nothing to restore yet: the slot is fresh), so a
        learner fault while a trial connects is the pool's too, not charged to the trial's retries."""
        opened = False
        for _ in range(LEARNER_RESTARTS_AT_CONNECT):
            try:
                if not opened:
                    self._absorbing(lambda: self.open(cfg))
                return self.export_policy(0)
            except LearnerRestarted:
                opened = True  # `_absorbing` opened the slot again on the new process
        self.open(cfg)
        return self.export_policy(0)

    def ready(self) -> bool:
        return True  # the pool waited for its learner before the Tuner started

    def submit_train_step(self, batch: LearnerBatch) -> object:
        return self.learner.train_step.remote(self.lease, batch)

    def result(self, handle: object) -> StepResult:
        out = self._absorbing(lambda: self.calls.get(handle, "train", self.named))
        check_rollout_policy(out.metrics, self.lease)
        return out

    def export_policy(self, version: int) -> PolicyUpdate:
        return self._absorbing(lambda: self.calls.get(self.learner.export_policy.remote(self.lease, version), "sync",
                                                      self.named))

    def release_cache(self) -> None:
        self._absorbing(lambda: self.calls.get(self.learner.release_cache.remote(), "sync", self.named))

    def write_checkpoint(self, directory: str) -> list[str]:
        files = self._absorbing(lambda: self.calls.get(self.learner.checkpoint_files.remote(self.lease), "checkpoint",
                                                       self.named))
        for name, data in files.items():
            path = Path(directory) / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
        return list(files)

    def restore(self, files: dict[str, bytes], source: str) -> None:
        self._absorbing(lambda: self.calls.get(self.learner.restore.remote(self.lease, files, source), "checkpoint",
                                               self.named))

    def placements(self) -> list[dict]:
        return [self._absorbing(lambda: self.calls.get(self.learner.placement.remote(), "setup", self.named))]

    def shutdown(self) -> None:
        """Nothing to kill: the learner is the pool's (a hang fails this trial only; the pool's health check and
        the campaign decide about the pool)."""

    def _absorbing(self, call):
        """`call()`, or, when the learner's process died under it: wait for it, reopen the slot, `LearnerRestarted`."""
        try:
            return call()
        except Exception as e:
            if not learner_lost(e) or self.cfg is None:
                raise
            reason = first_line(e)
        what = f"shared pool learner {self.index}, slot {self.lease.slot} of trial {self.lease.trial}"
        end = time.monotonic() + self.cfg.timeouts.setup
        while True:  # a learner that dies again while the slot reopens: wait again, within the same bound
            await_learner(lambda s: ready_within(self.learner, s), max(end - time.monotonic(), 0.0), what)
            try:
                self.open(self.cfg)
                break
            except Exception as e:
                if not learner_lost(e):
                    raise
        raise LearnerRestarted(f"{what}: the learner restarted under the trial ({reason}); slot reopened")


@dataclasses.dataclass
class PoolSlot:
    """The trial's backend on its slot of the pool (backend.py): the pool's clients under the slot's lease, no
    rollout worker of its own."""

    pool: str  # the pool's id (orchestrator/config/pool_key.py)
    lease: SlotLease
    engines: PoolEnginesClient
    learner: PoolLearnerClient
    registry: object
    waited_s: float = 0.0  # how long the acquire waited for a free slot
    pg: object = None  # the trial's placement group (its driver's bundle only)
    workers: list = dataclasses.field(default_factory=list)  # the trial's own rollout workers: none
    events: list[dict] = dataclasses.field(default_factory=list)  # events.jsonl lines of the opening (`connect`)

    @property
    def slot(self) -> int:
        return self.lease.slot

    def placement(self) -> dict:
        """placement.json of a trial on the pool: the driver's part, the pool's learner, and the pool's engines as
        `workers` (the same processes in every trial of the campaign: tests check the sharing with them), the
        pool's own record under `pool`."""
        shared = pool_record(self, check_health(self.engines.calls, self.engines.names))
        record = placement_record(self.pg, [], self.learner, [], "shared", self.engines.calls)
        return {**record, "workers": shared["workers"], "pool": shared}

    def release(self) -> None:
        """Give the slot back (the trial ended or failed) unless a later holder, or a later attempt of this trial,
        has it already: the campaign driver releases it too, whatever happened to this process
        (orchestrator/tune/slot_owner.py)."""
        _release(self.registry, self.lease)

    def close(self) -> None:
        """The trial is done with the pool: its slot released (the pool's actors live on for other trials)."""
        self.release()


def _release(registry, lease: SlotLease) -> None:
    """`lease`'s slot back to the pool's registry (nothing when a later holder or attempt has it)."""
    try:
        ray.get(registry.release.remote(lease.trial, lease.epoch), timeout=30)
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
                 poll_s: float = 1.0) -> SlotLease:
    """The trial's lease on a slot, waiting up to `timeout_s` for one to be freed. Tune never runs more of a pool's
    trials at once than it has slots (orchestrator/tune/scheduling.py) and the campaign driver releases a slot as
    soon as Tune sees its trial end, pause or fail (orchestrator/tune/slot_owner.py); the wait covers a release on
    its way. Past the wait: the registry's error."""
    named, end = [("pool.slots", registry)], time.monotonic() + timeout_s
    while time.monotonic() < end:
        lease = calls.get(registry.try_acquire.remote(trial, driver), "setup", named)
        if lease is not None:
            return lease
        time.sleep(poll_s)
    return calls.get(registry.acquire.remote(trial, driver), "setup", named)


def connect(cfg: TrialConfig, calls: Calls, pg=None) -> PoolSlot:
    """The trial's slot in its base model's running pool (the same slot again for a retried trial that still holds
    one), opened fresh under a new epoch on the slot's learner and engines (pool_key.py:slot_learner,
    slot_engines; any slot, on any learner: a retry restores its checkpoint into whichever it gets): the engines
    drop the slot's adapter, the learner builds this trial's from its seed. Anything failing after the acquire
    gives the slot back before the error goes on. `pg`: the trial's placement group, for its placement record."""
    pool = pool_id(cfg)
    registry = ray.get_actor(slots_name(pool))
    named = [("pool.slots", registry)]
    count, learners = (calls.get(registry.engines.remote(), "setup", named),
                       calls.get(registry.learners.remote(), "setup", named))
    at = time.monotonic()
    lease = acquire_slot(registry, cfg.name, ray.get_runtime_context().get_actor_id(), calls, cfg.timeouts.setup)
    try:
        mine = slot_engines(lease.slot, min(trial_engines(cfg), count), count)
        j = slot_learner(lease.slot, learners)
        actors = [ray.get_actor(engine_name(pool, i)) for i in mine], ray.get_actor(learner_name(pool, j))
        # only the slot's own actors: a restart of another learner is none of this trial's business
        await_restarts([*actors[0], actors[1]], cfg.timeouts.setup)
    except BaseException:
        _release(registry, lease)
        raise
    events = None if cfg.output_dir is None else store.join(cfg.output_dir, EVENTS_FILE)
    engines = PoolEnginesClient(actors[0], lease, calls, wait_s=cfg.timeouts.setup,
                                record=None if events is None else lambda e: store.append_line(events, e),
                                indices=mine)
    learner = PoolLearnerClient(actors[1], lease, calls, index=j)
    slot = PoolSlot(pool, lease, engines, learner, registry, time.monotonic() - at, pg)
    try:
        slot.engines.drop()
        # the slot's initial adapter (B = 0: the base model's outputs) on the engines at once, so that no request of
        # a shared engine goes without a LoRA: at 4 slots, a slot left on the bare base sampled some step-0 batches
        # mixed with other slots' adapters with another adapter's weights (README, Shared base)
        slot.engines.load_policy(slot.learner.open_fresh(cfg))
    except BaseException:
        slot.release()
        raise
    slot.events.append({"event": "slot", "pool": pool, "slot": slot.slot, "epoch": lease.epoch, "learner": j,
                        "engines": mine, "waited_s": round(slot.waited_s, 3), "time": time.time()})
    return slot


def pool_record(slot: PoolSlot, health: list[dict]) -> dict:
    """The pool's part of a shared trial's placement.json: its id, the slot, the index of the slot's learner
    (`learner_index`) and of its engines (`engine_indices`), that learner's and each of those engines' process
    (pid, node, placement group) and the engines' child processes: the same for every trial of that slot."""
    where = slot.engines.placements()
    return {"id": slot.pool, "slot": slot.slot, "epoch": slot.lease.epoch, "learner_index": slot.learner.index,
            "engine_indices": slot.engines.indices,
            "learner": slot.learner.placements()[0],
            "workers": [{**w, "engine_pids": [c["pid"] for c in h.get("children", [])]}
                        for w, h in zip(where, health, strict=True)]}
