"""Rollout throughput: the RolloutWorker Ray actor vs a bare `vllm.LLM.generate`, same prompts and sampling.

16 prompts x n=16 x max_tokens 32, temperature 0.7, per-request seeds seed + i on both sides (so both sample the
same tokens), tiny local model. The actor is timed from the driver (ray.get round trip, log-prob extraction and
result transport included); the bare engine is built in this process only after the actor is gone.
One warm-up call each, then the median of REPS timed calls.
Prints tokens/s of each and the worker/bare ratio last (target >= 0.95).
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

N_PROMPTS, N, MAX_TOKENS, TEMPERATURE, SEED, REPS = 16, 16, 32, 0.7, 1234, 3
TEXTS = ["what is 1 + 2 ?", "what is 3 * 4 ?", "let me think", "the answer is", "wait let me check",
         "so the key insight is", "what is 7 - 5 ?", "notice that 2 + 2 = 4"]  # fmt: skip


def _prompts(tok) -> list[list[int]]:
    return [
        [tok.bos_token_id] + tok.encode(TEXTS[i % len(TEXTS)] + " " + str(i), add_special_tokens=False)
        for i in range(N_PROMPTS)
    ]


def bench_worker(model_dir: str, prompts: list[list[int]]) -> tuple[float, int]:
    import ray

    from workers.rollout import RolloutActor

    actor = RolloutActor.options(num_cpus=2).remote(model_dir, seed=0)
    ray.get(actor.ready.remote())
    kw = dict(n=N, temperature=TEMPERATURE, max_tokens=MAX_TOKENS, seed=SEED)
    ray.get(actor.generate.remote(prompts, **kw))  # warm-up
    times, inner, tokens = [], [], 0
    for _ in range(REPS):
        t0 = time.perf_counter()
        res = ray.get(actor.generate.remote(prompts, **kw))
        times.append(time.perf_counter() - t0)
        inner.append(res["elapsed_s"])
        tokens = res["num_tokens"]
    ray.kill(actor)
    t = statistics.median(times)
    print(f"worker: {tokens} tokens, median {t:.3f} s (inside actor {statistics.median(inner):.3f} s), "
          f"runs {[round(x, 3) for x in times]}")
    return tokens / t, tokens


def bench_bare(model_dir: str, prompts: list[list[int]]) -> tuple[float, int]:
    from vllm import LLM, SamplingParams

    llm = LLM(model=model_dir, dtype="float32", seed=0, max_model_len=256, enforce_eager=True, enable_lora=True,
              max_lora_rank=8, max_loras=1, logprobs_mode="processed_logprobs")
    params = [SamplingParams(n=N, temperature=TEMPERATURE, top_p=1.0, max_tokens=MAX_TOKENS, seed=SEED + i,
                             logprobs=0) for i in range(len(prompts))]
    inputs = [{"prompt_token_ids": p} for p in prompts]
    llm.generate(inputs, params, use_tqdm=False)  # warm-up
    times, tokens = [], 0
    for _ in range(REPS):
        t0 = time.perf_counter()
        outs = llm.generate(inputs, params, use_tqdm=False)
        times.append(time.perf_counter() - t0)
        tokens = sum(len(c.token_ids) for o in outs for c in o.outputs)
    t = statistics.median(times)
    print(f"bare:   {tokens} tokens, median {t:.3f} s, runs {[round(x, 3) for x in times]}")
    del llm
    return tokens / t, tokens


if __name__ == "__main__":
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import ray

    from workers.models import build_tiny_model, load_tokenizer

    with tempfile.TemporaryDirectory() as d:
        model_dir = str(build_tiny_model(Path(d) / "tiny", seed=0))
        prompts = _prompts(load_tokenizer(model_dir))
        ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False,
                 runtime_env={"env_vars": {"VLLM_CPU_KVCACHE_SPACE": os.environ["VLLM_CPU_KVCACHE_SPACE"],
                                           "TOKENIZERS_PARALLELISM": "false"}})
        try:
            w_tps, w_tok = bench_worker(model_dir, prompts)
        finally:
            ray.shutdown()
        b_tps, b_tok = bench_bare(model_dir, prompts)
        print(f"same sampled token count on both sides: {w_tok == b_tok}")
        print(f"worker tokens/s: {w_tps:,.0f}")
        print(f"bare   tokens/s: {b_tps:,.0f}")
        print(f"ratio worker/bare: {w_tps / b_tps:.3f} (target >= 0.95)")
