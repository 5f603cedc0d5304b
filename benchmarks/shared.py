"""K trials on one shared base vs K separate trials, the same steps, at the workers' level (issue 48).

What it measures: the two pieces a shared pool is made of, against the pieces a separate trial is made of, each
side in a process of its own started for the measurement (so its start-up, its CPU-seconds and the processes it
starts count), on the tiny local model:
- shared: ONE process holding `workers/rollout/shared.py:SharedRolloutWorker` (one vLLM engine, K LoRA slots)
  and `workers/learner/pool/shared.py:SharedLearner` (the base once, K slots); K threads, one per trial, each
  running its own steps as a trial driver does: generate under its slot (concurrent calls batched into one
  engine call), train its slot, export its adapter and load it into its slot (the sync);
- separate: K processes one after another (the queue a 2-core machine runs), each holding one
  `RolloutWorker` and one `Learner` and running one trial's steps.
Both sides: the same prompts, seeds (trial i: seed i), sampling, batch building and steps. Not measured here:
Ray actors, the trial loop (orchestrator/trial/), Tune and the pool's orchestration (orchestrator/pool/): the
campaign-level comparison (`make demo` shared vs separate) is a separate measurement. vLLM runs in the process
that drives it (the CPU actor default), torch's threads are fixed (`--threads`, $BENCH_THREADS, else 1).

Per K: wall (the whole side: process starts, builds, steps) and its start-up part (building the engine and the
learner), CPU-seconds (the side's processes and everything they started, from rusage), tokens generated and
trained per second of the steps' wall (start-up excluded), sync seconds per step (export +
load, median and spread over every trial's steps), step wall (median and spread), processes started. Last line:
the ratio separate / shared of CPU-seconds at the largest K.

    python benchmarks/shared.py [--ks 1,2,4,8] [--steps 3] [--prompts 4] [--n 4] [--max-tokens 16]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._timing import fix_threads, spread  # noqa: E402

TEXTS = ["what is 1 + 2 ?", "what is 3 * 4 ?", "let me think", "the answer is", "wait let me check",
         "so the key insight is", "what is 7 - 5 ?", "notice that 2 + 2 = 4"]  # fmt: skip
ENGINE = dict(dtype="float32", seed=0, max_model_len=256, max_lora_rank=8, enforce_eager=True,
              engine={"in_process": True})


# ------------------------------------------------------------------------------------------------ one side
class Trial:
    """One trial's steps against an engine and a learner, through `gen`, `train`, `sync` callables."""

    def __init__(self, seed: int, prompts: list[list[int]], args):
        self.seed, self.prompts, self.args = seed, prompts, args
        self.rows: list[dict] = []

    def run(self, gen, train, sync) -> None:
        from workers.learner.inputs import LearnerBatch
        from workers.rollout.sampling import SamplingRequest

        a = self.args
        for step in range(a.steps):
            t0 = time.perf_counter()
            out = gen(self.prompts, SamplingRequest(n=a.n, temperature=1.0, max_tokens=a.max_tokens,
                                                    seed=1000 * self.seed + step))
            t1 = time.perf_counter()
            seqs = [(p, c) for p, group in zip(self.prompts, out.completions, strict=True) for c in group]
            batch = LearnerBatch(
                prompt_ids=[p for p, _ in seqs], response_ids=[list(c.token_ids) for _, c in seqs],
                rollout_logprobs=[list(c.logprobs) for _, c in seqs],
                rewards=[[float(c.token_ids[-1] % 2) if c.token_ids else 0.0 for c in g] for g in out.completions],
                temperature=1.0, step=step)
            train(batch)
            t2 = time.perf_counter()
            sync(step + 1)
            t3 = time.perf_counter()
            self.rows.append({"generated": sum(len(c.token_ids) for _, c in seqs),
                              "trained": sum(len(p) + len(c.token_ids) for p, c in seqs),
                              "gen_s": t1 - t0, "train_s": t2 - t1, "sync_s": t3 - t2, "step_s": t3 - t0})


def _learner_settings(seed: int, steps: int) -> dict:
    from workers.credit import CreditConfig
    from workers.learner.config import LearnerConfig
    from workers.learner.inputs import RunSettings

    return {"learner": LearnerConfig.model_validate({"lora": {"rank": 8}, "optim": {"lr": 1e-3}}),
            "credit": CreditConfig(), "interventions": None,
            "run": RunSettings(seed=seed, total_steps=steps, dtype="float32")}


def _processes() -> int:
    import psutil

    return 1 + len(psutil.Process().children(recursive=True))


def child_shared(model: str, k: int, prompts, args) -> dict:
    from workers.learner.pool.shared import SharedLearner
    from workers.rollout.shared import SharedRolloutWorker
    from workers.rollout.worker import RolloutWorkerSettings

    t0 = time.perf_counter()
    engine = SharedRolloutWorker(model, k, RolloutWorkerSettings(**ENGINE))
    learner = SharedLearner(model, k)
    for slot in range(k):
        learner.open(slot, **_learner_settings(slot, args.steps))
    start_s, procs = time.perf_counter() - t0, _processes()
    trials = [Trial(slot, prompts, args) for slot in range(k)]

    def drive(slot: int) -> None:
        trials[slot].run(lambda p, r: engine.generate(slot, p, r), lambda b: learner.train_step(slot, b),
                         lambda v: engine.load_policy(slot, learner.export_policy(slot, v)))

    threads = [threading.Thread(target=drive, args=(s,)) for s in range(k)]
    t1 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    steps_s = time.perf_counter() - t1
    stats = engine.stats()
    engine.close()
    return {"start_s": start_s, "steps_s": steps_s, "processes": procs, "rows": [r for t in trials for r in t.rows],
            "admissions": stats["admissions"], "max_in_flight": stats["max_in_flight"],
            "complete": all(len(t.rows) == args.steps for t in trials)}


def child_separate(model: str, seed: int, prompts, args) -> dict:
    from workers.learner.learner import Learner
    from workers.rollout.worker import RolloutWorker, RolloutWorkerSettings

    t0 = time.perf_counter()
    worker = RolloutWorker(model, RolloutWorkerSettings(**ENGINE))
    learner = Learner(model, **_learner_settings(seed, args.steps))
    start_s, procs = time.perf_counter() - t0, _processes()
    trial = Trial(seed, prompts, args)
    t1 = time.perf_counter()
    trial.run(worker.generate, learner.train_step, lambda v: worker.apply_policy(learner.export_policy(v)))
    return {"start_s": start_s, "steps_s": time.perf_counter() - t1, "processes": procs, "rows": trial.rows,
            "complete": len(trial.rows) == args.steps}


# ------------------------------------------------------------------------------------------------ driver
def run_child(side: str, value: int, model: str, args) -> dict:
    """One side's process: (its report, wall s, CPU-seconds of it and everything it waited for)."""
    cmd = [sys.executable, __file__, "--child", side, "--value", str(value), "--model", model,
           "--steps", str(args.steps), "--prompts", str(args.prompts), "--n", str(args.n),
           "--max-tokens", str(args.max_tokens), "--threads", str(args.threads)]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr[-4000:])
        raise SystemExit(f"{side} {value}: exit {proc.returncode}")
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    out["wall"] = wall
    out["cpu"] = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return out


def summarize(parts: list[dict]) -> dict:
    rows = [r for p in parts for r in p["rows"]]
    wall, steps = sum(p["wall"] for p in parts), sum(p["steps_s"] for p in parts)
    return {"wall": wall, "cpu": sum(p["cpu"] for p in parts), "start": sum(p["start_s"] for p in parts),
            "gen_tps": sum(r["generated"] for r in rows) / steps, "train_tps": sum(r["trained"] for r in rows) / steps,
            "sync": [r["sync_s"] for r in rows], "step": [r["step_s"] for r in rows],
            "processes": sum(p["processes"] for p in parts), "complete": all(p["complete"] for p in parts)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ks", default="1,2,4,8", help="trial counts K, comma-separated")
    ap.add_argument("--steps", type=int, default=3, help="steps per trial")
    ap.add_argument("--prompts", type=int, default=4, help="prompts per step")
    ap.add_argument("--n", type=int, default=4, help="samples per prompt")
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--threads", type=int, default=None, help="torch threads per process (default 1)")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds one side's process may run")
    ap.add_argument("--child", choices=("shared", "separate"), help=argparse.SUPPRESS)
    ap.add_argument("--value", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--model", help=argparse.SUPPRESS)
    args = ap.parse_args()
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

    if args.child:
        from workers.models.loading import load_tokenizer

        args.threads = fix_threads(args.threads)
        tok = load_tokenizer(args.model)
        prompts = [tok(TEXTS[i % len(TEXTS)])["input_ids"] for i in range(args.prompts)]
        fn = child_shared if args.child == "shared" else child_separate
        print(json.dumps(fn(args.model, args.value, prompts, args)), flush=True)
        os._exit(0)  # the engine's threads and vLLM's atexit hooks are not waited for: the report is out

    from workers.models.loading import build_tiny_model

    args.threads = args.threads or int(os.environ.get("BENCH_THREADS", "1"))
    ks = [int(x) for x in args.ks.split(",")]
    print(f"{args.steps} steps a trial, {args.prompts} prompts x n {args.n} x <= {args.max_tokens} tokens a step, "
          f"tiny model, {args.threads} torch thread(s) a process, {os.cpu_count()} cores", flush=True)
    results = {}
    with tempfile.TemporaryDirectory() as d:
        model = str(build_tiny_model(Path(d) / "tiny", seed=0))
        for k in ks:
            shared = summarize([run_child("shared", k, model, args)])
            separate = summarize([run_child("separate", i, model, args) for i in range(k)])
            results[k] = (shared, separate)
            for name, s in (("shared", shared), ("separate", separate)):
                print(f"K={k} {name:8s}: wall {s['wall']:.1f} s (start-up {s['start']:.1f}), CPU {s['cpu']:.1f} s, "
                      f"generated {s['gen_tps']:.0f} tok/s, trained {s['train_tps']:.0f} tok/s, sync "
                      f"{spread(s['sync'])} s/step, step {spread(s['step'])} s, processes {s['processes']}, "
                      f"all steps done: {s['complete']}", flush=True)
    print()
    head = ("K", "side", "wall s", "start-up s", "CPU s", "gen tok/s", "train tok/s", "sync s/step (median)", "step s (median)",
            "processes")
    rows = [head]
    for k, (sh, sep) in results.items():
        for name, s in (("shared", sh), ("separate", sep)):
            rows.append((str(k), name, f"{s['wall']:.1f}", f"{s['start']:.1f}", f"{s['cpu']:.1f}", f"{s['gen_tps']:.0f}",
                         f"{s['train_tps']:.0f}", f"{statistics.median(s['sync']):.3f}",
                         f"{statistics.median(s['step']):.2f}", str(s["processes"])))
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    rows.insert(1, tuple("-" * w for w in widths))
    for r in rows:
        print("| " + " | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) + " |")
    for k, (sh, sep) in results.items():
        print(f"K={k}: separate/shared wall {sep['wall'] / sh['wall']:.2f}, CPU {sep['cpu'] / sh['cpu']:.2f}")
    k = max(results)
    sh, sep = results[k]
    print(f"ratio separate/shared CPU-seconds at K={k}: {sep['cpu'] / sh['cpu']:.2f} (wall "
          f"{sep['wall'] / sh['wall']:.2f}; > 1: the shared pool spends less)")


if __name__ == "__main__":
    main()
