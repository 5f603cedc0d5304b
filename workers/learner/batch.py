"""A training batch as padded tensors, and how the learner cuts it: PPO mini-batches (one optimizer step each)
and micro-batches (one forward/backward each, gradients accumulated).

`[B, T]` tensors cover the response window (everything after the prompt); B = n_groups * group, grouped by prompt
/ level. Pure data handling: no model, no optimizer.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

if TYPE_CHECKING:
    from workers.learner.config import OptimConfig
    from workers.learner.inputs import LearnerBatch


def pad(rows: list[list[Any]], fill: Any, dtype: torch.dtype) -> Tensor:
    """Right-pad `rows` with `fill` to their longest row: `[len(rows), max_len]`."""
    width = max((len(r) for r in rows), default=0)
    return torch.tensor([list(r) + [fill] * (width - len(r)) for r in rows], dtype=dtype)


@dataclass(frozen=True)
class Batch:
    """One training batch as padded tensors. `mask` is the loss mask."""

    seqs: Tensor  # [B, P + T] long: prompt + response ids, right-padded
    attn: Tensor  # [B, P + T] long
    start: Tensor  # [B] long: index of the first response id in seqs
    mask: Tensor  # [B, T] bool
    sampled: Tensor  # [B, T] bool: the ids vLLM sampled (the loss mask unless it covers forced tokens too)
    old_lp: Tensor  # [B, T] float32: rollout log-probs (0 where mask is False)
    rewards: Tensor  # [N, G] float32: episode returns
    response_rows: list[list[int]]
    mask_rows: list[list[bool]]

    @property
    def size(self) -> int:
        return len(self.response_rows)

    @property
    def t(self) -> int:
        return self.mask.shape[1]

    @property
    def n_groups(self) -> int:
        return self.rewards.shape[0]

    @property
    def group(self) -> int:
        return self.rewards.shape[1]


@dataclass(frozen=True)
class Scored:
    """The no-grad scoring pass over a batch; `[B, T]` float32 tensors on the CPU."""

    learner_lp: Tensor
    signals: Tensor
    entropy: Tensor
    ref_lp: Tensor | None
    action_min: float | None
    values: Tensor | None = None  # the critic's values before this step's updates (GAE)


def collate(batch: LearnerBatch, pad_id: int) -> Batch:
    """Pad a batch of plain lists (workers/learner/inputs.py) into tensors; checks the rows line up."""
    prompts, responses = batch.prompt_ids, batch.response_ids
    masks = batch.loss_mask or [[True] * len(r) for r in responses]
    old = batch.rollout_logprobs
    if not len(prompts) == len(responses) == len(masks) == len(old):
        raise ValueError("prompt_ids, response_ids, loss_mask and rollout_logprobs need one row per sequence")
    for r, m, lp in zip(responses, masks, old, strict=True):
        if not len(r) == len(m) == len(lp):
            raise ValueError(f"a response of {len(r)} ids has {len(m)} mask flags and {len(lp)} log-probs")
    rewards = torch.tensor(batch.rewards, dtype=torch.float32)
    if rewards.dim() != 2 or rewards.numel() != len(responses):
        raise ValueError(f"rewards must be [N][G] with N*G = {len(responses)} sequences")
    masks = [[bool(x) for x in m] for m in masks]
    sampled = batch.sampled_mask or masks
    if [len(x) for x in sampled] != [len(m) for m in masks]:
        raise ValueError("sampled_mask needs one flag per response id")
    return Batch(
        seqs=pad([p + r for p, r in zip(prompts, responses, strict=True)], pad_id, torch.long),
        attn=pad([[1] * (len(p) + len(r)) for p, r in zip(prompts, responses, strict=True)], 0, torch.long),
        start=torch.tensor([len(p) for p in prompts]),
        mask=pad(masks, False, torch.bool), sampled=pad([[bool(x) for x in m] for m in sampled], False, torch.bool),
        old_lp=pad([[lp if m else 0.0 for lp, m in zip(row, mrow, strict=True)]
                    for row, mrow in zip(old, masks, strict=True)], 0.0, torch.float32),
        rewards=rewards, response_rows=[list(r) for r in responses], mask_rows=masks,
    )


def loss_totals(b: Batch, rows: Tensor) -> dict[str, float]:
    """Loss-aggregation denominators of one mini-batch (its loss-mask tokens and sequences)."""
    return {"total_tokens": float(b.mask[rows].sum()), "total_seqs": float(len(rows))}


def sampled_runs(flags: list[bool]) -> list[tuple[int, int]]:
    """[start, end) of each maximal run of True in `flags` (the turns of a multi-turn response)."""
    out, start = [], None
    for i, f in enumerate([*flags, False]):
        if f and start is None:
            start = i
        elif not f and start is not None:
            out.append((start, i))
            start = None
    return out


def mini_batches(size: int, optim: OptimConfig, seed: int, step: int) -> list[Tensor]:
    """Row indices of each optimizer step: `ppo_epochs` passes over a shuffle of the batch seeded by (seed, step),
    cut into `mini_batch_size` rows. The default (one mini-batch, one epoch) is the batch in order: one step."""
    mbs, epochs = optim.mini_batch_size or size, optim.ppo_epochs
    if mbs >= size and epochs == 1:
        return [torch.arange(size)]
    gen = torch.Generator().manual_seed(seed * 1_000_003 + step)
    return [chunk for _ in range(epochs) for chunk in torch.randperm(size, generator=gen).split(mbs)]


def micro_batches(b: Batch, rows: Tensor, optim: OptimConfig) -> Iterator[tuple[Tensor, Tensor, Tensor, int, Tensor, Tensor]]:
    """(seqs, attn, start, length, loss mask, rows) of each micro-batch of `rows`: `micro_batch_size` rows in
    order, or with `max_tokens_per_micro_batch` rows packed greedily by length (longest first, a micro-batch grows
    while rows x its longest sequence fits the budget; a longer sequence goes alone) with the columns cut to the
    micro-batch's longest sequence."""
    budget = optim.max_tokens_per_micro_batch
    if not budget:
        mb = optim.micro_batch_size
        for s in range(0, len(rows), mb):
            r = rows[s:s + mb]
            yield b.seqs[r], b.attn[r], b.start[r], b.t, b.mask[r], r
        return
    lengths = b.attn[rows].sum(-1)
    packed, current, width = [], [], 0
    for i in torch.argsort(lengths, descending=True, stable=True).tolist():
        if current and (len(current) + 1) * width > budget:
            packed.append(current)
            current = []
        if not current:
            width = int(lengths[i])
        current.append(i)
    packed += [current] if current else []
    for idx in packed:
        r = rows[torch.tensor(idx)]
        cols = max(int(lengths[idx].max()), 2)
        yield b.seqs[r, :cols], b.attn[r, :cols], b.start[r], b.t, b.mask[r], r
