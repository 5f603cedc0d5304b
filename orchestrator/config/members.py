"""The single-task trials a trial is made of: itself, or one per member of a mixed task (workers/tasks/mix.py).

A member's trial config is the trial's with the member's task, its groups as `rollout.prompts_per_step` (and as
`rollout.fill.groups` under a refill: each member fills to its own share) and its seed `member_seed(seed, i)`: what the rollout source of a mix (orchestrator/trial/collect/mixed.py) hands each member's
source, and what the checks before launch (first turns, plugins, dataset files) read member by member.
"""

from __future__ import annotations

from orchestrator.config.trial import TrialConfig
from workers.tasks.mix import MixConfig, member_seed


def member_trials(cfg: TrialConfig) -> list[tuple[str, TrialConfig]]:
    """(label, config) of each single-task part of `cfg`, in the mix's order; `[(task label, cfg)]` for one task."""
    if not isinstance(cfg.task, MixConfig):
        return [(cfg.task.label, cfg)]
    out = []
    for i, (m, label) in enumerate(zip(cfg.task.mix, cfg.task.labels, strict=True)):
        fill = cfg.rollout.fill.model_copy(update={"groups": m.groups}) if cfg.rollout.fill is not None else None
        rollout = cfg.rollout.model_copy(update={"prompts_per_step": m.groups, "fill": fill})
        out.append((label, cfg.model_copy(update={"task": m.task, "rollout": rollout,
                                                   "seed": member_seed(cfg.seed, i)})))
    return out


def is_mix(cfg: TrialConfig) -> bool:
    """Whether the trial's task is a mix (per-member metrics beside the totals)."""
    return isinstance(cfg.task, MixConfig)
