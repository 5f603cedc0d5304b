"""Held-out evaluation of the current policy: pass@1 and the unbiased pass@k, on the rollout workers."""

from __future__ import annotations

import time

import numpy as np

from orchestrator.config import TrialConfig
from orchestrator.sampling import sample, step_seed


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples with c correct: 1 - C(n - c, k) / C(n, k)."""
    if n - c < k:
        return 1.0
    return 1.0 - float(np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))


def evaluate(cfg: TrialConfig, step: int, workers, tokenizer, task, actions) -> dict:
    """Held-out pass@1 / pass@k of the current policy. Own sampling seeds and no task cursor: training's data
    order and randomness are untouched, so resumes stay equivalent."""
    ev = cfg.eval
    problems = task.heldout(ev.problems)
    if not problems:
        return {}
    t0 = time.perf_counter()
    prompt_ids = [tokenizer(p.prompt)["input_ids"] for p in problems]
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
