"""Rollout-worker start-up on the CPU build: vLLM in the actor's process (`rollout.engine.in_process`, the CPU
default) vs vLLM's own engine-core and model-worker processes, same model and settings.

Each rep starts one actor of each kind (order alternating, so both see the same background load) and times it
from `.remote()` to a finished first `generate` (16 prompts x n=8 x 32 tokens): actor process start, vLLM import,
engine build and the first batch, which is what every trial pays before its first step. The two engines must
sample the same tokens with the same log-probs (checked; the suite's smoke run fails otherwise). Prints each
time, then the ratio separate / in-process of the medians last.

    python benchmarks/engine_start.py [--reps 3] [--prompts 16] [--n 8] [--max-tokens 32]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._stack import init_ray  # noqa: E402

REPS, PROMPTS, N, MAX_TOKENS, SEED = 3, 16, 8, 32, 7
LOGPROB_TOL = 1e-5  # fp32 on one CPU: the two engines compute the same log-probs (tests/integration/test_benchmarks.py)


def _start(model_dir: str, in_process: bool, prompts: list[list[int]], n: int, max_tokens: int
           ) -> tuple[float, list]:
    import ray

    from orchestrator.trial.actors.start import shutdown_actors
    from workers.rollout.worker import RolloutActor, RolloutWorkerSettings, SamplingRequest

    t0 = time.perf_counter()
    actor = RolloutActor.options(num_cpus=1).remote(
        model_dir, RolloutWorkerSettings(seed=0, max_model_len=256, engine={"in_process": in_process}))
    out = ray.get(actor.generate.remote(prompts, SamplingRequest(n=n, temperature=1.0, max_tokens=max_tokens, seed=SEED)))
    elapsed = time.perf_counter() - t0
    shutdown_actors([actor])
    time.sleep(2)  # let the killed actor's processes go before the next start
    return elapsed, [[(c.token_ids, c.logprobs) for c in g] for g in out.completions]


def main() -> None:
    ap = argparse.ArgumentParser(description="Rollout-worker start-up, vLLM in-process vs in its own processes.")
    ap.add_argument("--reps", type=int, default=REPS, help="starts of each kind")
    ap.add_argument("--prompts", type=int, default=PROMPTS)
    ap.add_argument("--n", type=int, default=N, help="samples per prompt")
    ap.add_argument("--max-tokens", type=int, default=MAX_TOKENS)
    args = ap.parse_args()
    import ray

    from workers.models.loading import build_tiny_model, load_tokenizer
    from workers.sync.scratch import node_temp_dir

    model_dir = str(build_tiny_model(Path(node_temp_dir()) / "credit-orchestrator-tiny-0", seed=0))
    tok = load_tokenizer(model_dir)
    prompts = [[tok.bos_token_id] + tok.encode(f"what is {i} + {i} ?", add_special_tokens=False)
               for i in range(args.prompts)]
    init_ray(2)
    times: dict[bool, list[float]] = {True: [], False: []}
    samples: dict[bool, list] = {}
    try:
        for rep in range(args.reps):
            for in_process in ((True, False) if rep % 2 == 0 else (False, True)):
                t, ids = _start(model_dir, in_process, prompts, args.n, args.max_tokens)
                times[in_process].append(t)
                samples[in_process] = ids
                print(f"rep {rep} {'in-process' if in_process else 'separate  '}: {t:.1f} s to the first batch",
                      flush=True)
    finally:
        ray.shutdown()
    pairs = [(a, b) for ga, gb in zip(samples[True], samples[False], strict=True)
             for a, b in zip(ga, gb, strict=True)]
    same_tokens = all(a[0] == b[0] for a, b in pairs)
    close = same_tokens and all(abs(x - y) <= LOGPROB_TOL for a, b in pairs for x, y in zip(a[1], b[1], strict=True))
    print(f"same tokens from both engines: {same_tokens}, their log-probs within {LOGPROB_TOL:g}: {close}")
    sep, inp = statistics.median(times[False]), statistics.median(times[True])
    print(f"median start to first batch: separate processes {sep:.1f} s, in-process {inp:.1f} s")
    print(f"ratio separate/in-process: {sep / inp:.2f}")


if __name__ == "__main__":
    main()
