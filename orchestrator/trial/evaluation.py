"""Held-out evaluation of the current policy: pass@1 and the unbiased pass@k, on the rollout workers.

Single-turn tasks: the task's held-out problems. Agentic tasks: a fixed set of validation level seeds that
training never draws (`EnvTask.eval_levels`), `eval.n` episodes each; `eval/success` is the mean success."""

from __future__ import annotations

import time

import numpy as np

from orchestrator.config.trial import TrialConfig
from orchestrator.trial.sampling import sample, step_seed
from workers.envs.tokens import first_prompt_ids


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples with c correct: 1 - C(n - c, k) / C(n, k)."""
    if n - c < k:
        return 1.0
    return 1.0 - float(np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))


def evaluate(cfg: TrialConfig, step: int, workers, tokenizer, task, actions) -> dict:
    """Held-out pass@1 / pass@k of the current policy. Own sampling seeds and no task cursor: training's data
    order and randomness are untouched, so resumes stay equivalent."""
    if cfg.task.agentic:
        return evaluate_episodes(cfg, step, workers, tokenizer, task)
    ev = cfg.eval
    problems = task.heldout(ev.problems)
    if not problems:
        return {}
    t0 = time.perf_counter()
    prompt_ids = [first_prompt_ids(tokenizer, p.prompt) for p in problems]  # as in training
    seeds = [step_seed(cfg.seed + 104_729, step, j) for j in range(len(workers))]
    results = sample(cfg, workers, prompt_ids, n=ev.n, temperature=ev.temperature, seeds=seeds,
                      tokenizer=tokenizer, actions=actions)
    groups = [g for res in results for g in res["completions"]]
    p1, pk = [], []
    for prob, group in zip(problems, groups, strict=True):
        texts = [tokenizer.decode(c["token_ids"], skip_special_tokens=True) for c in group]
        correct = sum(r > 0.5 for r in task.score([prob] * len(group), texts).rewards)
        p1.append(correct / len(group))
        pk.append(pass_at_k(len(group), correct, ev.k))
    return {"eval/pass@1": float(np.mean(p1)), "eval/pass@k": float(np.mean(pk)), "eval/k": ev.k,
            "eval/problems": len(problems), "time/eval_s": time.perf_counter() - t0}


def evaluate_episodes(cfg: TrialConfig, step: int, workers, tokenizer, task) -> dict:
    """Validation success of the current policy on the fixed validation levels (+ pass@k over `eval.n`)."""
    from orchestrator.trial.episodes import episode_metrics, play_episodes

    ev = cfg.eval
    t0 = time.perf_counter()
    levels = task.eval_levels(ev.problems)
    episodes = [task.episode(level, g, cfg.rollout) for level in levels for g in range(ev.n)]
    trajs, _ = play_episodes(cfg, workers, tokenizer, episodes, seed=cfg.seed + 104_729, step=step,
                             temperature=ev.temperature)
    wins = [sum(t.success for t in trajs[i:i + ev.n]) for i in range(0, len(trajs), ev.n)]
    metrics = episode_metrics(trajs, prefix="eval")
    return {**metrics, "eval/pass@1": metrics["eval/success"],
            "eval/pass@k": float(np.mean([pass_at_k(ev.n, c, ev.k) for c in wins])), "eval/k": ev.k,
            "eval/problems": len(levels), "time/eval_s": time.perf_counter() - t0}
