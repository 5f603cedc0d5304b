"""Throughput of `rollout.mode: sync` vs `one_step_off` on the same trial (the same actors, alternating blocks).

Each block runs `--steps` loop iterations of one mode as run_trial runs them (benchmarks/_stack.py) after one
unmeasured iteration (a one_step_off block starts by generating its first batch unoverlapped; a sync block drops
the prefetched one); blocks alternate sync / one_step_off `--blocks` times so both see the same background load.
Reports steps/s and the median generation and training time of each mode.

On a CPU box the rollout worker and the learner share the same cores, so overlapping them mostly trades one
for the other: the ratio measures how much of the step was idle waiting (Ray round trips, scoring, the driver),
not the GPU gain. On a GPU machine (worker and learner on their own GPUs) this is the command to run; peers
report +23-40% for one-step-off at scale. Measured on 2 cores: 0.79-0.93 with vLLM in its own processes (the
one_step_off default, orchestrator/trial/actors/start.py:rollout_engine); 0.24 with vLLM inside the rollout actor, whose CPU
worker and the learner then fight over the same cores. Prints the ratio one_step_off / sync steps/s last.

    python benchmarks/async.py [--steps 4] [--blocks 2] [--prompts 16] [--n 16] [--max-tokens 48] [--model tiny]
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
    ap.add_argument("--blocks", type=int, default=2, help="sync + one_step_off block pairs")
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
    stack = Stack(cfg)
    walls: dict[str, list[float]] = {"sync": [], "one_step_off": []}
    parts: dict[str, list[tuple[float, float]]] = {"sync": [], "one_step_off": []}
    try:
        for block in range(2 * args.blocks):
            mode = "sync" if block % 2 == 0 else "one_step_off"
            stack.step(mode)  # unmeasured: first batch of a one_step_off block / switch
            for _ in range(args.steps):
                wall, row = stack.step(mode)
                walls[mode].append(wall)
                parts[mode].append((row["time/generate_s"], row["time/train_s"]))
                extra = f", staleness {row['rollout/staleness']}" if mode == "one_step_off" else ""
                print(f"{mode:12s} step {row['step']}: {wall:.3f} s (generate {row['time/generate_s']:.3f}, train "
                      f"{row['time/train_s']:.3f}{extra})", flush=True)
    finally:
        stack.close()
        ray.shutdown()
    rate = {m: len(w) / sum(w) for m, w in walls.items()}
    for m in walls:
        g = statistics.median(p[0] for p in parts[m])
        t = statistics.median(p[1] for p in parts[m])
        print(f"{m:12s} {rate[m]:.3f} steps/s  (median step {statistics.median(walls[m]):.3f} s; generate {g:.3f} s, "
              f"train {t:.3f} s{' incl. the overlapped generation' if m == 'one_step_off' else ''})")
    print(f"ratio one_step_off/sync steps/s: {rate['one_step_off'] / rate['sync']:.3f}")


if __name__ == "__main__":
    main()
