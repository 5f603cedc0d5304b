"""Credit-stack throughput: vectorised stack vs the per-token reference, in one process.

Batch: 256 completions x 2048 tokens (16 groups x 16 rollouts), maxrl + sepa_gtpo_hicra.
Also measures the planning mask on the same batch (target >= 2M tokens/s on one core).

Both sides run on one thread (`--threads`, $BENCH_THREADS) and are timed in CPU seconds of this process
(`time.process_time`): other processes loading the machine slow the wall clock, not the work, so the figure does
not follow the load (with torch's own thread count and wall time the ratio read 1.6 .. 170 on a busy 2-core
machine). `--repeats` interleaved pairs (the order flipped every pair; a vectorised time is the median of 5
calls); each side's median and spread, and last the median of the pairs' ratios with their spread (about 50 on
one thread of the 2-core dev machine, loaded or not: docs/credit.md; a regression reads well below 40).

    python benchmarks/credit.py [--groups 16] [--group 16] [--tokens 2048] [--repeats 7] [--threads 1]
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._timing import fix_threads, spread  # noqa: E402
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


def cpu_seconds(fn) -> float:
    t0 = time.process_time()
    fn()
    return time.process_time() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--groups", type=int, default=N, help="prompt groups in the batch")
    ap.add_argument("--group", type=int, default=G, help="rollouts per group")
    ap.add_argument("--tokens", type=int, default=T, help="tokens per completion")
    ap.add_argument("--repeats", type=int, default=7, help="interleaved vectorised/reference pairs (and mask runs)")
    ap.add_argument("--threads", type=int, help="torch threads (default $BENCH_THREADS, else 1)")
    args = ap.parse_args()
    n, g, t = args.groups, args.group, args.tokens
    threads = fix_threads(args.threads)
    print(f"torch threads: {threads} (the reference and the planning mask are single-threaded Python); "
          "times: CPU seconds of this process")
    rng = random.Random(0)
    gen = torch.Generator().manual_seed(0)
    n_tok = n * g * t
    rewards = (torch.rand(n, g, generator=gen) < 0.4).float()
    signals = torch.rand(n, g, t, generator=gen) * 2
    mask = torch.ones(n, g, t, dtype=torch.bool)
    pieces = [make_pieces(rng, t) for _ in range(n * g)]

    t_plan = [cpu_seconds(lambda: planning_masks(pieces, t)) for _ in range(args.repeats)]
    planning = planning_masks(pieces, t).reshape(n, g, t)
    print(f"planning mask:  {n_tok / statistics.median(t_plan) / 1e6:8.2f} M tokens/s  (planning fraction "
          f"{planning.float().mean():.3f}; s {spread(t_plan)})")

    cfg = CreditConfig(advantage_mode="maxrl", transform_mode="sepa_gtpo_hicra", sepa=SepaConfig())
    r_list, s_list, p_list = rewards.tolist(), signals.tolist(), planning.tolist()

    def vectorised() -> float:
        return statistics.median(cpu_seconds(lambda: compute_advantages(
            rewards, signals, mask, cfg, planning=planning, sepa_lambda=0.5)) for _ in range(5))

    def reference() -> float:
        def run():
            ref_sig = ref_batch(r_list, s_list, p_list, "maxrl", cfg.stages, cfg.gtpo_beta, cfg.hicra_alpha, 0.5)[1]
            ref_stats(r_list, s_list, p_list, ref_sig)  # the reference does the same work: advantages + diagnostics
        return cpu_seconds(run)

    vectorised()  # warm-up
    t_vec, t_ref = [], []
    for rep in range(args.repeats):
        if rep % 2:
            t_ref.append(reference())
            t_vec.append(vectorised())
        else:
            t_vec.append(vectorised())
            t_ref.append(reference())

    ref_adv = ref_batch(r_list, s_list, p_list, "maxrl", cfg.stages, cfg.gtpo_beta, cfg.hicra_alpha, 0.5)[0]
    got = compute_advantages(rewards, signals, mask, cfg, planning=planning, sepa_lambda=0.5).token_advantages
    err = (got - torch.tensor(ref_adv)).abs().max().item()
    ratios = [r / v for r, v in zip(t_ref, t_vec, strict=True)]
    for name, times in (("vectorised", t_vec), ("reference", t_ref)):
        print(f"{name + ':':15s} {n_tok / statistics.median(times) / 1e6:8.2f} M tokens/s  "
              f"(ms {spread([1e3 * x for x in times])})")
    print(f"max abs diff of the advantages: {err:.2e}")
    print(f"ratio vectorised/reference: {statistics.median(ratios):.1f} (median of {len(ratios)} interleaved pairs; "
          f"min {min(ratios):.1f} .. max {max(ratios):.1f})")


if __name__ == "__main__":
    main()
