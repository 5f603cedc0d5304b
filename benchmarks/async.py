"""Throughput of bounded-staleness rollouts on the same trial (the same actors, alternating blocks): `rollout.mode:
async` with max_staleness k for each `--ks` (default 0 1 2 4; k = 0 is `sync`, k = 1 `one_step_off`).

Each block runs `--steps` loop iterations of one k as run_trial runs them (benchmarks/_stack.py) after one
unmeasured iteration (a block starts by sampling its first batches unoverlapped; the batches another block
sampled ahead are dropped); blocks cycle through the ks `--blocks` times so all see the same background load.
Reports steps/s, the median generation and training time, and the learner's idle share of each k: the share of
the step's wall the learner was not computing, its compute taken as k = 0's median submit -> result time.

On a CPU box the rollout worker and the learner share the same cores, so overlapping them mostly trades one
for the other: the ratio measures how much of the step was idle waiting (Ray round trips, scoring, the driver),
not the GPU gain. On a GPU machine (worker and learner on their own GPUs) this is the command to run; peers
report +23-40% for one-step-off at scale. Measured on 2 cores: 0.79-0.93 with vLLM in its own processes (the
one_step_off default, orchestrator/trial/actors/start.py:rollout_engine); 0.24 with vLLM inside the rollout actor, whose CPU
worker and the learner then fight over the same cores. This driver samples one step's batch per step once its
queue is full, so k > 1 adds no overlap beyond k = 1's (its use is the variance of generation time, and what it
does to the data: docs/guides/staleness.md). Prints the ratio of the largest k's steps/s to k = 0's last.

    python benchmarks/async.py [--ks 0 1 2 4] [--steps 4] [--blocks 2] [--prompts 16] [--n 16] [--max-tokens 48]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._stack import Stack, init_ray  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=4, help="measured steps per block")
    ap.add_argument("--blocks", type=int, default=2, help="rounds of one block per k")
    ap.add_argument("--ks", type=int, nargs="+", default=[0, 1, 2, 4], help="max_staleness values (0 first)")
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--n", type=int, default=16, help="samples per prompt")
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--model", default="tiny")
    args = ap.parse_args()

    import ray

    from orchestrator.config.trial import TrialConfig

    cfg = TrialConfig(
        name="bench_async", steps=100_000, model={"name": args.model, "max_model_len": 128},
        task={"name": "arithmetic", "max_operand": 4}, eval={"every": 0},
        rollout={"num_workers": 1, "prompts_per_step": args.prompts, "n": args.n, "max_tokens": args.max_tokens,
                 "skip_uninformative": False, "mode": "one_step_off"},
        credit={"advantage_mode": "grpo", "transform_mode": "none"},
    )
    init_ray()
    from orchestrator.trial.step.sequence import TrainingStep
    from orchestrator.trial.step.staleness import Admission

    stack = Stack(cfg)
    ks = list(dict.fromkeys(args.ks))
    for k in ks:  # as run_trial's step under rollout.mode async, max_staleness k (paced)
        stack.steps[f"k{k}"] = TrainingStep(stack.ctx, stack.source, admission=Admission(bound=k, log=True))
    walls: dict[int, list[float]] = {k: [] for k in ks}
    parts: dict[int, list[tuple[float, float, float]]] = {k: [] for k in ks}
    try:
        for _ in range(args.blocks):
            for k in ks:
                for step in stack.steps.values():  # another block's batches were sampled with older policies
                    step.pending = None
                stack.step(f"k{k}")  # unmeasured: the block's first batches, sampled unoverlapped
                for _ in range(args.steps):
                    wall, row = stack.step(f"k{k}")
                    walls[k].append(wall)
                    parts[k].append((row["time/generate_s"], row["time/train_s"], wall))
                    print(f"k={k} step {row['step']}: {wall:.3f} s (generate {row['time/generate_s']:.3f}, train "
                          f"{row['time/train_s']:.3f}, staleness {row['rollout/staleness']})", flush=True)
    finally:
        stack.close()
        ray.shutdown()
    rate = {k: len(w) / sum(w) for k, w in walls.items()}
    # the learner's compute per step: k = 0's submit -> result, where nothing else runs meanwhile
    busy = statistics.median(p[1] for p in parts[0]) if 0 in parts else float("nan")
    for k in ks:
        g, t = (statistics.median(p[i] for p in parts[k]) for i in range(2))
        idle = statistics.median(max(0.0, p[2] - busy) / p[2] for p in parts[k])
        print(f"k={k:<3d} {rate[k]:.3f} steps/s  (median step {statistics.median(walls[k]):.3f} s; generate {g:.3f} s, "
              f"train {t:.3f} s{' incl. the overlapped generation' if k else ''}; learner idle {idle:.0%})")
    print(f"ratio k{ks[-1]}/k{ks[0]} steps/s: {rate[ks[-1]] / rate[ks[0]]:.3f}")

if __name__ == "__main__":
    main()
