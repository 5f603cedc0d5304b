"""The two interfaces one training step and the trial loop reach the outside through: the rollout `EnginesPort` and
the `LearnerPort`.

Two implementations of each, one per backend (backend.py: `open_backend` picks one for the trial): over the trial's
own actors (engines.py: `RolloutEngines` over its rollout workers; learner_group.py: `LearnerGroup` over its learner
ranks), and over its slot of the campaign's shared pool (shared.py: `PoolEnginesClient`, `PoolLearnerClient`). The
step, the sources and the loop call only what is named here, so they never ask which backend they run on."""

from __future__ import annotations

import time
from typing import Protocol

from workers.learner.inputs import LearnerBatch, StepResult
from workers.rollout.isolation import IsolationProbe
from workers.rollout.output import Generation
from workers.rollout.worker import SamplingRequest
from workers.sync.policy import PolicyUpdate


class LearnerRestarted(RuntimeError):  # noqa: N818 - an event the loop handles, not a failure of the trial
    """Any `LearnerPort` call may raise it: the learner's process died and was restarted under the trial (a shared
    pool's learner, restarted by Ray with every slot empty), so the trial's learner state is gone; the port has
    waited for the learner to be back and reopened the trial's part of it fresh (a pure function of the seed). The
    loop then restores the trial's newest checkpoint in this process, as a Tune retry would from the same
    checkpoint (orchestrator/trial/loop.py), and the restart costs the trial none of its `max_failures`."""

    def __init__(self, reason: str):
        self.reason = reason
        super().__init__(reason)

    def event(self, from_step: int) -> dict[str, object]:
        """The trial's events.jsonl line: the restart, and the step it continues from."""
        return {"event": "learner_restart", "from_step": from_step, "reason": self.reason, "time": time.time()}


class EnginesPort(Protocol):
    """The engines a trial samples from, as `count` shards (request shard j is seeded by `seeds[j]`)."""

    @property
    def count(self) -> int:
        """How many shards a batch of prompts is split into (0: no engine, e.g. a replay without evaluation)."""
        ...

    @property
    def initial_versions(self) -> frozenset[int | None]:
        """The adapter versions a rollout may carry before the trial's first policy push: the trial's own engines
        sample the bare base (None) or its adapter v0 (B = 0), {None, 0}; a pool slot always holds an adapter
        (shared.py:connect loads v0 at once), {0}, so there a bare-base rollout is another slot's leak or a
        restarted engine, never the trial's policy (step/sequence.py:prepare refuses it)."""
        ...

    def generate(self, prompt_ids: list[list[int]], request: SamplingRequest, seeds: list[int],
                 phase: str) -> list[Generation]:
        """`prompt_ids` split over the shards in order, each sampled under `request` with its seed; one
        `Generation` per non-empty shard, waited on under `phase`'s deadline."""
        ...

    def load_policy(self, update: PolicyUpdate) -> int:
        """`update` on every engine; its version once every engine holds it."""
        ...

    def isolation(self, sequences: list[list[int]]) -> list[IsolationProbe]:
        """Each engine's isolation probe of the trial's slot on `sequences` (workers/rollout/isolation.py: the
        same teacher-forced log-probs alone and in a batch mixed with other slots' adapters); [] for the trial's
        own engines, whose batch no other trial shares."""
        ...

    def health(self) -> None:
        """Every engine answers its health check in time and is well; a frozen or sick one fails the trial here
        (calls.py: PhaseTimeout, the trial retried)."""
        ...

    def sleep(self, level: int) -> None:
        """Free the engines' GPU memory (colocated trials: the learner trains on the same GPUs). Refused on a pool
        (RuntimeError): its engines serve other trials, and a shared base refuses colocated placement
        before launch (orchestrator/campaign/shared.py), so no pool trial's phases ask."""
        ...

    def wake(self, parts: list[str]) -> None:
        """Reallocate `parts` ("weights", "kv_cache") of sleeping engines. Refused on a pool, as `sleep`."""
        ...


class LearnerPort(Protocol):
    """The learner a trial trains: one step at a time, its policy exported for the engines, its state saved. Any
    call may raise `LearnerRestarted` (the trial's learner state lost with a restarted process)."""

    def ready(self) -> bool:
        """Wait (under the setup deadline) until the learner has built its model; True once it has."""
        ...

    def submit_train_step(self, batch: LearnerBatch) -> object:
        """Start one training step; returns a handle `result` waits on (the step may overlap generation)."""
        ...

    def result(self, handle: object) -> StepResult:
        ...

    def export_policy(self, version: int) -> PolicyUpdate:
        """The current policy (adapter or full weights) as `version`."""
        ...

    def release_cache(self) -> None:
        """Hand cached GPU memory back before colocated engines wake."""
        ...

    def write_checkpoint(self, directory: str) -> list[str]:
        """The learner's state as files under `directory`; their names."""
        ...

    def restore(self, files: dict[str, bytes], source: str) -> None:
        """Load the state `write_checkpoint` saved (`source` names where it came from, for errors)."""
        ...

    def placements(self) -> list[dict[str, object]]:
        """Where the learner's processes run, rank 0 first (pid, node, placement group, GPU ids): placement.json's
        `learner` and `learner_ranks`."""
        ...

    def shutdown(self) -> None:
        """Kill the learner's own actors (a missed deadline: loop.py's hang handler); nothing on a pool, whose
        learner serves other trials. Idempotent."""
        ...
