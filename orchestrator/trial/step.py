"""One training step's pieces, shared by the sync loop (`one_step`) and one_step_off (orchestrator/trial/one_step_off.py):
collect (prompts -> completions -> rewards, or levels -> episodes -> returns) -> prepare (check the adapter,
drop uninformative / non-finite groups, build the row and the learner batch) -> train -> absorb (SEPA observes
the step) -> push_policy (the new policy to every worker)."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import torch

from orchestrator.config.trial import TrialConfig
from orchestrator.trial.episodes import episode_metrics, play_episodes
from orchestrator.trial.sampling import sample, step_seed
from workers.credit import SepaController
from workers.envs.tokens import first_prompt_ids
from workers.learner.inputs import LearnerBatch, StepResult
from workers.objectives.filters import nonfinite_groups, rv_filter


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


def _collect_single_turn(cfg: TrialConfig, step: int, workers, tokenizer, task, actions) -> Rollouts:
    """Prompts -> one completion per sample -> the task's binary rewards."""
    ro = cfg.rollout
    problems = task.next_batch(ro.prompts_per_step)
    prompt_ids = [first_prompt_ids(tokenizer, p.prompt) for p in problems]  # the chat template when there is one
    results = sample(cfg, workers, prompt_ids, n=ro.n, temperature=ro.temperature,
                     seeds=[step_seed(cfg.seed, step, j) for j in range(len(workers))], tokenizer=tokenizer,
                     actions=actions)
    groups = [g for res in results for g in res["completions"]]
    sampler_floor = [math.exp(lp) for g in groups for c in g for lp in c.get("action_logprobs", {}).values()]
    t0 = time.perf_counter()
    rewards, errors, timeouts = [], 0, 0
    for prob, group in zip(problems, groups, strict=True):
        texts = [tokenizer.decode(c["token_ids"], skip_special_tokens=True) for c in group]
        scored = task.score([prob] * len(group), texts)
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
    )


def _collect_episodes(cfg: TrialConfig, step: int, workers, tokenizer, task) -> Rollouts:
    """Levels -> `n` multi-turn episodes per level (a group plays one level) -> episode returns."""
    ro = cfg.rollout
    levels = task.next_levels(ro.prompts_per_step)
    episodes = [task.episode(level, g, ro) for level in levels for g in range(ro.n)]
    trajs, info = play_episodes(cfg, workers, tokenizer, episodes, seed=cfg.seed, step=step,
                                temperature=ro.temperature)
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
    )


def collect(cfg: TrialConfig, step: int, workers, tokenizer, task, actions: list[int] | None) -> Rollouts:
    """One step's groups (single-turn or episodes); `time/generate_s` (scoring excluded) in its metrics."""
    t0 = time.perf_counter()
    if cfg.task.agentic:
        roll = _collect_episodes(cfg, step, workers, tokenizer, task)
    else:
        roll = _collect_single_turn(cfg, step, workers, tokenizer, task, actions)
    roll.metrics["time/generate_s"] = time.perf_counter() - t0 - roll.metrics.get("time/score_s", 0.0)
    return roll


def prepare(cfg: TrialConfig, step: int, roll: Rollouts, sepa: SepaController, version: int,
             actions: list[int] | None) -> tuple[dict, LearnerBatch | None, float]:
    """Check the adapter `roll` was sampled with (`version`), drop uninformative groups, and build the step's
    row and learner batch (None when no group is kept). Returns (row, batch, correct rate)."""
    ro = cfg.rollout
    expected = version or None
    if roll.versions - {expected}:
        raise RuntimeError(f"a rollout worker sampled with adapter {sorted(roll.versions - {expected}, key=str)}, "
                           f"expected {expected}")
    finite = nonfinite_groups(roll.rewards, roll.logprobs, roll.loss_mask)  # NaN/inf never reach the learner
    rewards = finite.rewards  # a dropped group's rewards count as 0 in the statistics below
    flat = [r for g in rewards for r in g]
    correct_rate = sum(c for g in roll.correct for c in g) / len(flat)
    rv = cfg.interventions.rv_filter
    filtered = rv_filter(torch.tensor(rewards, dtype=torch.float64), rv)  # keeps everything unless enabled
    uniform = [len(set(g)) == 1 and i not in finite.bad for i, g in enumerate(rewards)]
    keep = [i for i in filtered.keep if i not in finite.bad and not (ro.skip_uninformative and uniform[i])]

    lam = sepa.lambda_for(step)
    metrics = dict(roll.metrics)
    t_gen = metrics.pop("time/generate_s")
    row: dict = {
        "step": step,
        "train/correct_rate": correct_rate,
        "train/reward_mean": sum(flat) / len(flat),
        "train/groups_kept": len(keep),
        "train/groups_skipped_all_correct": sum(1 for i, u in enumerate(uniform)
                                                if ro.skip_uninformative and u and all(roll.correct[i])),
        "train/groups_skipped_all_wrong": sum(1 for i, u in enumerate(uniform)
                                              if ro.skip_uninformative and u and not all(roll.correct[i])),
        "train/completion_len": roll.num_tokens / len(flat),
        "rollout/tokens_per_s": roll.num_tokens / max(t_gen, 1e-9),
        "rollout/adapter_version": version,
        "credit/sepa_lambda": lam,
        "credit/sepa_gate_open": float(sepa.gate_open),
        **(filtered.metrics if rv.enabled else {}),
        **finite.metrics,
        **metrics,
        "time/generate_s": t_gen,
    }
    if not keep:
        return row, None, correct_rate

    def rows(groups):
        return [x for i in keep for x in groups[i]]

    batch = LearnerBatch(
        prompt_ids=rows(roll.prompt_ids), response_ids=rows(roll.response_ids),
        loss_mask=rows(roll.loss_mask), rollout_logprobs=rows(roll.logprobs),
        rewards=[rewards[i] for i in keep],
        temperature=ro.temperature, sepa_lambda=lam, step=step,
        loss_scale=filtered.loss_scale, action_token_ids=actions, tis_cap=ro.tis_cap,
        want_uncertainty="sepa" in cfg.credit.stages,  # the report's mechanistic histogram
        reward_positions=rows(roll.extra["reward_positions"]) if "reward_positions" in roll.extra else None,
        turn_rewards=rows(roll.extra["turn_rewards"]) if "turn_rewards" in roll.extra else None,
    )
    return row, batch, correct_rate


def absorb(row: dict, out: StepResult | None, sepa: SepaController, correct_rate: float) -> None:
    """The learner's result into the row (metrics, uncertainty samples); SEPA observes the step."""
    exec_values = None
    if out is not None:
        row.update(out.metrics)
        exec_values = out.exec_values
        row["_uncertainty"] = out.uncertainty
    sepa.observe(correct_rate, exec_values)


def push_policy(learner, workers, version: int) -> int:
    """The learner's policy (adapter or full weights) as `version` on every worker; returns `version`."""
    return learner.push_policy(workers, version)


def one_step(cfg: TrialConfig, step: int, workers, learner, tokenizer, task, sepa: SepaController,
              version: int, actions: list[int] | None = None) -> dict:
    """Collect (single-turn or episodes) -> drop uninformative groups -> train -> push the new adapter."""
    roll = collect(cfg, step, workers, tokenizer, task, actions)
    row, batch, correct_rate = prepare(cfg, step, roll, sepa, version, actions)
    t0 = time.perf_counter()
    out = learner.train_step(batch) if batch is not None else None
    absorb(row, out, sepa, correct_rate)
    row["time/train_s"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    if batch is not None:  # a new policy only when the learner stepped
        version = push_policy(learner, workers, version + 1)
    row["time/sync_s"] = time.perf_counter() - t0
    row["_version"] = version
    return row
