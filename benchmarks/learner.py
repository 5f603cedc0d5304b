"""Learner step vs a bare PEFT step: `Learner.train_step` against forward + backward + optimizer step written
by hand, on the same batch and the same PeftModel (same weights, same LoRA), in one process.

The bare step: full logits of the whole sequence, log-probs of the response tokens (gather + log_softmax at the
sampling temperature), a policy-gradient loss (-A * log p, token mean), backward, gradient clip, AdamW step.
The learner's step adds everything a training step of the trial does (collate, advantages, PPO-clipped loss,
metrics); with `old_logprobs: rollout` it runs one pass like the bare step, with `recompute` a no-grad scoring
pass first. Both sides use the same micro-batch size. Timed calls alternate learner / bare (order flipped every
pair) after one warm-up each; tokens/s = sequence tokens (prompt + response) per second, median over pairs, and
each ratio's median and spread over the pairs. torch's CPU threads are fixed (`--threads`, $BENCH_THREADS, else 1)
so the figure does not follow the machine's load.
Peak memory (median over steps): `torch.cuda.max_memory_allocated` per step on a GPU (weights included); on
CPU the peak resident-set growth during the step (`PeakRSS`, weights excluded).

Model: the tiny local model, or `--shape NAME` = a randomly initialised model of a real architecture built from
its config alone (no download), e.g. `--shape qwen3-4b` on a GPU; `--layers` / `--vocab` shrink it for a CPU
run (e.g. `--shape qwen3-0.6b --layers 2 --vocab 8192`).

Prints tokens/s and peak memory of each, the recompute ratio, and the ratio learner/bare with
`old_logprobs: rollout` last (target >= 0.9).

`--ranks N` (N > 1) measures the learner group instead: N processes forming a torch.distributed group (gloo on
CPU, NCCL on GPU: one GPU per rank), the model FSDP2-sharded, each rank training its token-balanced share of the
batch, against one unsharded rank on the same batch with the same threads per rank (`--threads`); `--mode full|lora`. Prints
tokens/s of the group, tokens/s per rank and, last, the ratio per-rank / single-rank (1.0 = perfect scaling).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._timing import fix_threads, spread  # noqa: E402
from workers.learner.inputs import LearnerBatch  # noqa: E402

# Real architectures by their published configs (transformers class, kwargs): built with random weights.
SHAPES = {
    "qwen3-0.6b": ("Qwen3", dict(hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                                 num_attention_heads=16, num_key_value_heads=8, head_dim=128, vocab_size=151936,
                                 tie_word_embeddings=True, rope_theta=1_000_000, max_position_embeddings=40960)),
    "qwen3-1.7b": ("Qwen3", dict(hidden_size=2048, intermediate_size=6144, num_hidden_layers=28,
                                 num_attention_heads=16, num_key_value_heads=8, head_dim=128, vocab_size=151936,
                                 tie_word_embeddings=True, rope_theta=1_000_000, max_position_embeddings=40960)),
    "qwen3-4b": ("Qwen3", dict(hidden_size=2560, intermediate_size=9728, num_hidden_layers=36,
                               num_attention_heads=32, num_key_value_heads=8, head_dim=128, vocab_size=151936,
                               tie_word_embeddings=True, rope_theta=1_000_000, max_position_embeddings=40960)),
    "qwen3-8b": ("Qwen3", dict(hidden_size=4096, intermediate_size=12288, num_hidden_layers=36,
                               num_attention_heads=32, num_key_value_heads=8, head_dim=128, vocab_size=151936,
                               tie_word_embeddings=False, rope_theta=1_000_000, max_position_embeddings=40960)),
    "llama3.1-8b": ("Llama", dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                                  num_attention_heads=32, num_key_value_heads=8, vocab_size=128256,
                                  rope_theta=500_000, max_position_embeddings=131072)),
}


def build_shape(name: str, layers: int | None, vocab: int | None, dtype: torch.dtype, device: str):
    """A randomly initialised causal LM of architecture `name` (SHAPES), optionally with fewer layers / a
    smaller vocabulary; nothing is downloaded."""
    import transformers

    arch, kw = SHAPES[name]
    kw = dict(kw, **({"num_hidden_layers": layers} if layers else {}), **({"vocab_size": vocab} if vocab else {}))
    config = getattr(transformers, f"{arch}Config")(**kw)
    torch.manual_seed(0)
    with torch.device(device):
        model = getattr(transformers, f"{arch}ForCausalLM")(config)
    return model.to(dtype)


def make_learner(args, old_logprobs: str, ranks=None, init: str | None = None):
    """The project's Learner around the tiny model or a `--shape` model (patched in where it loads weights)."""
    import workers.models.loading as models_mod
    from workers.credit import CreditConfig
    from workers.learner.config import LearnerConfig
    from workers.learner.inputs import RunSettings
    from workers.learner.learner import Learner
    from workers.learner.ranks import Ranks
    from workers.models.loading import build_tiny_model
    from workers.sync.scratch import node_temp_dir

    tiny = str(build_tiny_model(Path(node_temp_dir()) / "credit-orchestrator-tiny-0", seed=0))
    if args.shape:
        def load(_path, dtype=torch.float32, device="cpu"):
            return build_shape(args.shape, args.layers, args.vocab, dtype, device)

        models_mod.load_model = load
    cfg = LearnerConfig(old_logprobs=old_logprobs, gradient_checkpointing=args.checkpointing,
                        mode=getattr(args, "mode", "lora")).model_dump()
    cfg["optim"].update(micro_batch_size=args.micro or args.groups * args.group, lr=1e-5)
    return Learner(tiny, learner=LearnerConfig.model_validate(cfg),
                   credit=CreditConfig(advantage_mode="grpo", transform_mode="none"),
                   run=RunSettings(seed=0, total_steps=1000, dtype=args.dtype), ranks=ranks or Ranks(),
                   init_method=init)


def make_batch(args, vocab: int) -> LearnerBatch:
    gen = torch.Generator().manual_seed(1)
    b = args.groups * args.group
    prompts = torch.randint(4, vocab, (args.groups, args.prompt_len), generator=gen)
    lens = torch.randint(args.response_len // 2, args.response_len + 1, (b,), generator=gen)
    lens[0] = args.response_len
    return LearnerBatch(
        prompt_ids=[prompts[i // args.group].tolist() for i in range(b)],
        response_ids=[torch.randint(4, vocab, (int(n),), generator=gen).tolist() for n in lens],
        rollout_logprobs=[[-2.0] * int(n) for n in lens],
        rewards=(torch.rand(args.groups, args.group, generator=gen) < 0.5).float().tolist(),
        temperature=1.0, sepa_lambda=0.0, step=1,
    )


class BareStep:
    """Forward + backward + AdamW step of a plain policy-gradient loss on a PeftModel, micro-batched."""

    def __init__(self, model, micro: int, temperature: float = 1.0):
        self.model, self.micro, self.temperature = model, micro, temperature
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.opt = torch.optim.AdamW(self.params, lr=1e-5)

    def tensors(self, batch: LearnerBatch, pad_id: int, device: str) -> tuple:
        from workers.learner.batch import collate

        b = collate(batch, pad_id)
        flat = torch.tensor([r for g in batch.rewards for r in g])
        adv = (flat - flat.mean())[:, None].expand(-1, b.t)
        return b.seqs.to(device), b.attn.to(device), b.start.to(device), b.t, b.mask.to(device), adv.to(device)

    def __call__(self, seqs, attn, start, t, mask, adv) -> None:
        self.model.train()
        self.opt.zero_grad(set_to_none=True)
        total = mask.sum()
        for s in range(0, seqs.shape[0], self.micro):
            sl = slice(s, s + self.micro)
            logits = self.model(input_ids=seqs[sl], attention_mask=attn[sl]).logits
            idx = (start[sl, None] - 1 + torch.arange(t, device=seqs.device)[None]).clamp(max=seqs.shape[1] - 2)
            pred = logits.gather(1, idx[..., None].expand(-1, -1, logits.shape[-1])).float()
            lp = torch.log_softmax(pred / self.temperature, -1).gather(-1, seqs[sl].gather(1, idx + 1)[..., None])
            loss = -(lp.squeeze(-1) * adv[sl] * mask[sl]).sum() / total
            loss.backward()
        torch.nn.utils.clip_grad_norm_(self.params, 1.0)
        self.opt.step()


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


class PeakRSS:
    """Peak resident-set growth (MiB) while the block runs, polled from /proc every 2 ms (CPU runs: large
    tensors are mmap'd and returned to the OS when freed, so each step starts near the same baseline)."""

    def __enter__(self):
        import threading

        self.page = os.sysconf("SC_PAGE_SIZE")
        self.base = self.peak = self._rss()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._poll, daemon=True)
        self.thread.start()
        return self

    def _rss(self) -> int:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * self.page

    def _poll(self) -> None:
        while not self.stop.wait(0.002):
            self.peak = max(self.peak, self._rss())

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join()
        self.mib = (max(self.peak, self._rss()) - self.base) / 2**20


def _group_rank(rank: int, world: int, init: str, args, threads: int, out: str) -> None:
    """One rank of the `--ranks` run: the same batch on every rank, one warm-up, then `reps` timed steps."""
    from workers.learner.ranks import Ranks

    torch.set_num_threads(threads)
    if torch.cuda.is_available():
        os.environ["CUDA_VISIBLE_DEVICES"] = str(rank)  # one GPU per rank, as Ray gives each rank actor
    learner = make_learner(args, "rollout", Ranks(rank, world), init if world > 1 else None)
    batch = make_batch(args, learner.tokenizer.vocab_size if not args.shape else args.vocab or
                       SHAPES[args.shape][1]["vocab_size"])
    learner.train_step(batch)
    times = []
    for _ in range(args.reps):
        _sync(learner.device)
        t0 = time.perf_counter()
        learner.train_step(batch)
        _sync(learner.device)
        times.append(time.perf_counter() - t0)
    if rank == 0:
        tokens = sum(len(p) + len(r) for p, r in zip(batch.prompt_ids, batch.response_ids, strict=True))
        Path(out).write_text(f"{tokens} {statistics.median(times)} {' '.join(f'{t:.3f}' for t in times)}")


def main_ranks(args) -> None:
    """`--ranks N`: the learner group against one unsharded rank (see module docstring)."""
    import socket

    import torch.multiprocessing as mp

    threads = torch.get_num_threads()  # per rank, fixed (benchmarks/_timing.py)
    results = {}
    for world in (1, args.ranks):
        with socket.socket() as s, tempfile.NamedTemporaryFile(suffix=".txt") as out:
            s.bind(("127.0.0.1", 0))
            init = f"tcp://127.0.0.1:{s.getsockname()[1]}"
            s.close()
            mp.spawn(_group_rank, args=(world, init, args, threads, out.name), nprocs=world)
            tokens, med, *runs = Path(out.name).read_text().split()
        results[world] = (int(tokens), float(med), runs)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    print(f"model: {args.shape or 'tiny'}, mode {args.mode}, {device}, {threads} threads per rank, "
          f"batch {args.groups * args.group} seqs")
    for world, (tokens, med, runs) in results.items():
        print(f"{world} rank(s): {tokens / med:10,.0f} tokens/s  {tokens / med / world:10,.0f} tokens/s per rank  "
              f"median {med:.3f} s  runs {runs}")
    per_rank = {w: t / m / w for w, (t, m, _) in results.items()}
    print(f"ratio tokens/s per rank, {args.ranks} ranks / 1 rank: {per_rank[args.ranks] / per_rank[1]:.3f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shape", choices=sorted(SHAPES), help="random-init model of this architecture (no download)")
    ap.add_argument("--layers", type=int, help="override the shape's layer count (CPU runs)")
    ap.add_argument("--vocab", type=int, help="override the shape's vocabulary size (CPU runs)")
    ap.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16"])
    ap.add_argument("--groups", type=int, default=4)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--response-len", type=int, default=256)
    ap.add_argument("--micro", type=int, default=0, help="rows per micro-batch on both sides (0 = whole batch)")
    ap.add_argument("--checkpointing", action="store_true", help="gradient checkpointing on both sides")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--ranks", type=int, default=1, help="> 1: the learner group against one rank (see above)")
    ap.add_argument("--mode", default="lora", choices=["lora", "full"], help="learner.mode (with --ranks)")
    ap.add_argument("--threads", type=int, help="torch threads (per rank; default $BENCH_THREADS, else 1)")
    args = ap.parse_args()
    fix_threads(args.threads)
    if args.ranks > 1:
        main_ranks(args)
        return

    learners = {mode: make_learner(args, mode) for mode in ("rollout", "recompute")}
    rollout = learners["rollout"]
    device = rollout.device
    model_cfg = rollout.model.get_base_model().config
    batch = make_batch(args, model_cfg.vocab_size)
    bare = BareStep(rollout.model, args.micro or len(batch.response_ids))
    tensors = bare.tensors(batch, rollout.tokenizer.pad_token_id, device)
    n_tokens = int(tensors[1].sum())
    print(f"model: {args.shape or 'tiny'} (layers {model_cfg.num_hidden_layers}, hidden {model_cfg.hidden_size}, "
          f"vocab {model_cfg.vocab_size}, {rollout.dtype}) on {device}; batch {len(batch.response_ids)} seqs, "
          f"{n_tokens} tokens; micro {bare.micro}; checkpointing {args.checkpointing}; "
          f"torch threads {torch.get_num_threads()}")

    def timed(fn) -> tuple[float, float]:
        if device == "cuda":
            torch.cuda.reset_peak_memory_stats()
        _sync(device)
        with PeakRSS() as rss:
            t0 = time.perf_counter()
            fn()
            _sync(device)
            dt = time.perf_counter() - t0
        peak = torch.cuda.max_memory_allocated() / 2**20 if device == "cuda" else rss.mib
        return dt, peak

    sides = {
        "learner (rollout)": lambda: rollout.train_step(batch),
        "learner (recompute)": lambda: learners["recompute"].train_step(batch),
        "bare": lambda: bare(*tensors),
    }
    for fn in sides.values():  # warm-up
        fn()
    results: dict[str, list[tuple[float, float]]] = {k: [] for k in sides}
    names = list(sides)
    for rep in range(args.reps):  # interleaved, order rotated, so all see the same background load
        for name in names[rep % 3:] + names[:rep % 3]:
            results[name].append(timed(sides[name]))
    peaks = {k: statistics.median(p for _, p in v) for k, v in results.items()}
    med = {k: statistics.median(t for t, _ in v) for k, v in results.items()}
    for k in sides:
        print(f"{k:20s} {n_tokens / med[k]:12,.0f} tokens/s  median {med[k]:.3f} s  peak {peaks[k]:,.0f} MiB  "
              f"runs {[round(t, 3) for t, _ in results[k]]}")
    pairs = lambda k: [b[0] / a[0] for a, b in zip(results[k], results["bare"], strict=True)]  # noqa: E731
    print(f"ratio learner(recompute)/bare tokens/s: {spread(pairs('learner (recompute)'))}")
    print(f"ratio learner(rollout)/bare tokens/s (interleaved pairs): {spread(pairs('learner (rollout)'))} "
          "(target >= 0.9)")


if __name__ == "__main__":
    main()
