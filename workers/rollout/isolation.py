"""The pool engine's isolation probe (issue 56): does a slot's request depend on which other requests share its
batch? Teacher-forced log-probs of a slot's own sequences (log p(token t | tokens < t) under its adapter, at a
few positions of each) are scored twice on the engine: alone, then in one batch with the same sequences, in reverse
order, under every other adapter the engine holds (its own again when it holds no other). Continuous batching
puts the second set in the same forward passes, so a kernel whose reduction order follows the batch's shape
(GPU kernels without `VLLM_BATCH_INVARIANT`) moves the first set's log-probs; vLLM-CPU and batch-invariant kernels
give the same bits. The report (orchestrator/report/sections/isolation.py) says which held.

The engine must be idle while a probe runs (shared.py: a draining call), so nothing of another trial is stepped
or read here."""

from __future__ import annotations

import itertools
import os
from dataclasses import asdict, dataclass, replace

_IDS = itertools.count()


@dataclass(frozen=True)
class IsolationProbe:
    """One engine's probe of one slot: `tokens` log-probs compared, the largest absolute difference between the
    alone and mixed scores (nats), whether every one was identical, how many requests (prefixes) shared the mixed
    batch, the mean log-prob alone (which adapter scored them: tests check it against the PEFT model), and the
    engine process's own facts: whether it runs vLLM's batch-invariant kernels, and on a GPU."""

    tokens: int
    max_abs_diff: float
    identical: bool
    batch: int
    mean_logprob: float
    batch_invariant: bool = False
    gpu: bool = False

    def record(self) -> dict[str, float | int | bool]:
        return asdict(self)


POSITIONS = 8  # positions scored per sequence, evenly spaced, the last included: one prefill each


def positions(length: int, most: int = POSITIONS) -> list[int]:
    """Up to `most` positions t in [1, length), evenly spaced, the last one included (t = length - 1)."""
    n = min(most, length - 1)
    return sorted({length - 1 - (i * (length - 2)) // max(n - 1, 1) for i in range(n)}) if n > 0 else []


def score_params(token: int, seed: int):
    """log p(`token` | prompt) at the sampling position (`logprob_token_ids`: the given token's log-prob, at
    temperature 1 the model's own), one token sampled from the request's own seed and ignored. The prefix cache is
    not read, so every score is a whole prefill in the batch it runs in, not a cache hit from another batch.
    (vLLM's `prompt_logprobs` would score every position at once, but fails under a LoRA adapter on vLLM-CPU:
    its LoRA logits path is sized for the sampled positions.)"""
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    return SamplingParams(max_tokens=1, temperature=1.0, seed=seed, logprobs=None, logprob_token_ids=[token],
                          skip_reading_prefix_cache=True, detokenize=False,
                          output_kind=RequestOutputKind.FINAL_ONLY)


def teacher_forced(engine, sequences: list[list[int]], loras: list, on_step=None) -> list[list[float]]:
    """log p(s[t] | s[:t]) at `positions(len(s))` of each sequence under its LoRA request (None: the base), every
    prefix added to `engine` (a vLLM `LLMEngine`, idle) at once and stepped until each finished (`on_step()` after
    each step: the engine's liveness counts them)."""
    rids: list[list[tuple[str, int]]] = []
    for seq, lora in zip(sequences, loras, strict=True):
        rids.append([])
        for t in positions(len(seq)):
            rid = f"isolation-{next(_IDS)}"
            engine.add_request(rid, {"prompt_token_ids": list(seq[:t])}, score_params(seq[t], t), lora_request=lora)
            rids[-1].append((rid, seq[t]))
    done: dict[str, object] = {}
    while len(done) < sum(map(len, rids)):
        for out in engine.step():
            if out.finished:
                done[out.request_id] = out
        if on_step is not None:
            on_step()
    return [[done[rid].outputs[0].logprobs[0][tok].logprob for rid, tok in seq] for seq in rids]


def compare(alone: list[list[float]], mixed: list[list[float]], batch: int) -> IsolationProbe:
    """The probe's answer from the same sequences' scores alone and in the mixed batch."""
    pairs = [(a, m) for sa, sm in zip(alone, mixed, strict=True) for a, m in zip(sa, sm, strict=True)]
    diffs = [abs(a - m) for a, m in pairs]
    mean = sum(a for a, _ in pairs) / len(pairs) if pairs else 0.0
    return IsolationProbe(len(pairs), max(diffs, default=0.0), all(a == m for a, m in pairs), batch, mean)


def probe(engine, sequences: list[list[int]], own, others: list, on_step=None) -> IsolationProbe:
    """`sequences` scored under `own` alone, then first in one batch with the reversed sequences under each of
    `others` (the engine's other adapters; `own` again when there is none)."""
    alone = teacher_forced(engine, sequences, [own] * len(sequences), on_step)
    neighbours = [(seq, lora) for lora in (others or [own]) for seq in reversed(sequences)]
    seqs = [*sequences, *(s for s, _ in neighbours)]
    mixed = teacher_forced(engine, seqs, [*([own] * len(sequences)), *(lo for _, lo in neighbours)], on_step)
    out = compare(alone, mixed[:len(sequences)], sum(len(positions(len(s))) for s in seqs))
    return replace(out, **engine_facts())


def engine_facts() -> dict[str, bool]:
    """This engine process's kernels: batch-invariant (VLLM_BATCH_INVARIANT, set in its environment before vLLM
    was imported: orchestrator/config/pool_key.py:engine_env) and on a GPU (a CPU engine has no device visible)."""
    import torch

    return {"batch_invariant": os.environ.get("VLLM_BATCH_INVARIANT") == "1", "gpu": torch.cuda.is_available()}
