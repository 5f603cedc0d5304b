"""Which groups of a step reach the learner, and the refill that keeps their number fixed (`rollout.fill`):
`Refill`, a rollout source around any other, whose one `collect` is a whole step's rounds.

`usable_groups` is the one rule (step/sequence.py's `prepare` and the refill both use it): a group is usable when its
rewards and sampled log-probs are finite, the RV filter keeps it, it still has a token in the loss, and (with
rollout.skip_uninformative) its rewards are not all equal. `gather` runs the refill rounds: round r asks the
source for `prompts_per_step` fresh groups (the task cursor moves once per round, so a checkpoint after the step
covers every extra prompt, and the sampling seeds are a pure function of (seed, step, round)), applies
rollout.overlong to them, and stops once `fill.groups` usable groups are in hand or `fill.max_rounds` rounds have
run; the first `fill.groups` usable groups in sampling order are marked for training (`Rollouts.train`), the
rest of the last round is the dropped surplus. Without `rollout.fill` one round runs, as before.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass

import torch

from orchestrator.config.rollout import RolloutConfig
from orchestrator.config.trial import TrialConfig
from orchestrator.trial.collect.rollouts import HeldOut, Rollouts
from orchestrator.trial.collect.sources import RolloutSource
from workers.objectives.filters import FiniteCheck, RVFilterResult, nonfinite_groups, rv_filter
from workers.objectives.overlong import soft_overlong_penalty


@dataclass(frozen=True)
class Usable:
    """`usable_groups`' answer: kept group indices, and the checks behind them (for the step's metrics)."""

    keep: list[int]
    finite: FiniteCheck
    filtered: RVFilterResult
    uniform: list[bool]  # rewards all equal (a non-finite group counts as not uniform)


def usable_groups(cfg: TrialConfig, roll: Rollouts) -> Usable:
    """The groups of `roll` the learner may train on (module doc)."""
    finite = nonfinite_groups(roll.rewards, roll.logprobs, roll.loss_mask)  # NaN/inf never reach the learner
    rewards = finite.rewards
    filtered = rv_filter(torch.tensor(rewards, dtype=torch.float64), cfg.interventions.rv_filter)
    uniform = [len(set(g)) == 1 and i not in finite.bad for i, g in enumerate(rewards)]
    skip = cfg.rollout.skip_uninformative
    keep = [i for i in filtered.keep if i not in finite.bad and not (skip and uniform[i])
            and any(any(m) for m in roll.loss_mask[i])]
    return Usable(keep, finite, filtered, uniform)


def apply_overlong(roll: Rollouts, ro: RolloutConfig) -> Rollouts:
    """`rollout.overlong` on one round's samples: `mask` clears truncated samples' loss masks (counted in
    `train/overlong_masked`), `penalty` adds DAPO's soft length term to rewards (multi-turn: also to the last
    turn's reward, so per-turn credit sees it); `keep` and samples without length records are left as sampled."""
    ov = ro.overlong
    if ov.mode == "keep" or not roll.truncated:
        return roll
    if ov.mode == "mask":
        masked = [[[False] * len(m) if cut else m for m, cut in zip(g, t, strict=True)]
                  for g, t in zip(roll.loss_mask, roll.truncated, strict=True)]
        n = sum(c for t in roll.truncated for c in t)
        return dataclasses.replace(roll, loss_mask=masked, metrics={**roll.metrics, "train/overlong_masked": n})
    terms = [soft_overlong_penalty(torch.tensor(ln, dtype=torch.float64), ro.max_tokens, ov.buffer,
                                   ov.penalty).tolist() for ln in roll.lengths]
    rewards = [[r + d for r, d in zip(g, t, strict=True)] for g, t in zip(roll.rewards, terms, strict=True)]
    extra = dict(roll.extra)
    if "turn_rewards" in extra:
        extra["turn_rewards"] = [[tr[:-1] + [tr[-1] + d] if tr else tr for tr, d in zip(g, t, strict=True)]
                                 for g, t in zip(extra["turn_rewards"], terms, strict=True)]
    return dataclasses.replace(roll, rewards=rewards, extra=extra)


def gather(cfg: TrialConfig, source: RolloutSource, step: int) -> Rollouts:
    """Step `step`'s groups: every round sampled (concatenated), `train` marking the refill's choice; metrics
    `train/fill_rounds` and `time/generate_s` (all rounds, scoring excluded)."""
    fill = cfg.rollout.fill
    parts: list[Rollouts] = []
    chosen: list[bool] = []
    t_gen = 0.0
    for rnd in range(fill.max_rounds if fill else 1):
        t0 = time.perf_counter()
        part = source.collect(step, rnd)
        t_gen += time.perf_counter() - t0 - part.metrics.get("time/score_s", 0.0)
        part = apply_overlong(part, cfg.rollout)
        parts.append(part)
        if fill is None:
            break
        keep = set(usable_groups(cfg, part).keep)
        room = fill.groups - sum(chosen)
        picked = [i for i in range(len(part)) if i in keep][:room]  # surplus: the later usable groups
        chosen += [i in picked for i in range(len(part))]
        if sum(chosen) >= fill.groups:
            break
    roll = Rollouts.concat(parts)
    if fill is not None:
        roll = dataclasses.replace(roll, train=chosen)
    roll.metrics["train/fill_rounds"] = len(parts)
    roll.metrics["time/generate_s"] = t_gen
    return roll


class Refill:
    """A rollout source that refills: `collect(step)` is `gather` over `inner`'s rounds (rollout.overlong
    applied, `train` marking the refill's choice, `time/generate_s` and `train/fill_rounds` in its metrics); held
    out, it is `inner`. `cfg`: whose `rollout` settings (fill, overlong) apply."""

    def __init__(self, cfg: TrialConfig, inner: RolloutSource):
        self.cfg, self.inner = cfg, inner

    def collect(self, step: int, round: int = 0) -> Rollouts:
        """Step `step`'s groups, every round of it (`round` is the refill's own business: always 0 here)."""
        return gather(self.cfg, self.inner, step)

    def evaluate(self, step: int) -> HeldOut:
        return self.inner.evaluate(step)
