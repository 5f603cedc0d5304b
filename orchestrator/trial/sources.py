"""Where a trial's samples come from: the rollout-source interface and its two implementations.

A source turns the task into one step's groups of samples (`collect`) and measures the current policy on the
task's held-out set (`evaluate`). The step loop (step.py, one_step_off.py) only asks a source for a batch and
never branches on the kind of task; `rollout_source` picks the source once per trial. A new kind of task plugs
in here: implement the two methods of `RolloutSource` and return it from `rollout_source`.

- `SingleTurnSource`: prompts -> `rollout.n` completions each -> the task's rewards (a group shares a prompt).
- `EpisodeSource` (agentic tasks): levels -> `rollout.n` multi-turn episodes each -> episode returns (a group
  plays one level; orchestrator/trial/episodes.py plays them).

Both keep training's randomness a pure function of (seed, step): sampling seeds come from `step_seed`, the task
cursor advances once per `collect`, and `evaluate` uses its own seeds and no cursor, so resumes stay equivalent.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from orchestrator.trial.context import TrialContext
from orchestrator.trial.episodes import episode_metrics, play_episodes
from orchestrator.trial.evaluation import pass_at_k
from orchestrator.trial.samples import SampleGroup, group_info
from orchestrator.trial.sampling import sample, step_seed
from workers.envs.tokens import first_prompt_ids

EVAL_SEED_OFFSET = 104_729  # held-out sampling seeds: trial seed + this, never training's


@dataclass
class Rollouts:
    """One step's samples in groups (group i shares a prompt or a level). Lists are `[N][G][*]` / `[N][G]`;
    response ids, loss mask and log-probs are aligned (single-turn: the completion, all in the loss mask)."""

    prompt_ids: list[list[list[int]]]
    response_ids: list[list[list[int]]]
    loss_mask: list[list[list[bool]]]
    logprobs: list[list[list[float]]]
    rewards: list[list[float]]
    correct: list[list[bool]]
    num_tokens: int
    versions: set
    metrics: dict
    extra: dict = field(default_factory=dict)  # per-sequence extras for the learner ([N][G][*] lists)
    groups_info: list[dict] = field(default_factory=list)  # [N] per-group metadata (samples.py: group_info)


class RolloutSource(Protocol):
    """One kind of task's way to produce training samples and a held-out score."""

    def collect(self, step: int) -> Rollouts:
        """Step `step`'s groups, sampled with the adapter the workers hold now. `versions` holds every adapter
        version the workers reported; `metrics` goes into the step's row (time spent scoring, if any, as
        `time/score_s`: it is excluded from `time/generate_s`)."""
        ...

    def evaluate(self, step: int) -> dict:
        """Held-out metrics of the current policy (`eval/pass@1`, `eval/pass@k`, `eval/k`, `eval/problems`,
        `time/eval_s`, ...) and its generations under `_samples` (a list of `SampleGroup`, popped by the loop);
        {} when the task has no held-out set. Must not move the training task cursor."""
        ...


class SingleTurnSource:
    """Prompts -> one completion per sample -> the task's binary rewards."""

    def __init__(self, ctx: TrialContext):
        self.ctx = ctx

    def _completions(self, problems, step: int, seed: int, n: int, temperature: float):
        """The prompts' ids (the chat template when there is one) and the sampler's results, per shard."""
        ctx = self.ctx
        prompt_ids = [first_prompt_ids(ctx.tokenizer, p.prompt) for p in problems]
        seeds = [step_seed(seed, step, j) for j in range(len(ctx.workers))]
        return prompt_ids, sample(ctx, prompt_ids, n=n, temperature=temperature, seeds=seeds)

    def _score(self, prob, group: list[dict]):
        texts = [self.ctx.tokenizer.decode(c["token_ids"], skip_special_tokens=True) for c in group]
        return self.ctx.task.score([prob] * len(group), texts)

    def collect(self, step: int) -> Rollouts:
        cfg, ro = self.ctx.cfg, self.ctx.cfg.rollout
        problems = self.ctx.task.next_batch(ro.prompts_per_step)
        prompt_ids, results = self._completions(problems, step, cfg.seed, ro.n, ro.temperature)
        groups = [g for res in results for g in res["completions"]]
        sampler_floor = [math.exp(lp) for g in groups for c in g for lp in c.get("action_logprobs", {}).values()]
        t0 = time.perf_counter()
        rewards, errors, timeouts = [], 0, 0
        for prob, group in zip(problems, groups, strict=True):
            scored = self._score(prob, group)
            rewards.append(scored.rewards)
            errors, timeouts = errors + scored.grader_errors, timeouts + scored.grader_timeouts
        metrics = {"train/grader_errors": errors, "train/grader_timeouts": timeouts,
                   "time/score_s": time.perf_counter() - t0,
                   **({"floor/sampler_min_valid_prob": min(sampler_floor)} if sampler_floor else {})}
        return Rollouts(
            prompt_ids=[[p] * len(g) for p, g in zip(prompt_ids, groups, strict=True)],
            response_ids=[[c["token_ids"] for c in g] for g in groups],
            loss_mask=[[[True] * len(c["token_ids"]) for c in g] for g in groups],
            logprobs=[[c["logprobs"] for c in g] for g in groups],
            rewards=rewards, correct=[[r > 0.5 for r in g] for g in rewards],
            num_tokens=sum(res["num_tokens"] for res in results),
            versions={res["adapter_version"] for res in results}, metrics=metrics,
            groups_info=[group_info(p.id, p.prompt, _truncated(g)) for p, g in zip(problems, groups, strict=True)],
        )

    def evaluate(self, step: int) -> dict:
        """Held-out pass@1 / pass@k on the task's held-out problems."""
        cfg, ev = self.ctx.cfg, self.ctx.cfg.eval
        problems = self.ctx.task.heldout(ev.problems)
        if not problems:
            return {}
        t0 = time.perf_counter()
        _, results = self._completions(problems, step, cfg.seed + EVAL_SEED_OFFSET, ev.n, ev.temperature)
        groups = [g for res in results for g in res["completions"]]
        p1, pk, kept = [], [], []
        for prob, group in zip(problems, groups, strict=True):
            rewards = self._score(prob, group).rewards
            correct = sum(r > 0.5 for r in rewards)
            p1.append(correct / len(group))
            pk.append(pass_at_k(len(group), correct, ev.k))
            kept.append(SampleGroup(prob.id, prob.prompt, [c["token_ids"] for c in group], list(rewards),
                                    [r > 0.5 for r in rewards], _truncated(group)))
        return {"eval/pass@1": float(np.mean(p1)), "eval/pass@k": float(np.mean(pk)), "eval/k": ev.k,
                "eval/problems": len(problems), "time/eval_s": time.perf_counter() - t0, "_samples": kept}


class EpisodeSource:
    """Levels -> `n` multi-turn episodes per level (a group plays one level) -> episode returns."""

    def __init__(self, ctx: TrialContext):
        self.ctx = ctx

    def collect(self, step: int) -> Rollouts:
        cfg, task, ro = self.ctx.cfg, self.ctx.task, self.ctx.cfg.rollout
        levels = task.next_levels(ro.prompts_per_step)
        episodes = [task.episode(level, g, ro) for level in levels for g in range(ro.n)]
        prompts = [episodes[i * ro.n].prompt() for i in range(len(levels))]
        trajs, info = play_episodes(self.ctx, episodes, seed=cfg.seed, step=step, temperature=ro.temperature)
        groups = [trajs[i:i + ro.n] for i in range(0, len(trajs), ro.n)]

        def per_group(fn):
            return [[fn(t) for t in g] for g in groups]

        return Rollouts(
            prompt_ids=per_group(lambda t: t.prompt_ids), response_ids=per_group(lambda t: t.response_ids),
            loss_mask=per_group(lambda t: t.loss_mask), logprobs=per_group(lambda t: t.logprobs),
            rewards=per_group(lambda t: t.episode_return), correct=per_group(lambda t: t.success),
            num_tokens=info["num_tokens"], versions=info["versions"],
            metrics={**episode_metrics(trajs), "env/turns_max": info["turns"]},
            extra={"turn_rewards": per_group(lambda t: t.turn_rewards),
                   "reward_positions": per_group(lambda t: t.reward_positions)},
            groups_info=[group_info(f"level-{lv}", p, [t.truncated for t in g])
                         for lv, p, g in zip(levels, prompts, groups, strict=True)],
        )

    def evaluate(self, step: int) -> dict:
        """Validation success on a fixed set of validation levels that training never draws
        (`EnvTask.eval_levels`), `eval.n` episodes each, plus pass@k over them."""
        cfg, task, ev = self.ctx.cfg, self.ctx.task, self.ctx.cfg.eval
        t0 = time.perf_counter()
        levels = task.eval_levels(ev.problems)
        episodes = [task.episode(level, g, cfg.rollout) for level in levels for g in range(ev.n)]
        prompts = [episodes[i * ev.n].prompt() for i in range(len(levels))]
        trajs, _ = play_episodes(self.ctx, episodes, seed=cfg.seed + EVAL_SEED_OFFSET, step=step,
                                 temperature=ev.temperature)
        wins = [sum(t.success for t in trajs[i:i + ev.n]) for i in range(0, len(trajs), ev.n)]
        metrics = episode_metrics(trajs, prefix="eval")
        kept = [SampleGroup(f"level-{lv}", p, [t.response_ids for t in g], [t.episode_return for t in g],
                            [t.success for t in g], [t.truncated for t in g], [t.loss_mask for t in g])
                for lv, p, g in zip(levels, prompts, (trajs[i:i + ev.n] for i in range(0, len(trajs), ev.n)),
                                    strict=True)]
        return {**metrics, "eval/pass@1": metrics["eval/success"],
                "eval/pass@k": float(np.mean([pass_at_k(ev.n, c, ev.k) for c in wins])), "eval/k": ev.k,
                "eval/problems": len(levels), "time/eval_s": time.perf_counter() - t0, "_samples": kept}


def _truncated(group: list[dict]) -> list[bool]:
    """Which completions the token budget cut (vLLM's finish reason "length")."""
    return [c.get("finish_reason") == "length" for c in group]


def rollout_source(ctx: TrialContext) -> RolloutSource:
    """The trial's source, chosen once from the task config: episodes for an agentic task, else single turn."""
    return EpisodeSource(ctx) if ctx.cfg.task.agentic else SingleTurnSource(ctx)
