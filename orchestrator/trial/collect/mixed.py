"""The rollout source of a mixed task (`task: {mix: [...]}`, workers/tasks/mix.py): one source per member.

Each member plays through its own single-task source (sources.py: `SingleTurnSource` or `EpisodeSource`) with
its own trial config (orchestrator/config/members.py: its task, its groups as prompts_per_step, its seed), so a
single-turn task and a multi-turn environment mix without either knowing. A step's groups are the members'
groups concatenated in the mix's order. Each member is refilled on its own (fill.py: `Refill` with the member's
config, whose `rollout.fill.groups` is the member's `groups`): with `rollout.fill` every member samples rounds
until its own share is usable, so its asked share trains whatever the other members' groups and the mix's order;
a member still short after `fill.max_rounds` trains what it has and says so (`train/<label>/fill_short`: the
groups it is short of its share). Member i's problems, levels and sampling seeds are a pure function of (trial
seed, step, round, i), and the checkpoint holds every member's cursor (`MixedTask.state_dict`), so a resumed trial
replays them. The step's `train/fill_rounds` is the most rounds a member needed.

Metrics: the step's totals are over the whole batch as for one task (step/sequence.py); beside them each member's
`train/<label>/correct_rate`, and for a multi-turn member `env/<label>/success` (the `env/*` totals are over the
multi-turn members' episodes). Held out: `eval/<label>/pass@1` (a multi-turn member's `eval/*` episode metrics
as `eval/<label>/*`) and the totals `eval/pass@1` / `eval/pass@k` over every member's problems. Sample files
name each group's problem `<label>/<id>`.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from orchestrator.config.members import member_trials
from orchestrator.tracking.names import EPISODE
from orchestrator.trial.actors.context import TrialContext
from orchestrator.trial.collect.fill import Refill
from orchestrator.trial.collect.rollouts import HeldOut, Rollouts, SampleGroup
from orchestrator.trial.collect.sources import EpisodeSource, RolloutSource, SingleTurnSource, rollout_source
from workers.tasks.mix import MixConfig

EVAL_TOTALS = ("eval/pass@1", "eval/pass@k")  # weighted by each member's problems
TURN_EXTRAS = ("turn_rewards", "reward_positions", "sampled_mask")


def task_source(ctx: TrialContext) -> RolloutSource:
    """The task's source, refilled (fill.py: `Refill`): a `MixedSource` of the members' refilled sources for a
    mix, else the one task's (sources.py: rollout_source)."""
    if not isinstance(ctx.cfg.task, MixConfig):
        return Refill(ctx.cfg, rollout_source(ctx))
    parts = []
    for (label, cfg), task in zip(member_trials(ctx.cfg), ctx.task.tasks, strict=True):
        sub = dataclasses.replace(ctx, cfg=cfg, task=task)
        parts.append((label, Refill(cfg, EpisodeSource(sub) if cfg.task.agentic else SingleTurnSource(sub))))
    return MixedSource(parts, {label: cfg.rollout.fill.groups for label, cfg in member_trials(ctx.cfg)
                               if cfg.rollout.fill is not None})


def as_turns(roll: Rollouts) -> Rollouts:
    """Single-turn groups in the multi-turn extras (one turn: its reward on the last sampled id, every id
    sampled), so they concatenate with episodes; the learner trains them as it trains them without."""
    if all(k in roll.extra for k in TURN_EXTRAS):
        return roll
    positions = [[[len(m) - 1] if m else [] for m in g] for g in roll.loss_mask]
    rewards = [[[r] if p else [] for r, p in zip(rs, ps, strict=True)] for rs, ps in zip(roll.rewards, positions,
                                                                                         strict=True)]
    extra = {**roll.extra, "turn_rewards": rewards, "reward_positions": positions,
             "sampled_mask": [[list(m) for m in g] for g in roll.loss_mask]}
    return dataclasses.replace(roll, extra=extra)


def _labelled(roll: Rollouts, label: str, asked: int | None = None) -> Rollouts:
    """`roll` with its groups' problems named `<label>/<id>` and the member's own metrics beside the totals;
    `asked`: the groups the member's refill was to train (its `groups`), reported short of when not reached."""
    info = [{**g, "problem": f"{label}/{g['problem']}"} for g in roll.groups_info]
    metrics = dict(roll.metrics)
    metrics[f"train/{label}/correct_rate"] = float(np.mean([c for g in roll.correct for c in g]))
    if "env/success" in roll.metrics:
        metrics[f"env/{label}/success"] = roll.metrics["env/success"]
    if asked is not None:
        metrics[f"train/{label}/fill_short"] = asked - sum(roll.train)
    return dataclasses.replace(roll, groups_info=info, metrics=metrics)


class MixedSource:
    """The members' sources side by side; `parts`: (label, source) in the mix's order, each source a whole
    step's (refilled: `Refill`); `asked`: label -> the groups its refill is to train (members under
    `rollout.fill`)."""

    def __init__(self, parts: list[tuple[str, RolloutSource]], asked: dict[str, int] | None = None):
        self.parts, self.asked = parts, asked or {}

    def collect(self, step: int, round: int = 0) -> Rollouts:
        rolls = [_labelled(src.collect(step, round), label, self.asked.get(label)) for label, src in self.parts]
        if any(r.extra for r in rolls):  # some member plays episodes: every group carries turns
            rolls = [as_turns(r) for r in rolls]
        roll = Rollouts.concat(rolls)
        if all("train/fill_rounds" in r.metrics for r in rolls):  # the most rounds a member needed
            roll.metrics["train/fill_rounds"] = max(r.metrics["train/fill_rounds"] for r in rolls)
        return roll

    def evaluate(self, step: int) -> HeldOut:
        out: dict = {}
        totals: dict[str, list[tuple[float, int]]] = {k: [] for k in EVAL_TOTALS}
        samples: list[SampleGroup] = []
        k, problems, seconds = None, 0, 0.0
        for label, src in self.parts:
            held = src.evaluate(step)
            m = dict(held.metrics)
            if not m:
                continue
            samples += [dataclasses.replace(g, problem=f"{label}/{g.problem}") for g in held.samples]
            n = int(m.pop("eval/problems"))
            problems, seconds = problems + n, seconds + float(m.pop("time/eval_s", 0.0))
            k = m.pop("eval/k")
            for key in EVAL_TOTALS:
                totals[key].append((float(m[key]), n))
            out[f"eval/{label}/pass@1"] = m.pop("eval/pass@1")
            m.pop("eval/pass@k")
            for name in EPISODE:  # a multi-turn member's episode metrics
                if f"eval/{name}" in m:
                    out[f"eval/{label}/{name}"] = m.pop(f"eval/{name}")
            out.update(m)  # per-source metrics of a dataset member (eval/<source>/pass@1)
        if not problems:
            return HeldOut()
        for key, values in totals.items():
            out[key] = sum(v * n for v, n in values) / sum(n for _, n in values)
        return HeldOut({**out, "eval/k": k, "eval/problems": problems, "time/eval_s": seconds}, samples)
