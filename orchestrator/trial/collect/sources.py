"""Where a trial's samples come from: the rollout-source interface and its two implementations.

A source turns the task into one step's groups of samples (`collect`) and measures the current policy on the
task's held-out set (`evaluate`). The step (orchestrator/trial/step/sequence.py) only asks a source for a batch and
never branches on the kind of task; `rollout_source` picks the source once per trial. A new kind of task plugs
in here: implement the two methods of `RolloutSource` and return it from `rollout_source`.

- `SingleTurnSource`: prompts -> `rollout.n` completions each -> the task's rewards (a group shares a prompt).
- `EpisodeSource` (agentic tasks): levels -> `rollout.n` multi-turn episodes each -> episode returns (a group
  plays one level; orchestrator/trial/collect/episodes.py plays them).

Both keep training's randomness a pure function of (seed, step, round): sampling seeds come from `step_seed`
(round 0 keeps the seeds of runs without refill), the task cursor advances once per `collect` (one refill round),
and `evaluate` uses its own seeds and no cursor, so resumes stay equivalent.
"""

from __future__ import annotations

import math
import time
from typing import Protocol

import numpy as np

from orchestrator.trial.actors.context import TrialContext
from orchestrator.trial.collect.episodes import episode_metrics, play_episodes
from orchestrator.trial.collect.evaluation import pass_at_k
from orchestrator.trial.collect.rollouts import HeldOut, Rollouts, SampleGroup, group_info
from orchestrator.trial.collect.sampling import difficulty_seed, sample, step_seed
from workers.envs.tokens import first_prompt_ids
from workers.rollout.output import Completion

EVAL_SEED_OFFSET = 104_729  # held-out sampling seeds: trial seed + this, never training's


class RolloutSource(Protocol):
    """One kind of task's way to produce training samples and a held-out score."""

    def collect(self, step: int, round: int = 0) -> Rollouts:
        """Step `step`'s groups of refill round `round` (fresh prompts / levels from the task cursor, sampling
        seeds of (step, round); round 0 is the only round without `rollout.fill`), sampled with the adapter
        the workers hold now. `versions` holds every adapter version the workers reported; `metrics` goes into
        the step's row (time spent scoring, if any, and sampling the starting policy for the difficulty bins, as
        `time/score_s`: it is excluded from `time/generate_s`);
        `truncated` / `lengths` say which samples hit the length limit."""
        ...

    def evaluate(self, step: int) -> HeldOut:
        """Held-out metrics of the current policy and its generations (`HeldOut`; empty when the task has no
        held-out set). Must not move the training task cursor."""
        ...


def per_source(prefix: str, metric: str, problems, values: list[float]) -> dict:
    """`<prefix>/<source>/<metric>`: the mean of `values` (one per problem) over each labelled source's problems
    (a dataset's `data_source`); {} when no problem has a label."""
    by: dict[str, list[float]] = {}
    for p, v in zip(problems, values, strict=True):
        if p.source:
            by.setdefault(p.source.replace("/", "_"), []).append(float(v))
    return {f"{prefix}/{s}/{metric}": float(np.mean(v)) for s, v in sorted(by.items())}


class SingleTurnSource:
    """Prompts -> one completion per sample -> the task's binary rewards."""

    def __init__(self, ctx: TrialContext):
        self.ctx = ctx

    def _completions(self, problems, step: int, seed: int, n: int, temperature: float, *, round: int = 0,
                     phase: str = "generate"):
        """The prompts' ids (the chat template when there is one) and the sampler's results, per shard (waited on
        under `phase`'s deadline)."""
        ctx = self.ctx
        prompt_ids = [first_prompt_ids(ctx.tokenizer, p.prompt, system=p.system) for p in problems]
        seeds = [step_seed(seed, step, j, round=round) for j in range(ctx.engines.count)]
        return prompt_ids, sample(ctx, prompt_ids, n=n, temperature=temperature, seeds=seeds, phase=phase)

    def _score(self, prob, group: list[Completion]):
        texts = [self.ctx.tokenizer.decode(c.token_ids, skip_special_tokens=True) for c in group]
        return self.ctx.task.score([prob] * len(group), texts)

    def collect(self, step: int, round: int = 0) -> Rollouts:
        cfg, ro = self.ctx.cfg, self.ctx.cfg.rollout
        problems = self.ctx.task.next_batch(ro.prompts_per_step)
        prompt_ids, results = self._completions(problems, step, cfg.seed, ro.n, ro.temperature, round=round)
        groups = [g for res in results for g in res.completions]
        sampler_floor = [math.exp(lp) for g in groups for c in g for lp in (c.action_logprobs or {}).values()]
        t0 = time.perf_counter()
        rewards, errors, timeouts = [], 0, 0
        for prob, group in zip(problems, groups, strict=True):
            scored = self._score(prob, group)
            rewards.append(scored.rewards)
            errors, timeouts = errors + scored.grader_errors, timeouts + scored.grader_timeouts
        info = [group_info(p.id, p.prompt, _truncated(g)) for p, g in zip(problems, groups, strict=True)]
        if ro.difficulty_samples:
            for i, rate in enumerate(self._start_pass_rates(problems, prompt_ids, step, round)):
                info[i]["start_pass_rate"] = rate
        metrics = {**per_source("train", "correct_rate", problems, [np.mean([r > 0.5 for r in g]) for g in rewards]),
                   "train/grader_errors": errors, "train/grader_timeouts": timeouts,
                   "time/score_s": time.perf_counter() - t0,
                   **({"floor/sampler_min_valid_prob": min(sampler_floor)} if sampler_floor else {})}
        return Rollouts(
            prompt_ids=[[p] * len(g) for p, g in zip(prompt_ids, groups, strict=True)],
            response_ids=[[c.token_ids for c in g] for g in groups],
            loss_mask=[[[True] * len(c.token_ids) for c in g] for g in groups],
            logprobs=[[c.logprobs for c in g] for g in groups],
            rewards=rewards, correct=[[r > 0.5 for r in g] for g in rewards],
            num_tokens=sum(res.num_tokens for res in results),
            versions={res.adapter_version for res in results}, metrics=metrics,
            truncated=[[c.truncated for c in g] for g in groups],
            lengths=[[len(c.token_ids) for c in g] for g in groups],
            groups_info=info,
        )

    def _start_pass_rates(self, problems, prompt_ids: list[list[int]], step: int, round: int) -> list[float]:
        """Each problem's pass rate under the starting policy (the base model), from `rollout.difficulty_samples`
        samples of it seeded apart from training's (`difficulty_seed`): the composition's difficulty."""
        ctx, ro = self.ctx, self.ctx.cfg.rollout
        seeds = [difficulty_seed(ctx.cfg.seed, step, j, round) for j in range(ctx.engines.count)]
        results = sample(ctx, prompt_ids, n=ro.difficulty_samples, temperature=ro.temperature, seeds=seeds,
                         base=True)
        groups = [g for res in results for g in res.completions]
        return [float(np.mean([r > 0.5 for r in self._score(p, g).rewards]))
                for p, g in zip(problems, groups, strict=True)]

    def evaluate(self, step: int) -> HeldOut:
        """Held-out pass@1 / pass@k on the task's held-out problems."""
        cfg, ev = self.ctx.cfg, self.ctx.cfg.eval
        problems = self.ctx.task.heldout(ev.problems)
        if not problems:
            return HeldOut()
        t0 = time.perf_counter()
        _, results = self._completions(problems, step, cfg.seed + EVAL_SEED_OFFSET, ev.n, ev.temperature,
                                       phase="eval")
        groups = [g for res in results for g in res.completions]
        p1, pk, kept = [], [], []
        for prob, group in zip(problems, groups, strict=True):
            rewards = self._score(prob, group).rewards
            correct = sum(r > 0.5 for r in rewards)
            p1.append(correct / len(group))
            pk.append(pass_at_k(len(group), correct, ev.k))
            kept.append(SampleGroup(prob.id, prob.prompt, [c.token_ids for c in group], list(rewards),
                                    [r > 0.5 for r in rewards], _truncated(group)))
        return HeldOut({**per_source("eval", "pass@1", problems, p1),
                        "eval/pass@1": float(np.mean(p1)), "eval/pass@k": float(np.mean(pk)), "eval/k": ev.k,
                        "eval/problems": len(problems), "time/eval_s": time.perf_counter() - t0}, kept)


class EpisodeSource:
    """Levels -> `n` multi-turn episodes per level (a group plays one level) -> episode returns."""

    def __init__(self, ctx: TrialContext):
        self.ctx = ctx

    def collect(self, step: int, round: int = 0) -> Rollouts:
        cfg, task, ro = self.ctx.cfg, self.ctx.task, self.ctx.cfg.rollout
        levels = task.next_levels(ro.prompts_per_step)
        episodes = [task.episode(level, g, ro) for level in levels for g in range(ro.n)]
        prompts = [episodes[i * ro.n].prompt() for i in range(len(levels))]
        trajs, info = play_episodes(self.ctx, episodes, seed=cfg.seed, step=step, temperature=ro.temperature,
                                    round=round)
        groups = [trajs[i:i + ro.n] for i in range(0, len(trajs), ro.n)]

        def per_group(fn):
            return [[fn(t) for t in g] for g in groups]

        return Rollouts(
            prompt_ids=per_group(lambda t: t.prompt_ids), response_ids=per_group(lambda t: t.response_ids),
            loss_mask=per_group(lambda t: t.loss_mask), logprobs=per_group(lambda t: t.logprobs),
            rewards=per_group(lambda t: t.episode_return), correct=per_group(lambda t: t.success),
            num_tokens=info.num_tokens, versions=info.versions,
            metrics={**episode_metrics(trajs), "env/turns_max": info.turns},
            extra={"turn_rewards": per_group(lambda t: t.turn_rewards),
                   "reward_positions": per_group(lambda t: t.reward_positions),
                   "sampled_mask": per_group(lambda t: t.sampled_mask)},
            # out of context: at the limit, whatever its turns' lengths
            truncated=per_group(lambda t: t.truncated or t.hit_max_tokens),
            lengths=per_group(lambda t: ro.max_tokens if t.truncated else t.longest_turn),
            groups_info=[group_info(f"level-{lv}", p, [t.truncated for t in g])
                         for lv, p, g in zip(levels, prompts, groups, strict=True)],
        )

    def evaluate(self, step: int) -> HeldOut:
        """Validation success on a fixed set of validation levels that training never draws
        (`EnvTask.eval_levels`), `eval.n` episodes each, plus pass@k over them."""
        cfg, task, ev = self.ctx.cfg, self.ctx.task, self.ctx.cfg.eval
        t0 = time.perf_counter()
        levels = task.eval_levels(ev.problems)
        episodes = [task.episode(level, g, cfg.rollout) for level in levels for g in range(ev.n)]
        prompts = [episodes[i * ev.n].prompt() for i in range(len(levels))]
        trajs, _ = play_episodes(self.ctx, episodes, seed=cfg.seed + EVAL_SEED_OFFSET, step=step,
                                 temperature=ev.temperature, phase="eval")
        wins = [sum(t.success for t in trajs[i:i + ev.n]) for i in range(0, len(trajs), ev.n)]
        metrics = episode_metrics(trajs, prefix="eval")
        kept = [SampleGroup(f"level-{lv}", p, [t.response_ids for t in g], [t.episode_return for t in g],
                            [t.success for t in g], [t.truncated for t in g], [t.loss_mask for t in g])
                for lv, p, g in zip(levels, prompts, (trajs[i:i + ev.n] for i in range(0, len(trajs), ev.n)),
                                    strict=True)]
        return HeldOut({**metrics, "eval/pass@1": metrics["eval/success"],
                        "eval/pass@k": float(np.mean([pass_at_k(ev.n, c, ev.k) for c in wins])), "eval/k": ev.k,
                        "eval/problems": len(levels), "time/eval_s": time.perf_counter() - t0}, kept)


def _truncated(group: list[Completion]) -> list[bool]:
    """Which completions the token budget cut (vLLM's finish reason "length")."""
    return [c.truncated for c in group]


def rollout_source(ctx: TrialContext) -> RolloutSource:
    """The trial's source, chosen once from the task config: episodes for an agentic task, else single turn."""
    return EpisodeSource(ctx) if ctx.cfg.task.agentic else SingleTurnSource(ctx)
