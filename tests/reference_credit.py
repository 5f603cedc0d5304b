"""A slow, obviously-correct per-token reference of the credit stack (plain Python floats and loops).

It restates the paper's one-step algorithm literally, one group, one completion, one token at a time, so the
vectorised implementation in `workers.credit` can be checked against it.
"""

from __future__ import annotations


def ref_episode(rewards: list[float], mode: str, eps: float = 1e-6) -> list[float]:
    n = len(rewards)
    mean = sum(rewards) / n
    if all(r == rewards[0] for r in rewards):
        return [0.0] * n
    if mode == "grpo":
        return [r - mean for r in rewards]
    if mode == "maxrl":
        if mean <= eps:
            return [0.0] * n
        return [(r - mean) / (mean + eps) for r in rewards]
    raise ValueError(mode)


def ref_completion(
    adv: float, signal: list[float], plan: list[bool], stages: tuple[str, ...],
    beta: float, alpha: float, lam: float, clamp: float = 50.0,
) -> tuple[list[float], list[float]]:
    """One completion: returns (token advantages, signal after the stages)."""
    s = [min(x, clamp) for x in signal]
    a = [adv for _ in s]
    for stage in stages:
        if stage == "sepa":
            exec_idx = [t for t in range(len(s)) if not plan[t]]
            if exec_idx:
                mean_e = sum(s[t] for t in exec_idx) / len(exec_idx)
                for t in exec_idx:
                    s[t] = lam * mean_e + (1 - lam) * s[t]
        elif stage == "gtpo":
            if s:
                mean = sum(s) / len(s)
                for t in range(len(s)):
                    w = max(0.0, 1 + beta * (s[t] / mean - 1)) if mean > 0 else 1.0
                    a[t] = a[t] * w
        elif stage == "hicra":
            for t in range(len(s)):
                if plan[t]:
                    a[t] = a[t] + alpha * abs(a[t])
    return a, s


def ref_batch(
    rewards: list[list[float]], signals: list[list[list[float]]], plans: list[list[list[bool]]],
    mode: str, stages: tuple[str, ...], beta: float, alpha: float, lam: float, eps: float = 1e-6,
) -> tuple[list[list[list[float]]], list[list[list[float]]]]:
    """Ragged input: rewards[n][g], signals[n][g][t] (per-completion lengths), plans likewise."""
    advs, sigs = [], []
    for n, group in enumerate(rewards):
        ep = ref_episode(group, mode, eps)
        ga, gs = [], []
        for g in range(len(group)):
            a, s = ref_completion(ep[g], signals[n][g], plans[n][g], stages, beta, alpha, lam)
            ga.append(a)
            gs.append(s)
        advs.append(ga)
        sigs.append(gs)
    return advs, sigs


def ref_mean_var(values: list[float]) -> tuple[float, float]:
    if not values:
        return 0.0, 0.0
    m = sum(values) / len(values)
    return m, sum((v - m) ** 2 for v in values) / len(values)


def ref_stats(
    rewards: list[list[float]], signals: list[list[list[float]]], plans: list[list[list[bool]]],
    signals_after: list[list[list[float]]], kind: str = "surprisal", clamp: float = 50.0,
) -> dict[str, float]:
    """The batch diagnostics, token by token: skipped groups and exec/plan mean and variance before/after."""
    stats = {"groups_skipped": float(sum(all(r == g[0] for r in g) for g in rewards))}
    for name, want_plan in (("exec", False), ("plan", True)):
        before, after = [], []
        for n in range(len(signals)):
            for g in range(len(signals[n])):
                for t in range(len(signals[n][g])):
                    if plans[n][g][t] == want_plan:
                        before.append(min(signals[n][g][t], clamp))
                        after.append(signals_after[n][g][t])
        for when, vals in (("", before), ("_after", after)):
            m, v = ref_mean_var(vals)
            stats[f"{name}_{kind}_mean{when}"] = m
            stats[f"{name}_{kind}_var{when}"] = v
    return stats
