"""Orchestration overhead of a trial step: a steady-state sync step vs the sum of its bare parts on the same batch.

Trial step: the loop body of `run_trial` (benchmarks/_stack.py: sample on the rollout worker actor, score,
filter, learner actor `train_step`, export the adapter and load it on the worker, write metrics.jsonl), with
`old_logprobs: rollout` (one learner pass), GRPO (no token stages) and every group kept, so the learner does what
the bare step does plus its bookkeeping. Bare parts, in this process: `vllm.LLM.generate` of the same prompts
with the same seeds and the same LoRA adapter (so the same tokens), and `benchmarks/learner.py:BareStep` (forward,
backward, AdamW) on a PeftModel of the same model, on the same sequences. The timed calls alternate trial step /
bare parts (order flipped every pair) after warm-up steps, so both see the same background load.

Size: 32 prompts x n 16 x up to 48 tokens on the tiny model, one rollout worker: a step of about 2.5 s on a
2-core CPU (measured: overhead 4.7%; at 16 prompts, a 1.2 s step, the fixed Ray round trips make it 7.8%).
Prints the parts, the overhead (trial step / (bare generate + bare train) - 1) and last the same as a ratio
trial / bare (target <= 1.05).

    python benchmarks/step.py [--reps 6] [--warmup 2] [--prompts 32] [--n 16] [--max-tokens 48]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._stack import Stack, init_ray  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=6, help="timed trial-step / bare-parts pairs")
    ap.add_argument("--warmup", type=int, default=2, help="untimed pairs first")
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--n", type=int, default=16, help="samples per prompt")
    ap.add_argument("--max-tokens", type=int, default=48)
    args = ap.parse_args()

    import ray
    import torch
    from peft import LoraConfig, get_peft_model
    from vllm import LLM, SamplingParams
    from vllm.lora.request import LoRARequest

    from benchmarks.learner import BareStep
    from orchestrator.config.trial import TrialConfig
    from orchestrator.trial.collect.sampling import step_seed
    from workers.envs.tokens import first_prompt_ids, stop_token_ids
    from workers.learner.inputs import LearnerBatch
    from workers.models.loading import load_model
    from workers.rollout.engine import engine_in_process, engine_settings, use_engine_processes
    from workers.tasks import make_task

    cfg = TrialConfig(
        name="bench_step", steps=100_000, model={"name": "tiny", "max_model_len": 128},
        task={"name": "arithmetic", "max_operand": 4}, eval={"every": 0},
        rollout={"num_workers": 1, "prompts_per_step": args.prompts, "n": args.n, "max_tokens": args.max_tokens,
                 "skip_uninformative": False},
        learner={"old_logprobs": "rollout", "optim": {"micro_batch_size": args.prompts * args.n}},
        credit={"advantage_mode": "grpo", "transform_mode": "none"},
    )
    init_ray()
    stack = Stack(cfg)
    twin = make_task(cfg.task, cfg.seed)  # the same problem stream, for the bare side
    ro = cfg.rollout
    # The bare engine runs as the worker's does (engine_in_process: inside the process on the CPU build). A bare
    # engine in its own processes would busy-poll its shared-memory queue for a second after every generate and
    # slow whatever the trial side runs next: measured here, that alone read as 33% "overhead".
    cuda = torch.cuda.is_available()
    in_process = engine_in_process(cfg.rollout.engine.model_dump(), cuda=cuda, own_process=True)
    use_engine_processes(in_process)
    llm = LLM(model=stack.model_path, dtype="float32", seed=cfg.seed, max_model_len=cfg.model.max_model_len,
              enable_lora=True, max_lora_rank=cfg.learner.lora.rank, max_loras=1,
              logprobs_mode="processed_logprobs", **engine_settings(cfg.rollout.engine.model_dump(), cuda=cuda,
                                                                     in_process=in_process))
    lora = cfg.learner.lora
    peft = get_peft_model(load_model(stack.model_path), LoraConfig(
        r=lora.rank, lora_alpha=lora.alpha, target_modules=lora.target_modules, task_type="CAUSAL_LM"))
    bare_train = BareStep(peft, args.prompts * args.n, ro.temperature)
    adapters = Path(tempfile.mkdtemp(prefix="bench-step-lora-"))
    stops = stop_token_ids(stack.tokenizer)  # what the trial's workers stop at

    def load_adapter(version: int):
        """The adapter the worker samples with now, from the same bytes (call before the trial step trains)."""
        if not version:
            return None
        d = adapters / f"v{version}"
        if not d.exists():
            d.mkdir()
            for name, data in ray.get(stack.learner.ranks[0].export_adapter.remote(version)).items():
                (d / name).write_bytes(data)
            llm.llm_engine.add_lora(LoRARequest(f"v{version}", version, str(d)))
        return LoRARequest(f"v{version}", version, str(d))

    def bare_parts(step: int, req) -> tuple[float, float, int]:
        prompts = [first_prompt_ids(stack.tokenizer, p.prompt) for p in twin.next_batch(ro.prompts_per_step)]
        seed = step_seed(cfg.seed, step, 0)
        params = [SamplingParams(n=ro.n, temperature=ro.temperature, max_tokens=ro.max_tokens, seed=seed + i,
                                 logprobs=0, stop_token_ids=stops) for i in range(len(prompts))]
        t0 = time.perf_counter()
        outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, lora_request=req, use_tqdm=False)
        t_gen = time.perf_counter() - t0
        completions = [list(c.token_ids) for o in outs for c in sorted(o.outputs, key=lambda c: c.index)]
        batch = LearnerBatch(prompt_ids=[p for p in prompts for _ in range(ro.n)], response_ids=completions,
                             rollout_logprobs=[[0.0] * len(c) for c in completions],
                             rewards=[[float(i % 2) for i in range(ro.n)] for _ in prompts], temperature=ro.temperature)
        tensors = bare_train.tensors(batch, stack.tokenizer.pad_token_id, "cpu")
        t0 = time.perf_counter()
        bare_train(*tensors)
        return t_gen, time.perf_counter() - t0, sum(len(c) for c in completions)

    try:
        for _ in range(args.warmup):
            step, req = stack.step_idx, load_adapter(stack.version)
            stack.step("sync")
            bare_parts(step, req)
        trial, gen, train, same = [], [], [], []
        for rep in range(args.reps):
            step, req = stack.step_idx, load_adapter(stack.version)
            if rep % 2:
                g, t, toks = bare_parts(step, req)
                wall, row = stack.step("sync")
            else:
                wall, row = stack.step("sync")
                g, t, toks = bare_parts(step, req)
            trial.append(wall)
            gen.append(g)
            train.append(t)
            same.append(toks == round(row["train/completion_len"] * args.prompts * args.n))
            print(f"step {step}: trial {wall:.3f} s (generate {row['time/generate_s']:.3f}, train "
                  f"{row['time/train_s']:.3f}, sync {row['time/sync_s']:.3f}) | bare generate {g:.3f} s, bare train "
                  f"{t:.3f} s | {toks} tokens", flush=True)
    finally:
        stack.close()
        ray.shutdown()
        shutil.rmtree(adapters, ignore_errors=True)
    print(f"same sampled token count on both sides: {all(same)}")
    m_trial, m_gen, m_train = statistics.median(trial), statistics.median(gen), statistics.median(train)
    print(f"trial step median {m_trial:.3f} s; bare generate {m_gen:.3f} s + bare train {m_train:.3f} s = "
          f"{m_gen + m_train:.3f} s")
    overhead = statistics.median(w / (g + t) - 1 for w, g, t in zip(trial, gen, train, strict=True))
    print(f"orchestration overhead (median of interleaved pairs): {100 * overhead:.1f}% (target <= 5%)")
    print(f"ratio trial/bare (median of interleaved pairs): {1 + overhead:.3f} (target <= 1.05)")


if __name__ == "__main__":
    main()
