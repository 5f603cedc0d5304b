"""Credit-stack throughput: vectorised stack vs the per-token reference, in one process.

Batch: 256 completions x 2048 tokens (16 groups x 16 rollouts), maxrl + sepa_gtpo_hicra.
Also measures the planning mask on the same batch (target >= 2M tokens/s on one core).
Prints tokens/s of each and the vectorised/reference ratio last (target >= 100).

    python benchmarks/credit.py [--groups 16] [--group 16] [--tokens 2048] [--repeats 5]
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.reference_credit import ref_batch, ref_stats  # noqa: E402
from workers.credit import CreditConfig, SepaConfig, compute_advantages, planning_masks  # noqa: E402

N, G, T = 16, 16, 2048
WORDS = ["the", "sum", "is", "12", "+", "7", "=", "19", "so", "we", "carry", "one", "then", "divide", "by", "3", "."]
PHRASES = ["wait let me check", "notice that", "that's not right", "let me think", "the key insight is"]


def make_pieces(rng: random.Random, n_tokens: int) -> list[str]:
    """Word-ish pieces with occasional subword splits and strategic phrases (about 3% planning tokens)."""
    pieces: list[str] = []
    while len(pieces) < n_tokens:
        if rng.random() < 0.01:
            for w in rng.choice(PHRASES).split():
                pieces.append(" " + w)
        else:
            w = rng.choice(WORDS)
            if len(w) > 3 and rng.random() < 0.3:
                pieces.extend([" " + w[:2], w[2:]])
            else:
                pieces.append(" " + w)
    return pieces[:n_tokens]


def best_of(fn, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--groups", type=int, default=N, help="prompt groups in the batch")
    ap.add_argument("--group", type=int, default=G, help="rollouts per group")
    ap.add_argument("--tokens", type=int, default=T, help="tokens per completion")
    ap.add_argument("--repeats", type=int, default=5, help="vectorised timings (best of); the mask: best of 3")
    args = ap.parse_args()
    n, g, t = args.groups, args.group, args.tokens
    if "BENCH_THREADS" in os.environ:  # default: torch's own choice (all cores); BENCH_THREADS=1 for one core
        torch.set_num_threads(int(os.environ["BENCH_THREADS"]))
    print(f"torch threads: {torch.get_num_threads()} (the reference and the planning mask are single-threaded Python)")
    rng = random.Random(0)
    gen = torch.Generator().manual_seed(0)
    n_tok = n * g * t
    rewards = (torch.rand(n, g, generator=gen) < 0.4).float()
    signals = torch.rand(n, g, t, generator=gen) * 2
    mask = torch.ones(n, g, t, dtype=torch.bool)
    pieces = [make_pieces(rng, t) for _ in range(n * g)]

    t_plan = best_of(lambda: planning_masks(pieces, t), min(3, args.repeats))
    planning = planning_masks(pieces, t).reshape(n, g, t)
    print(f"planning mask:  {n_tok / t_plan / 1e6:8.2f} M tokens/s  (planning fraction {planning.float().mean():.3f})")

    cfg = CreditConfig(advantage_mode="maxrl", transform_mode="sepa_gtpo_hicra", sepa=SepaConfig())
    t_vec = best_of(lambda: compute_advantages(rewards, signals, mask, cfg, planning=planning, sepa_lambda=0.5), args.repeats)

    r_list, s_list, p_list = rewards.tolist(), signals.tolist(), planning.tolist()
    t0 = time.perf_counter()
    ref_adv, ref_sig = ref_batch(r_list, s_list, p_list, "maxrl", cfg.stages, cfg.gtpo_beta, cfg.hicra_alpha, 0.5)
    ref_stats(r_list, s_list, p_list, ref_sig)  # the reference does the same work: advantages + diagnostics
    t_ref = time.perf_counter() - t0

    got = compute_advantages(rewards, signals, mask, cfg, planning=planning, sepa_lambda=0.5).token_advantages
    err = (got - torch.tensor(ref_adv)).abs().max().item()
    print(f"vectorised:     {n_tok / t_vec / 1e6:8.2f} M tokens/s  ({t_vec * 1e3:.1f} ms)")
    print(f"reference:      {n_tok / t_ref / 1e6:8.2f} M tokens/s  ({t_ref * 1e3:.1f} ms), max abs diff {err:.2e}")
    print(f"ratio vectorised/reference: {t_ref / t_vec:.1f}")


if __name__ == "__main__":
    main()
