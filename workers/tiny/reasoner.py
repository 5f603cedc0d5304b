"""The local tiny reasoning model (`model: {name: tiny-reasoner}`): a warm-started policy that shows the science.

`build_reasoner(out_dir, spec)` writes, deterministically from `spec.seed` and cached by the whole spec:
- a byte-level BPE tokenizer (the `tokenizers` library) trained on a synthetic corpus of chained-arithmetic
  prompts and step-by-step solutions (`workers.tasks.chain`); digits are single tokens, words are subword
  pieces, so strategic grams are often split across tokens ("Ġdouble" + "Ġch" + "eck");
- a small Llama supervised (next-token cross-entropy on completion tokens) on freshly drawn solutions written
  with `TraceStyle`: deliberate mistakes that the rest of the solution builds on, caught mistakes
  ("wait let me check ..."), verifications and plans, so the starting policy is imperfect, checking a step pays
  off, and planning tokens are a few percent of what it writes.

Only problems with `problem_fraction(id) >= 0.5` are in the corpus, so the chain task's held-out problems
(`heldout_fraction <= 0.5`) are never seen in supervision.

The build runs on CPU with at most `spec.threads` torch threads (float reductions depend on the thread count;
a fixed count keeps the weights the same across runs on a machine). `reasoner_dir(seed)` is the cache the trial
loop uses; concurrent builders on one node take a file lock and the first one builds.

Run `python -m workers.tiny.reasoner [--eval N]` to build (or find) the default model and measure it.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import math
import os
import shutil
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch

from workers.sync.scratch import node_temp_dir
from workers.tasks.chain import (
    CORPUS_MIN_FRACTION,
    Chain,
    TraceStyle,
    problem_fraction,
    random_chain,
    solution_trace,
)

NAME = "tiny-reasoner"
SPECIAL = ["<pad>", "<unk>", "<bos>", "<eos>"]
MARKER = "reasoner.json"
VERSION = 1


@dataclass(frozen=True)
class ReasonerSpec:
    """Everything the built model depends on (the cache key)."""

    seed: int = 0
    # task the corpus is drawn from
    chain_steps: int = 3
    chain_max_value: int = 19
    style: TraceStyle = field(default_factory=TraceStyle)
    # tokenizer
    vocab_size: int = 320  # 256 byte symbols + 4 special + 60 merges: frequent words whole, rarer ones split
    tokenizer_texts: int = 4000
    # model (vLLM's CPU attention needs head_dim in {32, 64, 80, 96, 112, 128, ...})
    hidden: int = 128
    layers: int = 2
    heads: int = 2
    kv_heads: int = 1
    intermediate: int = 512
    # supervised training
    sft_steps: int = 350
    batch: int = 64
    lr: float = 3e-3
    warmup: int = 30
    threads: int = 1  # one thread: the same weights on any machine, and no spin-waiting on a busy one

    def key(self) -> str:
        blob = json.dumps({"version": VERSION, **asdict(self)}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:12]


def reasoner_dir(seed: int = 0) -> Path:
    """Where trials find the model of `model: {name: tiny-reasoner, tiny_seed: seed}` (the trial loop's cache
    for locally built models: `<tmp>/credit-orchestrator-<name>-<seed>`); rebuilt there when the spec changes."""
    return Path(node_temp_dir()) / f"credit-orchestrator-{NAME}-{seed}"


def build_tiny_reasoner(out_dir: str | os.PathLike | None = None, seed: int = 0) -> Path:
    """The default reasoner of `seed` (the builder signature of workers/tiny/local.py)."""
    return build_reasoner(out_dir if out_dir is not None else reasoner_dir(seed), ReasonerSpec(seed=seed))


def corpus_chain(rng: np.random.Generator, spec: ReasonerSpec) -> Chain:
    """A random chain outside every held-out split (problem_fraction >= 0.5)."""
    while True:
        c = random_chain(rng, spec.chain_steps, spec.chain_max_value)
        if problem_fraction(c.id) >= CORPUS_MIN_FRACTION:
            return c


def _train_tokenizer(spec: ReasonerSpec, rng: np.random.Generator):
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    texts = []
    for _ in range(spec.tokenizer_texts):
        c = corpus_chain(rng, spec)
        texts.append(c.prompt() + solution_trace(c, rng, spec.style))
    tok = Tokenizer(models.BPE())
    # one token per digit (a leading space rides on the first digit), GPT-2 style word pieces otherwise
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(r" ?\d"), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=spec.vocab_size, special_tokens=SPECIAL, min_frequency=2,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts, trainer)
    return tok


def _batch(spec: ReasonerSpec, rng: np.random.Generator, tok, eos: int, pad: int):
    """(input ids [B, L], loss targets [B, L] with -100 off the completion) of freshly drawn solutions."""
    chains = [corpus_chain(rng, spec) for _ in range(spec.batch)]
    prompts = tok.encode_batch([c.prompt() for c in chains])
    comps = tok.encode_batch([solution_trace(c, rng, spec.style) for c in chains])
    rows = [(p.ids, c.ids + [eos]) for p, c in zip(prompts, comps, strict=True)]
    width = max(len(p) + len(c) for p, c in rows)
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    labels = torch.full((len(rows), width), -100, dtype=torch.long)
    for i, (p, c) in enumerate(rows):
        ids[i, : len(p) + len(c)] = torch.tensor(p + c)
        labels[i, len(p) : len(p) + len(c)] = torch.tensor(c)
    return ids, labels


def build_reasoner(out_dir: str | os.PathLike | None = None, spec: ReasonerSpec = ReasonerSpec(),
                   log: bool = False) -> Path:
    """Build (or find cached) the reasoner of `spec` in `out_dir` (default `reasoner_dir(spec)`); returns it.

    The directory holds a Hugging Face Llama model + `PreTrainedTokenizerFast` (loads in transformers and
    vLLM by path) and `reasoner.json` (the spec and the build's measurements). Built in a temporary sibling
    and renamed into place, under a file lock, so concurrent callers never see a half-written model.
    """
    out = Path(out_dir) if out_dir is not None else reasoner_dir(spec.seed)
    want = {"version": VERSION, **asdict(spec)}

    def built() -> bool:
        m = out / MARKER
        return m.exists() and json.loads(m.read_text()).get("spec") == want

    if built():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.parent / f".{out.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if built():
            return out
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
        try:
            info = _build(tmp, spec, log)
            (tmp / MARKER).write_text(json.dumps({"spec": want, **info}, indent=1))
            if out.exists():
                shutil.rmtree(out)
            tmp.rename(out)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
    return out


def _build(out: Path, spec: ReasonerSpec, log: bool) -> dict:
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    t0, cpu0 = time.perf_counter(), time.process_time()
    threads = torch.get_num_threads()
    rng_state = torch.random.get_rng_state()
    torch.set_num_threads(max(1, min(spec.threads, os.cpu_count() or 1)))
    try:
        rng = np.random.default_rng([spec.seed, 1])
        tok = _train_tokenizer(spec, rng)
        ids = {t: tok.token_to_id(t) for t in SPECIAL}
        hf_tok = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<bos>", eos_token="<eos>",
                                         pad_token="<pad>", unk_token="<unk>", clean_up_tokenization_spaces=False)
        config = LlamaConfig(
            vocab_size=tok.get_vocab_size(), hidden_size=spec.hidden, intermediate_size=spec.intermediate,
            num_hidden_layers=spec.layers, num_attention_heads=spec.heads, num_key_value_heads=spec.kv_heads,
            head_dim=spec.hidden // spec.heads, max_position_embeddings=512, rms_norm_eps=1e-5,
            bos_token_id=ids["<bos>"], eos_token_id=ids["<eos>"], pad_token_id=ids["<pad>"],
            tie_word_embeddings=False,
        )
        torch.manual_seed(spec.seed)
        model = LlamaForCausalLM(config)
        opt = torch.optim.AdamW(model.parameters(), lr=spec.lr, betas=(0.9, 0.98), weight_decay=0.01)

        def lr_at(step: int) -> float:
            if step < spec.warmup:
                return (step + 1) / spec.warmup
            frac = (step - spec.warmup) / max(1, spec.sft_steps - spec.warmup)
            return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac))

        sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_at)
        data_rng = np.random.default_rng([spec.seed, 2])
        model.train()
        losses = []
        for step in range(spec.sft_steps):
            x, y = _batch(spec, data_rng, tok, ids["<eos>"], ids["<pad>"])
            loss = model(input_ids=x, attention_mask=(x != ids["<pad>"]).long(), labels=y).loss
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            losses.append(float(loss.detach()))
            if log and (step % 100 == 0 or step == spec.sft_steps - 1):
                print(f"[{NAME}] sft step {step}/{spec.sft_steps} loss {np.mean(losses[-50:]):.4f} "
                      f"({time.perf_counter() - t0:.0f}s wall, {time.process_time() - cpu0:.0f}s cpu)", flush=True)
        model.eval()
        model.generation_config.do_sample = True
        model.save_pretrained(out, safe_serialization=True)
        hf_tok.save_pretrained(out)
    finally:
        torch.set_num_threads(threads)
        torch.random.set_rng_state(rng_state)
    return {"build_s": round(time.perf_counter() - t0, 1), "build_cpu_s": round(time.process_time() - cpu0, 1),
            "final_loss": float(np.mean(losses[-50:])),
            "vocab_size": tok.get_vocab_size()}


# ------------------------------------------------------------------------------------------- measurement
@dataclass
class ReasonerEval:
    """Measured on held-out chain problems by sampling at `temperature`."""

    pass_at_1: float
    planning_frac: float  # planning tokens / completion tokens (EOS excluded)
    split_gram_frac: float  # share of gram occurrences with a word split across tokens ("doub" + "le")
    completion_tokens: float  # mean per completion
    problems: int
    samples: int

    def __str__(self) -> str:
        return (f"pass@1 {self.pass_at_1:.3f}, planning tokens {100 * self.planning_frac:.2f}% of completion "
                f"tokens, {100 * self.split_gram_frac:.0f}% of gram occurrences split inside a word, "
                f"{self.completion_tokens:.1f} tokens per completion ({self.problems} problems x {self.samples})")


def evaluate_reasoner(model_dir: str | os.PathLike, problems: Sequence, *, samples: int = 4, temperature: float = 1.0,
                      max_new_tokens: int = 64, seed: int = 0, model=None) -> ReasonerEval:
    """Sample `samples` completions per problem with transformers (no vLLM) and measure the targets.

    `problems`: `workers.tasks.Problem`s of the chain task (e.g. `ChainTask(...).heldout(64)`); `model`: an
    already loaded model to sample from instead of the one in `model_dir` (e.g. with a trained adapter).
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from workers.credit.planning import match_spans, planning_mask
    from workers.models.loading import token_pieces
    from workers.tasks.chain import final_answer

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = model or AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model.eval()
    gen = torch.Generator().manual_seed(seed)
    correct = plan_tokens = tokens = grams = split = 0
    eos, pad = tok.eos_token_id, tok.pad_token_id
    by_len: dict[int, list] = {}  # prompts of equal token length are sampled as one batch (no padding)
    for prob in problems:
        prompt = tok(prob.prompt)["input_ids"]
        by_len.setdefault(len(prompt), []).append((prob, prompt))
    with torch.no_grad():
        for items in by_len.values():
            x = torch.tensor([prompt for _, prompt in items for _ in range(samples)])
            done = torch.zeros(x.shape[0], dtype=torch.bool)
            out, past, cur = [], None, x
            for _ in range(max_new_tokens):  # plain sampling loop: reproducible from `gen`
                o = model(input_ids=cur, past_key_values=past, use_cache=True)
                past = o.past_key_values
                probs = torch.softmax(o.logits[:, -1].float() / temperature, dim=-1)
                nxt = torch.multinomial(probs, 1, generator=gen).squeeze(1)
                nxt = torch.where(done, torch.full_like(nxt, pad), nxt)
                out.append(nxt)
                done |= nxt == eos
                cur = nxt[:, None]
                if bool(done.all()):
                    break
            seqs = torch.stack(out, 1).tolist()
            for row, ids in enumerate(seqs):
                prob = items[row // samples][0]
                ids = ids[: ids.index(eos)] if eos in ids else [i for i in ids if i != pad]
                text = tok.decode(ids, skip_special_tokens=True)
                correct += final_answer(text) == int(prob.answer)
                pieces = token_pieces(tok, ids)
                plan_tokens += sum(planning_mask(pieces))
                tokens += len(ids)
                text = "".join(pieces)
                bounds = set(np.cumsum([len(p) for p in pieces]).tolist())
                for s, e in match_spans(text):  # a token boundary inside a word of the gram: a subword split
                    grams += 1
                    split += any(b in bounds and text[b - 1].isalpha() and text[b].isalpha() for b in range(s + 1, e))
    n = len(problems) * samples
    return ReasonerEval(pass_at_1=correct / max(n, 1), planning_frac=plan_tokens / max(tokens, 1),
                        split_gram_frac=split / max(grams, 1), completion_tokens=tokens / max(n, 1),
                        problems=len(problems), samples=samples)


def main(argv: Sequence[str] | None = None) -> None:
    import argparse

    from workers.tasks import make_task, task_config

    ap = argparse.ArgumentParser(description="Build (or find cached) the tiny reasoning model and measure it.")
    ap.add_argument("--out", default=None, help="directory (default: the trial loop's cache, reasoner_dir)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--eval", type=int, default=0, help="held-out problems to measure on (0: skip)")
    ap.add_argument("--samples", type=int, default=4)
    args = ap.parse_args(argv)
    spec = ReasonerSpec(seed=args.seed)
    t0 = time.perf_counter()
    path = build_reasoner(args.out if args.out else reasoner_dir(spec.seed), spec, log=True)
    info = json.loads((path / MARKER).read_text())
    print(f"{NAME}: {path} (built in {info['build_s']}s wall, {info.get('build_cpu_s')}s cpu, final loss {info['final_loss']:.4f}; "
          f"this call {time.perf_counter() - t0:.1f}s)")
    if args.eval:
        task = make_task(task_config(name="chain", chain_steps=spec.chain_steps, chain_max_value=spec.chain_max_value),
                         0)
        print(evaluate_reasoner(path, task.heldout(args.eval), samples=args.samples))


if __name__ == "__main__":
    main()
