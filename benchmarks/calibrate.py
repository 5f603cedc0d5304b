"""Calibrate `plan`'s cost model on the machine at hand: the constants it assumes, measured with the project's own
actors, written to a file that `python -m orchestrator plan CAMPAIGN --calibration FILE` reads in their place
(orchestrator/config/calibration.py).

The actors are a trial's, as run_trial builds them (benchmarks/_stack.py: its rollout worker and learner actors
on a local Ray, or the Ray at RAY_ADDRESS), for a LoRA trial of the model at hand (--model, default the tiny local
model; arithmetic task):
- `startup_s`: the actors built and ready (the engine and the learner, their models loaded);
- `decode`: the worker's `generate` with 1, 2, 4, ... sequences in flight (one completion of --max-tokens tokens
  per prompt, no stop token, so every sequence decodes to the end), tokens a second from the worker's own clock,
  the median of --reps calls after a warm-up;
- `learner_tokens_per_s`: the learner's `train_step` on a batch of --prompts x --n sequences of the task's prompts
  and --max-tokens response tokens (prompt + response tokens a second), the median of --reps;
- `adapter_export_s`: the learner's export of its adapter; `adapter_load_s`: a trial step's sync (export, transfer
  and the worker's load, `time/sync_s`) less the export, both medians over --steps trial steps;
- `step_overhead_s`: the median of those trial steps' measured wall less what the rates above predict for them
  (their sequences' generated tokens at the decode rate of that many sequences, their prompt + response tokens
  at the learner rate, the sync): the rest of a step (grading, collating, the scoring pass, the Ray calls).

`--campaign FILE` calibrates for a campaign: the measured trial is its first trial (model, task, rollout sizes,
learner and credit settings, and the CPUs its actors get), and the file also records that trial's task and its
steps' mean prompt and completion lengths, which `plan` then uses for the trials of that model and task.
Prints each figure, writes --out (YAML), and last the calibration's own check: each trial step's measured wall
against what the calibration predicts for it with the other steps' overhead (held out), as a ratio measured /
predicted.

    python benchmarks/calibrate.py [--out calibration.yaml] [--quick] [--campaign FILE | --model tiny]
                                   [--prompts 16] [--n 8] [--max-tokens 32] [--max-model-len N] [--max-seqs 128]
                                   [--reps 3] [--steps 4]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._stack import Stack, init_ray  # noqa: E402


def _args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="calibration.yaml", help="the calibration file to write")
    ap.add_argument("--quick", action="store_true", help="the smallest sizes (CI): 2 prompts x 2, 4 tokens, "
                    "1, 2 and 4 sequences, one rep, one trial step")
    ap.add_argument("--campaign", default=None, help="a campaign file: measure its first trial (module docstring)")
    ap.add_argument("--model", default="tiny", help="model.name of the measured trial (a local path or hub name)")
    ap.add_argument("--device", default=None, help="what the file records as the device (default: cuda's name or "
                    "'cpu, N cores')")
    ap.add_argument("--prompts", type=int, default=None, help="prompts of a trial step and of the learner's batch "
                    "(default 16, or the campaign's)")
    ap.add_argument("--n", type=int, default=None, help="samples per prompt (default 8, or the campaign's)")
    ap.add_argument("--max-tokens", type=int, default=None, help="default 32, or the campaign's")
    ap.add_argument("--max-model-len", type=int, default=None, help="model.max_model_len of the measured trial "
                    "(default: the trial's own default)")
    ap.add_argument("--max-seqs", type=int, default=128, help="decode measured at 1, 2, 4, ... up to this many")
    ap.add_argument("--reps", type=int, default=3, help="timed calls per decode point and learner batch")
    ap.add_argument("--steps", type=int, default=4, help="timed trial steps (after one warm-up step)")
    args = ap.parse_args()
    if args.quick:
        args.prompts, args.n, args.max_tokens, args.max_seqs, args.reps, args.steps = 2, 2, 4, 4, 1, 1
    return args


def _trial(args: argparse.Namespace):
    """The measured trial's config: the campaign's first trial's (--campaign), or a LoRA trial of --model on the
    arithmetic task; --prompts, --n, --max-tokens (or --quick's sizes) over either's, filled in on `args`."""
    from orchestrator.config.trial import TrialConfig

    if args.campaign:
        from orchestrator.campaign.expand import load_campaign

        base = load_campaign(args.campaign).trials[0].trial.model_dump(mode="json")
        rollout = base["rollout"]
        args.prompts = args.prompts or rollout["prompts_per_step"]
        args.n, args.max_tokens = args.n or rollout["n"], args.max_tokens or rollout["max_tokens"]
        base.update(name="calibrate", steps=100_000, eval={"every": 0}, output_dir=None,
                    rollout={**rollout, "prompts_per_step": args.prompts, "n": args.n, "max_tokens": args.max_tokens})
        base["resources"] = {**base["resources"], "shared_base": None}  # the measured trial's own actors
        return TrialConfig.model_validate(base)
    args.prompts, args.n, args.max_tokens = args.prompts or 16, args.n or 8, args.max_tokens or 32
    return TrialConfig(
        # max_model_len: the trial's own default unless given (a local tiny model's position limit is 512)
        name="calibrate", steps=100_000,
        model={"name": args.model, **({"max_model_len": args.max_model_len} if args.max_model_len else {})},
        task={"name": "arithmetic", "max_operand": 4}, eval={"every": 0},
        rollout={"num_workers": 1, "prompts_per_step": args.prompts, "n": args.n, "max_tokens": args.max_tokens,
                 "skip_uninformative": False},
        learner={"mode": "lora", "old_logprobs": "rollout", "optim": {"micro_batch_size": args.prompts * args.n}},
        credit={"advantage_mode": "grpo", "transform_mode": "none"},
    )


def _device() -> str:
    import torch

    if torch.cuda.is_available():
        return torch.cuda.get_device_name(0)
    return f"cpu, {os.cpu_count()} cores"


def main() -> None:
    args = _args()
    import ray
    import yaml

    from orchestrator.config.calibration import Calibration
    from workers.envs.tokens import first_prompt_ids
    from workers.learner.inputs import LearnerBatch
    from workers.rollout.sampling import SamplingRequest
    from workers.tasks import make_task

    cfg = _trial(args)
    init_ray()
    t0 = time.perf_counter()
    stack = Stack(cfg, cpus=None if args.campaign else 2)  # a campaign's trial: the CPUs its actors get
    startup = time.perf_counter() - t0
    print(f"start-up: {startup:.1f} s (rollout worker and learner actors built and ready)", flush=True)
    twin = make_task(cfg.task, cfg.seed)  # the stack's problem stream, for the steps' prompt lengths
    probe = make_task(cfg.task, cfg.seed + 1)  # prompts for the decode and learner measurements
    worker = stack.workers[0]
    try:
        # decode throughput against sequences in flight
        points = []
        sizes = sorted({2**i for i in range(args.max_seqs.bit_length()) if 2**i <= args.max_seqs} | {args.max_seqs})
        for seqs in sizes:
            prompts = [first_prompt_ids(stack.tokenizer, p.prompt) for p in probe.next_batch(seqs)]
            req = SamplingRequest(n=1, temperature=1.0, max_tokens=args.max_tokens, seed=0)
            ray.get(worker.generate.remote(prompts, req))  # warm-up at this size
            rates = []
            for _ in range(args.reps):
                gen = ray.get(worker.generate.remote(prompts, req))
                rates.append(gen.num_tokens / max(gen.elapsed_s, 1e-9))
            points.append({"sequences": seqs, "tokens_per_s": statistics.median(rates)})
            print(f"decode: {seqs} sequence(s) in flight: {points[-1]['tokens_per_s']:,.0f} tokens/s", flush=True)
        # the learner's rate on a batch of known size
        prompts = [first_prompt_ids(stack.tokenizer, p.prompt) for p in probe.next_batch(args.prompts)]
        vocab = len(stack.tokenizer)
        responses = [[(7 * i + 3 * j) % (vocab - 1) + 1 for j in range(args.max_tokens)]
                     for i in range(args.prompts * args.n)]
        batch = LearnerBatch(prompt_ids=[p for p in prompts for _ in range(args.n)], response_ids=responses,
                             rollout_logprobs=[[0.0] * args.max_tokens for _ in responses],
                             rewards=[[float(i % 2) for i in range(args.n)] for _ in prompts], temperature=1.0)
        tokens = sum(len(p) for p in batch.prompt_ids) + sum(len(r) for r in responses)
        stack.learner.train_step(batch)  # warm-up
        learn = []
        for _ in range(args.reps):
            t0 = time.perf_counter()
            stack.learner.train_step(batch)
            learn.append(tokens / (time.perf_counter() - t0))
        learner_rate = statistics.median(learn)
        print(f"learner: {tokens:,} tokens a step, {learner_rate:,.0f} tokens/s", flush=True)
        # trial steps: the sync (export + load) and the check
        stack.step("sync")  # warm-up: compiles, the first adapter load
        twin.next_batch(args.prompts)
        walls, syncs, exports, predicted_parts, lengths = [], [], [], [], []
        for _ in range(args.steps):
            step_prompts = [first_prompt_ids(stack.tokenizer, p.prompt) for p in twin.next_batch(args.prompts)]
            wall, row = stack.step("sync")
            t0 = time.perf_counter()
            ray.get(stack.learner.ranks[0].export_adapter.remote(stack.version))
            exports.append(time.perf_counter() - t0)
            walls.append(wall)
            syncs.append(row["time/sync_s"])
            sequences = args.prompts * args.n
            generated = row["train/completion_len"] * sequences
            prompt_tokens = args.n * sum(len(p) for p in step_prompts)
            predicted_parts.append((generated, sequences, prompt_tokens + generated))
            lengths.append((prompt_tokens / sequences, row["train/completion_len"]))
    finally:
        stack.close()
        twin.close()
        probe.close()
        ray.shutdown()
    export_s = statistics.median(exports)
    load_s = max(statistics.median(syncs) - export_s, 0.0)
    rates = Calibration.model_validate({
        "device": args.device or _device(), "model": cfg.model.name, "decode": points,
        "learner_tokens_per_s": learner_rate, "adapter_export_s": export_s, "adapter_load_s": load_s,
        "startup_s": startup})
    by_rates = [gen / rates.decode_rate(seqs) + learned / learner_rate + export_s + load_s
                for gen, seqs, learned in predicted_parts]
    rest = [w - p for w, p in zip(walls, by_rates, strict=True)]
    measured_lengths = {"task": cfg.task.name, "prompt_tokens": statistics.mean(p for p, _ in lengths),
                        "completion_tokens": statistics.mean(c for _, c in lengths)} if args.campaign else {}
    cal = rates.model_copy(update={"step_overhead_s": max(statistics.median(rest), 0.0), **measured_lengths})
    Path(args.out).write_text(yaml.safe_dump(cal.model_dump(mode="json", exclude_none=True), sort_keys=False))
    print(f"adapter: export {export_s:.3f} s, load {load_s:.3f} s (a step's sync {statistics.median(syncs):.3f} s "
          "less the export)")
    print(f"a step's other work: {cal.step_overhead_s:.3f} s (measured wall less the rates' prediction, median)")
    if measured_lengths:
        print(f"lengths ({cfg.model.name} on {cfg.task.name}): {cal.prompt_tokens:.1f}-token prompts, "
              f"{cal.completion_tokens:.1f}-token completions (means over the trial steps)")
    print(f"wrote {args.out}: python -m orchestrator plan CAMPAIGN --calibration {args.out}")
    # the check: each step against the rates plus the other steps' overhead (held out; one step: its own)
    predicted = []
    for i, p in enumerate(by_rates):
        others = rest[:i] + rest[i + 1:] or rest
        predicted.append(p + max(statistics.median(others), 0.0))
    for w, p in zip(walls, predicted, strict=True):
        print(f"trial step: measured {w:.3f} s, the calibration predicts {p:.3f} s")
    ratio = statistics.median(w / p for w, p in zip(walls, predicted, strict=True))
    print(f"ratio measured/predicted trial step (median over {len(walls)} steps, each with the others' overhead): "
          f"{ratio:.3f} (about 1: the calibration describes this machine's steps)")


if __name__ == "__main__":
    main()
