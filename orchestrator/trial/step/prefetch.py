"""One-step-off-policy rollouts (`rollout.mode: one_step_off`): what the overlap means, and its checkpoint state
(the batches sampled ahead: one under one_step_off, up to max_staleness (+ 1 under discard) under async,
staleness.py).

While the learner trains on step t (a Ray call that returns a future), the driver generates step t+1 with the
adapter the workers hold, i.e. the policy after step t-1's update; then it waits for the learner, exports the
new adapter and loads it on the workers. Generation and training overlap; the batch of step t+1 is one policy
version stale (`rollout/staleness`), which the learner corrects per token with the truncated importance weight
min(pi_old / pi_rollout, C) (`rollout.tis_cap`; pi_old is the learner's recomputed log-prob, pi_rollout vLLM's).

The step itself is the sync step's (orchestrator/trial/step/sequence.py: `TrainingStep` with `overlap`): the same seeds, task cursor order (next_batch for t+1 runs after step t's, as in sync), SEPA
lambda and observation order, filtering and metrics. The prefetched batch and the version it was sampled with
are saved in the checkpoint (`PREFETCH_FILE`), so a restored trial trains on exactly the batch the uninterrupted
one would have (regenerating it would need the previous adapter).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from orchestrator.trial.collect.rollouts import Rollouts

PREFETCH_FILE = "prefetch.json"


def rollouts_to_json(roll: Rollouts, version: int) -> str:
    """The prefetched batch and the adapter version it was sampled with, as JSON (floats round-trip exactly)."""
    data = dataclasses.asdict(roll)
    data["versions"] = sorted(roll.versions, key=lambda v: -1 if v is None else v)
    return json.dumps({"version": version, "rollouts": data})


def rollouts_from_json(text: str) -> tuple[Rollouts, int]:
    data = json.loads(text)
    fields = dict(data["rollouts"])
    fields["versions"] = set(fields["versions"])
    return Rollouts(**fields), int(data["version"])


def load_queue(checkpoint_dir: str | Path) -> list[tuple[Rollouts, int]]:
    """The batches sampled ahead saved in a checkpoint directory, oldest first ([] for a sync trial, or when none
    was held). One batch is one_step_off's file as it always was; more (async, max_staleness > 1) a list of them."""
    path = Path(checkpoint_dir) / PREFETCH_FILE
    if not path.exists():
        return []
    data = json.loads(path.read_text())
    if "queue" not in data:
        return [rollouts_from_json(path.read_text())]
    return [rollouts_from_json(json.dumps(item)) for item in data["queue"]]


def load_pending(checkpoint_dir: str | Path) -> tuple[Rollouts, int] | None:
    """The next step's batch saved in a checkpoint directory, or None (sync trials, or the trial's last step)."""
    queue = load_queue(checkpoint_dir)
    return queue[0] if queue else None


def save_queue(checkpoint_dir: str | Path, queue: list[tuple[Rollouts, int]]) -> None:
    """Write the batches sampled ahead into a checkpoint directory (`load_queue` reads them back); nothing when
    there are none."""
    if len(queue) == 1:
        save_pending(checkpoint_dir, *queue[0])
    elif queue:
        items = [json.loads(rollouts_to_json(roll, version)) for roll, version in queue]
        (Path(checkpoint_dir) / PREFETCH_FILE).write_text(json.dumps({"queue": items}))


def save_pending(checkpoint_dir: str | Path, roll: Rollouts, version: int) -> None:
    """Write a prefetched batch into a checkpoint directory (`load_pending` reads it back)."""
    (Path(checkpoint_dir) / PREFETCH_FILE).write_text(rollouts_to_json(roll, version))
