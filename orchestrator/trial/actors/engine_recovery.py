"""A pool engine's restart costs a trial only time (orchestrator/pool/: an engine killed, or killed by the campaign's
supervisor, is restarted by Ray with every slot empty). A call of the trial's engine client that fails because the
engine died (Ray's actor errors) or because its slot is not open on the engine (workers/fence.py:SlotNotOpen: the
engine restarted since the trial last opened it) is answered here: wait until the engine is back (bounded: a clear
error past it), open the slot again under the trial's lease (the fence applies: a lease older than the slot's
opener is refused, nothing reopened), load the adapter the trial last pushed (the `PolicyUpdate` itself, kept
here: never re-exported, since under one_step_off the learner has moved on), and submit the same call again.
Every request is seeded per prompt (workers/rollout/sampling.py), so the redone rollout is the one the engine
would have returned had it not died."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import ray
from ray.exceptions import GetTimeoutError, RayActorError

from orchestrator.trial.actors.calls import Calls
from workers.fence import SlotLease, SlotNotOpen
from workers.sync.policy import PolicyUpdate

ATTEMPTS = 5  # tries of one call: more than a pool actor's restarts (orchestrator/pool/lifecycle.py:RESTARTS)


class EngineLost(RuntimeError):
    """A pool engine did not come back after it died, within the wait."""


@dataclass(frozen=True)
class Job:
    """One engine's part of a call: its name, its handle, and how to submit the call to it (again)."""

    name: str
    engine: object
    submit: Callable[[object], object]


def recoverable(error: BaseException) -> bool:
    return isinstance(error, RayActorError | SlotNotOpen)


class EngineRecovery:
    """Runs a trial's calls on the pool's engines, reopening a restarted engine's slot and redoing the call."""

    def __init__(self, lease: SlotLease, calls: Calls, wait_s: float, poll_s: float = 0.5,
                 ready: Callable[[object, float], bool] | None = None, record: Callable[[dict], None] | None = None):
        self.lease, self.calls, self.wait_s, self.poll_s = lease, calls, wait_s, poll_s
        self.ready = ready or _ready  # whether an engine answers `ready` within a timeout (raises while it cannot)
        self.record = record  # each reopening as an events.jsonl line of the trial (None: kept in `reopened` only)
        self.current: PolicyUpdate | None = None  # the adapter the trial last pushed (reloaded after a restart)
        self.reopened: list[dict] = []  # one record per slot reopened on a restarted engine

    def gather(self, jobs: list[Job], phase: str) -> list:
        """Every job's value, in order, submitted together and waited on under `phase`'s deadline; a job that
        fails recoverably is redone on its engine once the slot is open there again."""
        refs = [j.submit(j.engine) for j in jobs]
        try:
            return self.calls.get(refs, phase, [(j.name, j.engine) for j in jobs])
        except Exception as e:  # noqa: BLE001 - only a restarted engine's errors are redone, below
            if not recoverable(e):
                raise
        return [self._one(j, ref, phase) for j, ref in zip(jobs, refs, strict=True)]

    def _one(self, job: Job, ref, phase: str):
        error: BaseException | None = None
        for attempt in range(ATTEMPTS):
            try:
                if error is not None:  # the engine died again while reopening counts as one more try
                    self.reopen(job, error)
                    ref = job.submit(job.engine)
                return self.calls.get(ref, phase, [(job.name, job.engine)])
            except Exception as e:  # noqa: BLE001 - as in gather
                if not recoverable(e) or attempt == ATTEMPTS - 1:
                    raise
                error = e
        raise AssertionError("unreachable")

    def reopen(self, job: Job, error: BaseException) -> None:
        """The engine back, the trial's slot open on it under the lease, with the adapter the trial last pushed."""
        t0 = time.monotonic()
        self._await(job, error)
        named = [(job.name, job.engine)]
        self.calls.get(job.engine.drop.remote(self.lease), "setup", named)
        if self.current is not None:
            self.calls.get(job.engine.load_policy.remote(self.lease, self.current), "sync", named)
        record = {"event": "engine_reopened", "engine": job.name, "slot": self.lease.slot, "epoch": self.lease.epoch,
                  "version": None if self.current is None else self.current.version,
                  "why": f"{type(error).__name__}", "waited_s": round(time.monotonic() - t0, 3), "time": time.time()}
        self.reopened.append(record)
        if self.record is not None:
            self.record(record)
        print(f"trial {self.lease.trial}: {job.name} restarted ({record['why']}); slot {self.lease.slot} reopened "
              f"with adapter v{record['version']} after {record['waited_s']} s, its call redone", flush=True)

    def _await(self, job: Job, error: BaseException) -> None:
        """Return once the engine answers `ready` (a restarting actor answers when its new engine is built)."""
        end = time.monotonic() + self.wait_s
        while True:
            left = end - time.monotonic()
            if left <= 0:
                raise EngineLost(f"pool {job.name} did not come back within {self.wait_s:g} s (timeouts.setup) after "
                                 f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}")
            try:
                if self.ready(job.engine, left):
                    return
            except (RayActorError, GetTimeoutError):
                pass
            time.sleep(min(self.poll_s, max(end - time.monotonic(), 0.0)))


def _ready(engine, timeout: float) -> bool:
    return ray.get(engine.ready.remote(), timeout=timeout)
