"""The two interfaces one training step reaches the outside through: the rollout `EnginesPort` and the `LearnerPort`.

Today's implementations own their actors (engines.py: `RolloutEngines` over the trial's rollout workers;
learner_group.py: `LearnerGroup` over its learner ranks). A trial that uses engines or a learner shared with other
trials plugs in a second implementation (a client of the shared ones) through `TrialContext`; the step, the
sources and the loop call only what is named here, so they do not change for it."""

from __future__ import annotations

from typing import Protocol

from workers.learner.inputs import LearnerBatch, StepResult
from workers.rollout.output import Generation
from workers.rollout.worker import SamplingRequest
from workers.sync.policy import PolicyUpdate


class EnginesPort(Protocol):
    """The engines a trial samples from, as `count` shards (request shard j is seeded by `seeds[j]`)."""

    @property
    def count(self) -> int:
        """How many shards a batch of prompts is split into (0: no engine, e.g. a replay without evaluation)."""
        ...

    def generate(self, prompt_ids: list[list[int]], request: SamplingRequest, seeds: list[int],
                 phase: str) -> list[Generation]:
        """`prompt_ids` split over the shards in order, each sampled under `request` with its seed; one
        `Generation` per non-empty shard, waited on under `phase`'s deadline."""
        ...

    def load_policy(self, update: PolicyUpdate) -> int:
        """`update` on every engine; its version once every engine holds it."""
        ...

    def health(self) -> None:
        """Every engine answers its health check in time and is well; a frozen or sick one fails the trial here
        (calls.py: PhaseTimeout, the trial retried)."""
        ...

    def sleep(self, level: int) -> None:
        """Free the engines' GPU memory (colocated trials: the learner trains on the same GPUs)."""
        ...

    def wake(self, parts: list[str]) -> None:
        """Reallocate `parts` ("weights", "kv_cache") of sleeping engines."""
        ...


class LearnerPort(Protocol):
    """The learner a trial trains: one step at a time, its policy exported for the engines, its state saved."""

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
