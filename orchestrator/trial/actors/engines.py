"""`RolloutEngines`: the `EnginesPort` (ports.py) over a trial's own rollout worker actors, every call waited on
under its phase's deadline (calls.py)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from orchestrator.trial.actors.calls import Calls, check_health
from workers.rollout.isolation import IsolationProbe
from workers.rollout.output import Generation
from workers.rollout.worker import SamplingRequest, shard
from workers.sync.policy import PolicyUpdate, push


def fan_out(calls: Calls, names: list[tuple[str, object]], submit: Callable[[object, list, SamplingRequest], object],
            prompt_ids: list[list[int]], request: SamplingRequest, seeds: list[int], phase: str) -> list[Generation]:
    """The prompts split in order over the engines of `names` ((name, handle) pairs; one with no share gets no
    call), engine j's share sent by `submit(handle, prompts, request)` with seed `seeds[j]`, waited on under
    `phase`'s deadline: one `Generation` per engine called. A trial's own workers and a pool's engines alike."""
    futures, called = [], []
    for name, handle, prompts, req in shares(names, prompt_ids, request, seeds):
        futures.append(submit(handle, prompts, req))
        called.append((name, handle))
    return calls.get(futures, phase, called)


def shares(names: list[tuple[str, object]], prompt_ids: list[list[int]], request: SamplingRequest,
           seeds: list[int]) -> list[tuple[str, object, list[list[int]], SamplingRequest]]:
    """(name, handle, prompts, request) of every engine with a share: the prompts split in order, engine j's
    request seeded `seeds[j]`."""
    parts = shard(list(range(len(prompt_ids))), len(names))
    return [(name, handle, [prompt_ids[i] for i in idx], dataclasses.replace(request, seed=seeds[j]))
            for j, ((name, handle), idx) in enumerate(zip(names, parts, strict=True)) if idx]


OWN_INITIAL_VERSIONS: frozenset[int | None] = frozenset({None, 0})  # the bare base, or its adapter v0 (B = 0)


class RolloutEngines:
    """`workers`: rollout worker actors (workers/rollout/worker.py), one shard each; `calls`: the trial's
    deadlines."""

    def __init__(self, workers: list, calls: Calls | None = None):
        self.workers, self.calls = list(workers), calls or Calls()
        self.names = [(f"rollout[{i}]", w) for i, w in enumerate(self.workers)]

    @property
    def count(self) -> int:
        return len(self.workers)

    @property
    def initial_versions(self) -> frozenset[int | None]:
        return OWN_INITIAL_VERSIONS

    def generate(self, prompt_ids: list[list[int]], request: SamplingRequest, seeds: list[int],
                 phase: str) -> list[Generation]:
        return fan_out(self.calls, self.names, lambda w, prompts, req: w.generate.remote(prompts, req),
                       prompt_ids, request, seeds, phase)

    def load_policy(self, update: PolicyUpdate) -> int:
        if not self.workers:
            return update.version
        return push(self.workers, update, wait=lambda refs: self.calls.get(refs, "sync", self.names))

    def isolation(self, sequences: list[list[int]]) -> list[IsolationProbe]:
        return []  # the trial's own engines: no other trial's request shares their batch

    def health(self) -> None:
        check_health(self.calls, self.names)

    def sleep(self, level: int) -> None:
        self.calls.get([w.sleep.remote(level) for w in self.workers], "sync", self.names)

    def wake(self, parts: list[str]) -> None:
        self.calls.get([w.wake_up.remote(list(parts)) for w in self.workers], "sync", self.names)
