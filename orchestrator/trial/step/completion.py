"""Groups admitted as they complete (`rollout.decode_per_step`, async with `admission: discard`): a group's
staleness depends on its length.

A real asynchronous generator that does not cut rollouts across weight updates (prime-rl, SkyRL, tinker's async
loop) samples every token of a group with the policy it held when the group started, and the group reaches the
learner when its longest completion is done. Long groups arrive later, so they train staler, and a `discard` rule
drops them more often than short ones: the bias tinker-cookbook PR 822 measured. Wall-clock completion would make
the trial irreproducible, so here completion is a clock in tokens:

- a sample decodes `decode_per_step` tokens while the learner takes one step. A batch sampled ahead during step s
  (the policy the engines hold then, its version stamped on every group: [oldest, newest] are equal, since no
  rollout is cut) has group i ready at step s + ceil(L_i / decode_per_step), L_i its longest completion in
  tokens (at least s + 1). A batch collected in line at step t (nothing was sampled ahead: step 0) is ready from
  t on, by the same count.
- at step t the learner looks at the unresolved groups of the batches sampled for steps <= t (it never trains a
  group sampled for a later step, so step t's own batch is always there) that are ready; when none is, it waits
  for the next to complete (the earliest ready step among them). Ready groups past the bound (learner version
  minus the group's version > k) are dropped and counted; of the rest, the oldest `len(batch t)` (the batch
  size; by step sampled for, then order in the batch) train. Ready groups beyond that wait for the next step.
- the step's row: its groups are those trained (left out when uninformative, as every mode does) or dropped now.
  The source's batch-level metrics (`time/generate_s`, grader counts, `train/<label>/correct_rate`) are those
  of the batch sampled for step t, each batch's logged once.

The generator samples as under plain discard (k + 1 steps ahead, the same prompts and sampling seeds per step in
every arm of a sweep), and everything is a function of the step and the sampled lengths: a trial is reproducible,
and the checkpoint holds the groups in flight (`INFLIGHT_FILE`), so a resumed trial continues bit for bit.

Why not partial rollouts (verl's fully-async recipe, where a completion continues across updates in segments and
its oldest and newest versions differ): that needs continuation requests to the engines, per-segment seeds and
log-prob stitching; the clock gives the same length-dependent staleness with whole completions, each sampled by
one policy. Under `paced` the learner waits for the oldest batch whatever its lengths, so the clock changes
nothing there: paced trains exactly what was offered.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from orchestrator.trial.collect.rollouts import Rollouts
from orchestrator.trial.step.prefetch import rollouts_from_json, rollouts_to_json

INFLIGHT_FILE = "inflight.json"


@dataclass
class InFlight:
    """One batch sampled for step `index` during step `sampled_at` with policy `version`; `ready[i]`: the first
    step group i can train at; `resolved[i]`: it was trained, dropped or left out at some step."""

    roll: Rollouts
    version: int
    index: int
    sampled_at: int
    ready: list[int]
    resolved: list[bool]


def ready_steps(roll: Rollouts, sampled_at: int, per_step: int, inline: bool = False) -> list[int]:
    """The step each group of `roll` completes at (module doc): its longest completion over `per_step` tokens a
    step, counted from the step after `sampled_at` (from `sampled_at` itself for a batch collected in line)."""
    first = sampled_at if inline else sampled_at + 1
    return [first + max(1, math.ceil(max((len(r) for r in g), default=0) / per_step)) - 1
            for g in roll.response_ids]


@dataclass
class Taken:
    """What step t trains on: its groups (`roll`, stamped with their versions), the indices in it dropped past the
    bound, and those sampled at an earlier step than the one that trains them (`delayed`)."""

    roll: Rollouts
    dropped: list[int]
    delayed: set[int]


class CompletionQueue:
    """The batches in flight under the clock (module doc). `per_step`: decode_per_step; `bound`: k."""

    def __init__(self, per_step: int, bound: int):
        self.per_step, self.bound = per_step, bound
        self.batches: list[InFlight] = []

    def has(self, index: int) -> bool:
        return any(b.index == index for b in self.batches)

    def next_index(self, step: int) -> int:
        """The next step whose batch has not been sampled."""
        return max([step] + [b.index for b in self.batches]) + 1

    def add(self, roll: Rollouts, version: int, index: int, sampled_at: int, inline: bool = False) -> None:
        self.batches.append(InFlight(roll, version, index, sampled_at,
                                     ready_steps(roll, sampled_at, self.per_step, inline), [False] * len(roll)))

    def take(self, step: int, version: int) -> Taken:
        """Step `step`'s groups when the learner holds `version` (module doc); resolves them."""
        own = next(b for b in self.batches if b.index == step)
        waiting = [(b, i) for b in self.batches if b.index <= step for i in range(len(b.roll)) if not b.resolved[i]]
        ready = [(b, i) for b, i in waiting if b.ready[i] <= step]
        if not ready:  # the learner waits for the next group to complete
            first = min(b.ready[i] for b, i in waiting)
            ready = [(b, i) for b, i in waiting if b.ready[i] == first]
        stale = [(b, i) for b, i in ready if version - b.version > self.bound]
        fresh = [(b, i) for b, i in ready if version - b.version <= self.bound][:len(own.roll)]
        chosen = sorted(stale + fresh, key=lambda x: (x[0].index, x[1]))
        for b, i in chosen:
            b.resolved[i] = True
        roll = Rollouts.concat([b.roll.select([i]) for b, i in chosen])
        roll.metrics = dict(own.roll.metrics)  # each batch's own metrics, once: in the step it was sampled for
        dropped = [j for j, (b, _) in enumerate(chosen) if version - b.version > self.bound]
        delayed = {j for j, (b, _) in enumerate(chosen) if b.sampled_at < step}
        self.batches = [b for b in self.batches if not all(b.resolved)]
        return Taken(roll, dropped, delayed)

    def to_json(self) -> str:
        return json.dumps({"per_step": self.per_step, "bound": self.bound, "batches": [
            {**json.loads(rollouts_to_json(b.roll, b.version)), "index": b.index, "sampled_at": b.sampled_at,
             "ready": b.ready, "resolved": b.resolved} for b in self.batches]})

    @classmethod
    def from_json(cls, text: str) -> CompletionQueue:
        data = json.loads(text)
        queue = cls(int(data["per_step"]), int(data["bound"]))
        for item in data["batches"]:
            roll, version = rollouts_from_json(json.dumps({"version": item["version"], "rollouts": item["rollouts"]}))
            queue.batches.append(InFlight(roll, version, int(item["index"]), int(item["sampled_at"]),
                                          [int(r) for r in item["ready"]], [bool(r) for r in item["resolved"]]))
        return queue


def save_inflight(checkpoint_dir: str | Path, queue: CompletionQueue | None) -> None:
    """Write the groups in flight into a checkpoint directory (`load_inflight` reads them back)."""
    if queue is not None:
        (Path(checkpoint_dir) / INFLIGHT_FILE).write_text(queue.to_json())


def load_inflight(checkpoint_dir: str | Path) -> CompletionQueue | None:
    """The groups in flight saved in a checkpoint directory, or None (no clock, or none saved)."""
    path = Path(checkpoint_dir) / INFLIGHT_FILE
    return CompletionQueue.from_json(path.read_text()) if path.exists() else None
