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
  its update, so the next batches are one version fresher. Deterministic too. With `rollout.decode_per_step`
  the groups are admitted one by one as they complete (completion.py), so a long group trains staler and is
  dropped more often than a short one; the rows count the offered and trained groups by difficulty and by mix
  member (`composition`) for the report's composition table.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from orchestrator.config.rollout import RolloutConfig
from orchestrator.trial.collect.rollouts import Rollouts
from workers.objectives.settings import OffPolicySettings


@dataclass(frozen=True)
class Admission:
    """The staleness bound k, the admission rule, and whether the row carries the `async/*` metrics (async only:
    sync and one_step_off rows stay as they were)."""

    bound: int = 0
    discard: bool = False
    log: bool = False
    clock: int | None = None  # decode_per_step under discard: groups admitted as they complete (completion.py)

    @classmethod
    def for_rollout(cls, ro: RolloutConfig) -> Admission:
        discard = ro.admission == "discard"
        return cls(ro.staleness_bound, discard, ro.mode == "async", ro.decode_per_step if discard else None)

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


DIFFICULTY = ("hard", "easy")  # a group's pass rate below 0.5, or not


def difficulty(correct: list[bool], info: dict | None = None) -> str:
    """A group's difficulty bin: `hard` when its problem's pass rate is below one half, else `easy`. The pass rate
    is the starting policy's where the trial measured it (`start_pass_rate` in the group's info:
    rollout.difficulty_samples), else the group's own under the policy that sampled it."""
    rate = (info or {}).get("start_pass_rate")
    if rate is not None:
        return "hard" if rate < 0.5 else "easy"
    return "hard" if 2 * sum(correct) < len(correct) else "easy"


def source_of(info: dict) -> str:
    """A mixed task's group's member label (its problem is named `<label>/<id>`: collect/mixed.py)."""
    return str(info.get("problem", "")).split("/", 1)[0]


def composition(roll: Rollouts, kept: list[int], labels: list[str]) -> dict[str, float]:
    """The step's offered and trained groups counted by difficulty (`difficulty`) and, for a mix (`labels`: its
    members'), by member: `async/{offered,trained}_by_difficulty/<bin>`, `async/{offered,trained}_by_source/<label>`
    (the report's composition table sums them over the run)."""
    infos = roll.groups_info or [None] * len(roll.correct)
    bins = [difficulty(c, i) for c, i in zip(roll.correct, infos, strict=True)]
    row: dict[str, float] = {}
    for b in DIFFICULTY:
        row[f"async/offered_by_difficulty/{b}"] = sum(x == b for x in bins)
        row[f"async/trained_by_difficulty/{b}"] = sum(bins[i] == b for i in kept)
    if labels:
        src = [source_of(g) for g in roll.groups_info]
        for label in labels:
            row[f"async/offered_by_source/{label}"] = sum(s == label for s in src)
            row[f"async/trained_by_source/{label}"] = sum(src[i] == label for i in kept)
    return row


def staleness_metrics(roll: Rollouts, staleness: list[int], kept: list[int], dropped: list[int], delayed: set[int],
                      bound: int, labels: list[str] | None = None) -> dict[str, float]:
    """The step's `async/*` row: the trained tokens' staleness (histogram over 0..k, mean and max when any were
    trained) and mean completion length (tokens per trained sequence), the groups offered, dropped past k and
    delayed (trained groups sampled at an earlier step, `delayed`: their indices, that waited for the learner),
    the offered groups' oldest / newest versions, and the composition (`composition`) of the offered and trained
    groups."""
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
        "async/groups_delayed": sum(i in delayed for i in kept),
        "async/version_oldest": min((v[0] for v in roll.policy_versions), default=0),
        "async/version_newest": max((v[1] for v in roll.policy_versions), default=0),
    })
    row.update(composition(roll, kept, labels or []))
    return row


def offpolicy_settings(ro: RolloutConfig) -> OffPolicySettings:
    """The learner's off-policy settings from the trial's (workers/objectives/offpolicy.py). The mismatch metrics
    are logged under async, a rejection or metrics-only; sync and one_step_off log what they did before."""
    rej = ro.rejection
    return OffPolicySettings(
        ro.correction, ro.correction_level, ro.tis_cap if ro.correction != "none" else None,
        rej.measure if rej else None, rej.threshold if rej else None, ro.correction_metrics_only,
        log_mismatch=ro.mode == "async" or rej is not None or ro.correction_metrics_only)
