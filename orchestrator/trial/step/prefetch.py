"""One-step-off-policy rollouts (`rollout.mode: one_step_off`): what the overlap means, and its checkpoint state.

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


def load_pending(checkpoint_dir: str | Path) -> tuple[Rollouts, int] | None:
    """The prefetched batch saved in a checkpoint directory, or None (sync trials, or the trial's last step)."""
    path = Path(checkpoint_dir) / PREFETCH_FILE
    return rollouts_from_json(path.read_text()) if path.exists() else None


def save_pending(checkpoint_dir: str | Path, roll: Rollouts, version: int) -> None:
    """Write a prefetched batch into a checkpoint directory (`load_pending` reads it back)."""
    (Path(checkpoint_dir) / PREFETCH_FILE).write_text(rollouts_to_json(roll, version))
