"""`RolloutEngines`: the `Engines` interface (ports.py) over a trial's own rollout worker actors, every call waited
on under its phase's deadline (calls.py)."""

from __future__ import annotations

import dataclasses

from orchestrator.trial.actors.calls import Calls, check_health
from workers.rollout.output import Generation
from workers.rollout.worker import SamplingRequest, shard
from workers.sync.policy import PolicyUpdate, push


class RolloutEngines:
    """`workers`: rollout worker actors (workers/rollout/worker.py), one shard each; `calls`: the trial's
    deadlines."""

    def __init__(self, workers: list, calls: Calls | None = None):
        self.workers, self.calls = list(workers), calls or Calls()
        self.names = [(f"rollout[{i}]", w) for i, w in enumerate(self.workers)]

    @property
    def count(self) -> int:
        return len(self.workers)

    def generate(self, prompt_ids: list[list[int]], request: SamplingRequest, seeds: list[int],
                 phase: str) -> list[Generation]:
        parts = shard(list(range(len(prompt_ids))), len(self.workers))
        named = [(name, w) for (name, w), idx in zip(self.names, parts, strict=True) if idx]
        futures = [w.generate.remote([prompt_ids[i] for i in idx], dataclasses.replace(request, seed=seeds[j]))
                   for j, (w, idx) in enumerate(zip(self.workers, parts, strict=True)) if idx]
        return self.calls.get(futures, phase, named)

    def load_policy(self, update: PolicyUpdate) -> int:
        if not self.workers:
            return update.version
        return push(self.workers, update, wait=lambda refs: self.calls.get(refs, "sync", self.names))

    def health(self) -> None:
        check_health(self.calls, self.names)

    def sleep(self, level: int) -> None:
        self.calls.get([w.sleep.remote(level) for w in self.workers], "sync", self.names)

    def wake(self, parts: list[str]) -> None:
        self.calls.get([w.wake_up.remote(list(parts)) for w in self.workers], "sync", self.names)
