"""Rollout throughput: the RolloutWorker Ray actor vs a bare `vllm.LLM.generate`, same prompts and sampling.

16 prompts x n=16 x max_tokens 32, temperature 0.7, per-request seeds seed + i on both sides (so both sample the
same tokens), tiny local model. The actor is timed from the driver (ray.get round trip, log-prob extraction and
result transport included); the bare engine lives in this process beside it, both with a 1 GiB KV cache
(VLLM_CPU_KVCACHE_SPACE), and the timed calls alternate worker / bare (order flipped every pair) so both see the
same background load.
One warm-up call each, then REPS timed pairs; the ratio is the median over pairs of bare_time / worker_time.
Prints tokens/s of each and the worker/bare ratio last (target >= 0.95).

    python benchmarks/rollout.py [--prompts 16] [--n 16] [--max-tokens 32] [--reps 10]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._stack import init_ray  # noqa: E402

N_PROMPTS, N, MAX_TOKENS, TEMPERATURE, SEED, REPS = 16, 16, 32, 0.7, 1234, 10
TEXTS = ["what is 1 + 2 ?", "what is 3 * 4 ?", "let me think", "the answer is", "wait let me check",
         "so the key insight is", "what is 7 - 5 ?", "notice that 2 + 2 = 4"]  # fmt: skip


def _prompts(tok, count: int) -> list[list[int]]:
    return [
        [tok.bos_token_id] + tok.encode(TEXTS[i % len(TEXTS)] + " " + str(i), add_special_tokens=False)
        for i in range(count)
    ]


ENGINE = dict(dtype="float32", seed=0, max_model_len=256, max_lora_rank=8)  # both sides


def main(model_dir: str, prompts: list[list[int]], args: argparse.Namespace) -> None:
    import ray
    from vllm import LLM, SamplingParams

    from orchestrator.trial.actors.start import shutdown_actors
    from workers.rollout.worker import RolloutActor, RolloutWorkerSettings, SamplingRequest

    n, max_tokens = args.n, args.max_tokens
    actor = RolloutActor.options(num_cpus=2).remote(model_dir, RolloutWorkerSettings(**ENGINE, enforce_eager=True))
    ray.get(actor.ready.remote())
    # same engine settings as the worker builds (LoRA on, processed log-probs, `rollout.engine` defaults, vLLM in
    # this process as in the actor on the CPU build: a bare engine in its own processes busy-polls for a second
    # after each generate and would slow the worker call after it), no adapter loaded on either side
    import torch

    from workers.rollout.engine import engine_in_process, engine_settings, use_engine_processes

    cuda = torch.cuda.is_available()
    in_process = engine_in_process(None, cuda=cuda, own_process=True)
    use_engine_processes(in_process)
    llm = LLM(model=model_dir, enable_lora=True, max_loras=1, logprobs_mode="processed_logprobs", **ENGINE,
              **engine_settings(None, cuda=cuda, in_process=in_process))
    kw = dict(n=n, temperature=TEMPERATURE, max_tokens=max_tokens, seed=SEED)
    params = [SamplingParams(n=n, temperature=TEMPERATURE, top_p=1.0, max_tokens=max_tokens, seed=SEED + i,
                             logprobs=0) for i in range(len(prompts))]
    inputs = [{"prompt_token_ids": p} for p in prompts]

    def run_worker() -> tuple[float, int, float]:
        t0 = time.perf_counter()
        res = ray.get(actor.generate.remote(prompts, SamplingRequest(**kw)))
        return time.perf_counter() - t0, res.num_tokens, res.elapsed_s

    def run_bare() -> tuple[float, int]:
        t0 = time.perf_counter()
        outs = llm.generate(inputs, params, use_tqdm=False)
        return time.perf_counter() - t0, sum(len(c.token_ids) for o in outs for c in o.outputs)

    run_worker(), run_bare()  # warm-up each
    w, b = [], []
    for rep in range(args.reps):  # interleaved (order alternating), so both see the same background load
        if rep % 2:
            b.append(run_bare())
            w.append(run_worker())
        else:
            w.append(run_worker())
            b.append(run_bare())
    shutdown_actors([actor])
    w_tok, b_tok = w[-1][1], b[-1][1]
    w_t, b_t = statistics.median(x[0] for x in w), statistics.median(x[0] for x in b)
    print(f"worker: {w_tok} tokens, median {w_t:.3f} s (inside actor {statistics.median(x[2] for x in w):.3f} s), "
          f"runs {[round(x[0], 3) for x in w]}")
    print(f"bare:   {b_tok} tokens, median {b_t:.3f} s, runs {[round(x[0], 3) for x in b]}")
    print(f"same sampled token count on both sides: {w_tok == b_tok}")
    print(f"best-run ratio worker/bare: {min(x[0] for x in b) / min(x[0] for x in w):.3f}")
    pair = statistics.median(bx[0] / wx[0] for wx, bx in zip(w, b, strict=True))
    print(f"worker tokens/s: {w_tok / w_t:,.0f}")
    print(f"bare   tokens/s: {b_tok / b_t:,.0f}")
    print(f"ratio worker/bare (median of interleaved pairs): {pair:.3f} (target >= 0.95)")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description="Rollout worker actor vs bare vLLM generate (see the module docstring).")
    ap.add_argument("--prompts", type=int, default=N_PROMPTS)
    ap.add_argument("--n", type=int, default=N, help="samples per prompt")
    ap.add_argument("--max-tokens", type=int, default=MAX_TOKENS)
    ap.add_argument("--reps", type=int, default=REPS, help="timed worker/bare pairs (after one warm-up each)")
    cli = ap.parse_args()
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import ray

    from workers.models.loading import build_tiny_model, load_tokenizer

    with tempfile.TemporaryDirectory() as d:
        model_dir = str(build_tiny_model(Path(d) / "tiny", seed=0))
        prompts = _prompts(load_tokenizer(model_dir), cli.prompts)
        init_ray(2)
        try:
            main(model_dir, prompts, cli)
        finally:
            ray.shutdown()
