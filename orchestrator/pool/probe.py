"""What a pool actor answers the campaign's supervisor (orchestrator/pool/supervisor.py) on its control thread, never
behind a generate or a train step: `ProbeAnswer`. An engine says whether its engine thread is making progress
(`progress` must advance while `pending` > 0: workers/rollout/shared.py:liveness); the learner says how long its
oldest running call has run (`CallClock`, kept around every slot call of the pool's learner: actors.py)."""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass


@dataclass(frozen=True)
class ProbeAnswer:
    pid: int
    ok: bool  # the process's children are running (no stopped, zombie or dead engine core)
    reason: str = ""  # why not ok
    progress: int | None = None  # engine: steps plus engine-thread calls finished since the process started
    pending: int | None = None  # engine: requests in flight, calls queued or running
    requests: int | None = None  # engine: requests in flight
    call: str | None = None  # learner: its oldest running call's name
    call_s: float = 0.0  # learner: how long that call has run

    @classmethod
    def of(cls, health: dict, **fields) -> ProbeAnswer:
        """From a `process_health` dict (workers/rollout/worker.py) and the actor's own fields."""
        return cls(pid=int(health["pid"]), ok=bool(health["ok"]), reason=str(health.get("reason", "")), **fields)


class CallClock:
    """When each call now running started (several at once: a slot's export runs beside another's train step)."""

    def __init__(self, clock=time.monotonic):
        self._clock, self._ids = clock, itertools.count()
        self._running: dict[int, tuple[str, float]] = {}
        self._lock = threading.Lock()

    @contextmanager
    def running(self, name: str) -> Iterator[None]:
        key = next(self._ids)
        with self._lock:
            self._running[key] = (name, self._clock())
        try:
            yield
        finally:
            with self._lock:
                del self._running[key]

    def oldest(self) -> tuple[str | None, float]:
        """The oldest running call's name and age in seconds ((None, 0.0): none running)."""
        with self._lock:
            if not self._running:
                return None, 0.0
            name, start = min(self._running.values(), key=lambda v: v[1])
        return name, self._clock() - start
