"""The shared learner's memory: K trials' LoRA learners as K slots of one `SharedLearner` (the base held once)
against K separate `Learner`s in one process, on the same model and batch.

Each side runs in a fresh child process of its own (spawned one after the other, never at once), so neither
inherits the other's freed heap: its resident set after imports, after the first learner has trained one step,
and after all K have. Also counted exactly from the tensors: the bytes of distinct storages every learner's
module tree reaches (the base once or K times) and, per slot, its adapter and optimizer state
(`SharedLearner.memory`). And the median training step of a slot against a separate learner's (same code: about
1.0).

Model: the tiny local model, or `--shape NAME` (benchmarks/learner.py's SHAPES, random weights, nothing
downloaded), e.g. `--shape qwen3-0.6b --layers 2 --vocab 8192`. Prints each side's figures and, last, the ratio
shared / separate of the resident-set growth for K learners.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

MIB = 2**20


def _rss() -> int:
    import os

    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _storage_bytes(models) -> int:
    """Bytes of the distinct storages the `models`' parameters and buffers use."""
    seen = {}
    for m in models:
        for t in (*m.parameters(), *m.buffers()):
            s = t.untyped_storage()
            seen[s.data_ptr()] = s.nbytes()
    return sum(seen.values())


def _side(shared: bool, args, out) -> None:
    import peft  # noqa: F401  (imported before the baseline: both sides count learners, not imports)
    import torch
    import transformers  # noqa: F401

    import workers.models.loading as models_mod
    from benchmarks._timing import fix_threads
    from benchmarks.learner import SHAPES, build_shape, make_batch
    from workers.credit import CreditConfig
    from workers.learner.config import LearnerConfig
    from workers.learner.inputs import RunSettings
    from workers.learner.learner import Learner
    from workers.learner.pool.shared import SharedLearner
    from workers.models.loading import build_tiny_model

    fix_threads(args.threads)
    tiny = str(build_tiny_model(Path(args.tmp) / "tiny", seed=0))
    if args.shape:
        def load(_path, dtype=torch.float32, device="cpu"):
            return build_shape(args.shape, args.layers, args.vocab, dtype, device)

        models_mod.load_model = load
    settings = {"learner": LearnerConfig.model_validate({"optim": {"lr": 1e-4}}),
                "credit": CreditConfig(), "interventions": None}
    rss = {"imports": _rss()}
    pool = SharedLearner(tiny, slots=args.k) if shared else None
    learners, times = [], []
    for k in range(args.k):
        run = RunSettings(seed=k, total_steps=10)
        if pool is not None:
            pool.open(k, **settings, run=run)
            learner = pool.learner(k)
        else:
            learner = Learner(tiny, **settings, run=run)
        learners.append(learner)
        vocab = args.vocab or (SHAPES[args.shape][1]["vocab_size"] if args.shape else learner.tokenizer.vocab_size)
        batch = make_batch(args, vocab)
        for rep in range(args.reps + 1):  # the first is a warm-up
            t0 = time.perf_counter()
            pool.train_step(k, batch) if pool is not None else learner.train_step(batch)
            if rep:
                times.append(time.perf_counter() - t0)
        if k == 0:
            rss["one"] = _rss()
    rss["all"] = _rss()
    out.put({"rss": rss, "storage": _storage_bytes([lr.model for lr in learners]),
             "memory": pool.memory() if pool is not None else None, "step_s": statistics.median(times)})


def main(argv: list[str] | None = None) -> None:
    import tempfile

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--k", type=int, default=4, help="learners (slots) on each side")
    p.add_argument("--shape", default=None)
    p.add_argument("--layers", type=int, default=None)
    p.add_argument("--vocab", type=int, default=None)
    p.add_argument("--groups", type=int, default=2)
    p.add_argument("--group", type=int, default=4)
    p.add_argument("--prompt-len", type=int, default=16)
    p.add_argument("--response-len", type=int, default=16)
    p.add_argument("--reps", type=int, default=2, help="timed training steps per learner (after one warm-up)")
    p.add_argument("--threads", type=int, default=None)
    args = p.parse_args(argv)
    ctx = mp.get_context("spawn")
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        args.tmp = tmp
        for name, shared in (("shared", True), ("separate", False)):
            q = ctx.Queue()
            proc = ctx.Process(target=_side, args=(shared, args, q))
            proc.start()
            results[name] = q.get()
            proc.join()
            if proc.exitcode != 0:
                raise SystemExit(f"the {name} side failed (exit {proc.exitcode})")
    for name, r in results.items():
        rss = r["rss"]
        further = (rss["all"] - rss["one"]) / max(args.k - 1, 1) / MIB
        print(f"{name:8s}: RSS after imports {rss['imports'] / MIB:.0f} MiB; first learner "
              f"+{(rss['one'] - rss['imports']) / MIB:.1f} MiB, each further +{further:.1f} MiB, {args.k} learners "
              f"+{(rss['all'] - rss['imports']) / MIB:.1f} MiB; distinct weight storage {r['storage'] / MIB:.2f} MiB; "
              f"median step {r['step_s'] * 1e3:.1f} ms")
    mem = results["shared"]["memory"]
    print("shared learner's own count: base " + f"{mem['base'] / MIB:.2f} MiB, per slot (adapter + optimizer) "
          + ", ".join(f"{v / MIB:.2f}" for k, v in mem.items() if k != "base") + " MiB")
    print(f"step time shared/separate: {results['shared']['step_s'] / results['separate']['step_s']:.2f}")
    grow = {n: r["rss"]["all"] - r["rss"]["imports"] for n, r in results.items()}
    print(f"ratio shared/separate: RSS growth for {args.k} learners: {grow['shared'] / grow['separate']:.2f}")


if __name__ == "__main__":
    main()
