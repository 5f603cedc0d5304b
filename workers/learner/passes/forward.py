"""The learner's forward passes: response-window log-probs under the policy or the frozen reference, and this
rank's micro-batches of a (mini-)batch. Shared by the scoring pass (workers/learner/passes/scoring.py) and the update
(workers/learner/update.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn

from workers.learner.batch import Batch, micro_batches
from workers.learner.modules import response_source
from workers.learner.passes.token_stats import TokenStats, token_stats
from workers.learner.ranks import pad_passes, split_rows
from workers.objectives.probability_floor import floored_token_logprobs

if TYPE_CHECKING:
    from workers.learner.config import OptimConfig
    from workers.learner.context import Layout, Scoring


class PolicyForward:
    """Forward passes of the policy `model` and the KL `reference` (full mode: a frozen copy; None under lora,
    where the reference is the model with its adapter disabled). `head_only`: the model's LM head is a plain
    Linear, applied only at the response positions. Counts its reference passes (`reference_passes`), so tests
    can check that KL coef 0 costs none."""

    def __init__(self, model: nn.Module, reference: nn.Module | None, layout: Layout, *, head_only: bool,
                 optim: OptimConfig) -> None:
        self.model, self.reference, self.layout = model, reference, layout
        self.head_only, self.optim = head_only, optim
        self.reference_passes = 0

    def passes(self, b: Batch, rows: Tensor) -> list:
        """This rank's micro-batches of `rows` as (micro-batch, real) pairs, padded so every rank runs as many
        passes (workers/learner/ranks.py); one rank: its micro-batches, all real."""
        ranks, optim = self.layout.ranks, self.optim
        shares = split_rows(rows, b.attn.sum(-1), ranks.world)
        mine = list(micro_batches(b, shares[ranks.rank], optim))
        if not ranks.grouped:
            return [(m, True) for m in mine]
        counts = [len(mine) if k == ranks.rank else sum(1 for _ in micro_batches(b, s, optim))
                  for k, s in enumerate(shares)]
        return pad_passes(mine, counts, next(micro_batches(b, rows[:1], optim)))

    def logprobs(self, seqs: Tensor, attn: Tensor, comp_start: Tensor, comp_len: int, scoring: Scoring,
                 want_stats: bool = False, model: nn.Module | None = None) -> tuple[Tensor, TokenStats | None]:
        """Response-window log-probs `[b, comp_len]` from one forward pass of `model` (default: the policy), and
        with `want_stats` their TokenStats (entropy, `scoring.signal` when it reads the logits, the first
        position's logits), all at the sampling temperature.

        The decoder runs over the whole sequence and the LM head only at the response positions; the log-probs
        (log_softmax(z)[y] = z[y] - logsumexp(z)) and the entropy come from chunks of `optim.logits_chunk`
        positions (workers/learner/passes/token_stats.py): no `[b, comp_len, V]` float32 logits, in forward or backward.
        Under the probability floor the first response token (the action position) is scored under the floored
        distribution the sampler drew it from.
        """
        device, floor = self.layout.device, scoring.floor
        idx = comp_start[:, None] - 1 + torch.arange(comp_len)[None, :]  # logits at p-1 predict token p
        idx = idx.clamp(max=seqs.shape[1] - 2).to(device)
        ids, mask = seqs.to(device), attn.to(device)
        source, head = response_source(model if model is not None else self.model, ids, mask, idx, self.head_only,
                                       self.layout.sharded)
        targets = ids.gather(1, idx + 1)
        stats = token_stats(source, targets, scoring.temperature, self.optim.logits_chunk, head=head,
                            entropy=want_stats, signal=scoring.signal if want_stats else None, first=floor is not None)
        lp = stats.lp
        if floor is not None:  # the action position under the floored distribution; the rest as they are
            positions = torch.ones_like(targets[:, :1], dtype=torch.bool)
            first = floored_token_logprobs(stats.first[:, None], targets[:, :1], floor[0], floor[1], 1.0,
                                           positions=positions)
            lp = torch.cat([first, lp[:, 1:]], 1)
        return lp, (stats if want_stats else None)

    def reference_logprobs(self, seqs: Tensor, attn: Tensor, comp_start: Tensor, comp_len: int,
                           scoring: Scoring) -> Tensor:
        """Log-probs under the frozen reference: the base model with the adapter disabled (lora: no second copy),
        or the frozen copy of the initial policy (full)."""
        self.reference_passes += 1
        if self.reference is not None:
            return self.logprobs(seqs, attn, comp_start, comp_len, scoring, False, self.reference)[0]
        with self.model.disable_adapter():
            lp, _ = self.logprobs(seqs, attn, comp_start, comp_len, scoring, False)
        return lp
