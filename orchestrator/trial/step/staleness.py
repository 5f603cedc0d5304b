"""Bounded staleness (`rollout.mode: async`; sync and one_step_off are its k = 0 and k = 1): which batches the
generator may sample ahead, which groups the learner admits, and what the step's row says about it.

The driver samples whole steps' batches ahead while the learner trains (sequence.py: `TrainingStep`), each with
the policy the engines hold then; every group is stamped with the versions that produced it, oldest and newest
token (`Rollouts.policy_versions`; one collect samples with one policy, so they are equal here: the engines'
reported versions are checked against it in `prepare`). A group's staleness is the learner's version when it
trains the group minus the group's oldest version.

- paced: the generator samples at most k steps ahead, so no group is ever trained past k; nothing is dropped and
  the oldest batch trains first. The schedule is a function of the step alone: a paced trial is reproducible bit
  for bit, and k = 0 / k = 1 are the sync / one_step_off trials.
- discard: the generator never waits for the learner: it samples k + 1 steps ahead, and groups whose staleness at
  training exceeds k are dropped (counted); the step trains on what is left, and when that is nothing it skips
  its update, so the next batches are one version fresher. Deterministic too.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from orchestrator.config.trial import RolloutConfig
from orchestrator.trial.collect.rollouts import Rollouts
from workers.objectives.settings import OffPolicySettings


@dataclass(frozen=True)
class Admission:
    """The staleness bound k, the admission rule, and whether the row carries the `async/*` metrics (async only:
    sync and one_step_off rows stay as they were)."""

    bound: int = 0
    discard: bool = False
    log: bool = False

    @classmethod
    def for_rollout(cls, ro: RolloutConfig) -> Admission:
        return cls(ro.staleness_bound, ro.admission == "discard", ro.mode == "async")

    @property
    def lookahead(self) -> int:
        """How many steps ahead of the learner the generator samples: k paced, k + 1 under discard (it never
        waits; what lands past k is dropped)."""
        return self.bound + 1 if self.discard else self.bound

    def dropped(self, staleness: list[int]) -> list[int]:
        """Indices of the groups dropped at training: past the bound, under discard only."""
        return [i for i, s in enumerate(staleness) if self.discard and s > self.bound]


def stamp(roll: Rollouts, version: int) -> Rollouts:
    """`roll` with every group's [oldest, newest] policy version: the version its one collect sampled with."""
    return dataclasses.replace(roll, policy_versions=[[version, version] for _ in range(len(roll))])


def group_staleness(roll: Rollouts, trained_version: int) -> list[int]:
    """[N] each group's staleness when the learner at `trained_version` trains it (from its oldest token)."""
    return [trained_version - oldest for oldest, _ in roll.policy_versions]


def staleness_metrics(roll: Rollouts, staleness: list[int], kept: list[int], dropped: list[int], delayed: bool,
                      bound: int) -> dict[str, float]:
    """The step's `async/*` row: the trained tokens' staleness (histogram over 0..k, mean and max when any were
    trained) and mean completion length (tokens per trained sequence), the groups offered, dropped past k and delayed (sampled at an earlier step, waiting in the queue for
    the learner), and the offered groups' oldest / newest versions."""
    tokens = {i: sum(sum(m) for m in roll.loss_mask[i]) for i in kept}
    total = sum(tokens.values())
    row: dict[str, float] = {f"async/staleness_tokens_{j}": sum(n for i, n in tokens.items() if staleness[i] == j)
                             for j in range(bound + 1)}
    if total:
        row["async/staleness_mean"] = sum(staleness[i] * n for i, n in tokens.items()) / total
        row["async/staleness_max"] = max(staleness[i] for i in kept)
        # the trained batch's composition against the offered one's (train/completion_len): the report's table
        row["async/completion_len_trained"] = total / sum(len(roll.loss_mask[i]) for i in kept)
    row.update({
        "async/groups_offered": len(roll), "async/groups_dropped": len(dropped),
        "async/groups_delayed": len(kept) if delayed else 0,
        "async/version_oldest": min((v[0] for v in roll.policy_versions), default=0),
        "async/version_newest": max((v[1] for v in roll.policy_versions), default=0),
    })
    return row


def offpolicy_settings(ro: RolloutConfig) -> OffPolicySettings:
    """The learner's off-policy settings from the trial's (workers/objectives/offpolicy.py). The mismatch metrics
    are logged under async, a rejection or metrics-only; sync and one_step_off log what they did before."""
    rej = ro.rejection
    return OffPolicySettings(
        ro.correction, ro.correction_level, ro.tis_cap if ro.correction != "none" else None,
        rej.measure if rej else None, rej.threshold if rej else None, ro.correction_metrics_only,
        log_mismatch=ro.mode == "async" or rej is not None or ro.correction_metrics_only)
