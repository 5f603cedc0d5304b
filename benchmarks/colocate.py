"""Colocated vs separate placement on the same trial: step time, the sleep / wake phases and GPUs per trial.

One set of actors (benchmarks/_stack.py: run_trial's loop body outside Tune), built as a colocated trial builds
them (the engine with sleep mode where vLLM has it); blocks alternate `--blocks` times between the separate step
(the engine never sleeps) and the colocated step (engines sleep after generating and wake, weights then KV cache,
before the weight sync: orchestrator/trial/actors/phases.py), so both see the same background load. GPUs per trial come
from the two placements' bundles (orchestrator/config/placement.py), and GPU-seconds per step = step wall x GPUs.

On CPU vLLM has no sleep mode: sleep and wake are recorded no-ops, so the colocated step shows only the phase
overhead (two Ray round trips per step) and the GPU count is what a GPU trial of this shape would ask. On a GPU
the engine really sleeps: the script then also prints the device memory sleep frees against the engine's share
(`--gpu-memory-utilization` of the device) and the wake seconds. Prints the ratio of colocated to separate
GPU-seconds per step last.

    python benchmarks/colocate.py [--steps 4] [--blocks 2] [--prompts 16] [--n 16] [--max-tokens 48] [--model tiny]
                                  [--ranks 1] [--gpu-memory-utilization 0.3]
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._stack import Stack, init_ray  # noqa: E402


def device_free() -> float | None:
    """Free bytes of GPU 0, device-wide (any process's allocations count), or None without a GPU."""
    import torch

    if not torch.cuda.is_available():
        return None
    return float(torch.cuda.mem_get_info(0)[0])


def memory_freed(stack: Stack, level: int, share: float) -> str:
    """Sleep every engine once, outside the measured steps, and say how much of its share came back."""
    import ray
    import torch

    before = device_free()
    ray.get([w.sleep.remote(level) for w in stack.workers])
    after = device_free()
    ray.get([w.wake_up.remote() for w in stack.workers])
    engine = share * torch.cuda.mem_get_info(0)[1] * len(stack.workers)
    return (f"sleep level {level} freed {(after - before) / 2**30:.2f} GiB = {(after - before) / engine:.0%} of the "
            f"engines' {engine / 2**30:.2f} GiB share")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=4, help="measured steps per block")
    ap.add_argument("--blocks", type=int, default=2, help="separate + colocated block pairs")
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--n", type=int, default=16, help="samples per prompt")
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--ranks", type=int, default=1, help="learner ranks of the trial shape whose GPUs are counted")
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.3, help="the engine's share (GPU only)")
    args = ap.parse_args()

    import ray

    from orchestrator.config.placement import trial_gpus, with_placement
    from orchestrator.config.trial import TrialConfig
    from orchestrator.trial.actors.phases import Phases

    cfg = TrialConfig(
        name="bench_colocate", steps=100_000, model={"name": args.model, "max_model_len": 128},
        task={"name": "arithmetic", "max_operand": 4}, eval={"every": 0},
        rollout={"prompts_per_step": args.prompts, "n": args.n, "max_tokens": args.max_tokens,
                 "skip_uninformative": False, "engine": {"gpu_memory_utilization": args.gpu_memory_utilization}},
        credit={"advantage_mode": "grpo", "transform_mode": "none"},
        resources={"placement": "colocated", "learner_gpus": 1, "learner_ranks": 1},
    )
    shape = TrialConfig(resources={"placement": "colocated", "learner_gpus": 1, "learner_ranks": args.ranks})
    gpus = {"separate": trial_gpus(with_placement(shape, "separate")), "colocated": trial_gpus(shape)}
    init_ray()
    stack = Stack(cfg)  # actors without a placement group: on a GPU box both see GPU 0, as a colocated bundle
    level = 1 if cfg.learner.mode == "lora" else 2
    ctx = {"separate": stack.ctx,
           "colocated": dataclasses.replace(stack.ctx, phases=Phases(stack.ctx.engines, stack.learner, None, level))}
    walls: dict[str, list[float]] = {"separate": [], "colocated": []}
    phases: list[tuple[float, float]] = []
    freed = None
    try:
        if device_free() is not None:
            freed = memory_freed(stack, level, args.gpu_memory_utilization)
        for block in range(2 * args.blocks):
            mode = "separate" if block % 2 == 0 else "colocated"
            stack.ctx = ctx[mode]
            stack.step("sync")  # unmeasured: the switch
            for _ in range(args.steps):
                wall, row = stack.step("sync")
                walls[mode].append(wall)
                if mode == "colocated":
                    phases.append((row.get("time/sleep_s", 0.0), row.get("time/wake_s", 0.0) + row.get("time/wake_kv_s", 0.0)))
                print(f"{mode:10s} step {row['step']}: {wall:.3f} s (generate {row['time/generate_s']:.3f}, train "
                      f"{row['time/train_s']:.3f}, sync {row['time/sync_s']:.3f})", flush=True)
    finally:
        stack.close()
        ray.shutdown()
    step = {m: statistics.median(w) for m, w in walls.items()}
    for m in walls:
        print(f"{m:10s} median step {step[m]:.3f} s, {gpus[m]:g} GPU(s) a trial ({args.ranks} learner rank(s)): "
              f"{step[m] * gpus[m]:.3f} GPU-s per step")
    sleep, wake = statistics.median(p[0] for p in phases), statistics.median(p[1] for p in phases)
    print(f"colocated phases: sleep {sleep:.3f} s, wake {wake:.3f} s per step (median)"
          + ("" if freed else " (CPU: recorded no-ops, the Ray round trips alone)"))
    if freed:
        print(freed)
    print(f"ratio colocated/separate GPU-seconds per step: {step['colocated'] * gpus['colocated'] / (step['separate'] * gpus['separate']):.3f}")


if __name__ == "__main__":
    main()
