"""The learner's no-grad scoring pass: the batch under the current policy before the step's first update (pi_old,
the uncertainty signal, the entropy, the reference's log-probs and the critic's old values)."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import torch

from workers.credit import CreditConfig, token_uncertainty
from workers.learner.batch import Batch, Scored
from workers.learner.ranks import gather_rows, min_over_ranks
from workers.objectives.interventions import InterventionsConfig
from workers.objectives.probability_floor import floor_probs

if TYPE_CHECKING:
    from workers.learner.context import Scoring
    from workers.learner.passes.forward import PolicyForward


class Scorer:
    """Scores batches with `forward`'s policy (and reference) and the `critic` (None without one)."""

    def __init__(self, forward: PolicyForward, critic, credit: CreditConfig, iv: InterventionsConfig) -> None:
        self.forward, self.critic, self.credit, self.iv = forward, critic, credit, iv

    def score(self, b: Batch, scoring: Scoring) -> Scored:
        """Score the batch with the current policy (no grad): log-probs, uncertainty signal, entropy, reference
        log-probs (KL on or measured) and, under the probability floor, the smallest valid action probability.
        In eval mode: pi_old, the reference and the old values are the models themselves, without LoRA dropout."""
        model = self.forward.model
        model.eval()
        if self.critic is not None:
            self.critic.train(False)
        try:
            return self._score_eval(b, scoring)
        finally:
            model.train()
            if self.critic is not None:
                self.critic.train(True)

    def _score_eval(self, b: Batch, scoring: Scoring) -> Scored:
        iv, fwd, floor = self.iv, self.forward, scoring.floor
        use_ref = iv.kl.is_active or iv.kl.measure
        kind = self.credit.uncertainty_kind  # surprisal reads the log-probs; the others the logits, chunk by chunk
        signal_scoring = dataclasses.replace(scoring, signal=None if kind == "surprisal" else kind)
        lps, sigs, ents, refs, action_min, vals, order = [], [], [], [], [], [], []
        with torch.no_grad():
            for (seqs, attn, start, length, _, r), real in fwd.passes(b, torch.arange(b.size)):
                window = (seqs, attn, start, length)
                lp, stats = fwd.logprobs(*window, signal_scoring, True)
                ref = fwd.reference_logprobs(*window, scoring) if use_ref else None
                val = None
                if self.critic is not None:
                    with self.critic.active():
                        val = self.critic.values(*window)
                if not real:  # a pass that only keeps the group's collectives in step
                    continue
                order.append(r)
                lps.append(lp.float().cpu())
                sig = token_uncertainty(kind, logprobs=lp) if stats.signal is None else stats.signal
                sigs.append(sig.float().cpu())
                ents.append(stats.entropy.float().cpu())
                if ref is not None:
                    refs.append(ref.float().cpu())
                if val is not None:
                    vals.append(val.float().cpu())
                if floor is not None:  # every valid action's probability at the action position
                    valid = torch.zeros(stats.first.shape[-1], dtype=torch.bool, device=stats.first.device)
                    valid[floor[0]] = True
                    action_min.append(float(floor_probs(stats.first, valid, floor[1], 1.0)[:, floor[0]].exp().min()))

        def cat(parts, on: bool = True):  # micro-batches packed by tokens may reorder the rows
            return (torch.cat(parts) if parts else torch.zeros(0, b.t)) if on else None

        ranks = fwd.layout.ranks
        rows = torch.cat(order) if order else torch.zeros(0, dtype=torch.long)
        full = gather_rows(rows, {"lp": cat(lps), "sig": cat(sigs), "ent": cat(ents), "ref": cat(refs, use_ref),
                                  "val": cat(vals, self.critic is not None)}, b.size, ranks)
        low = min_over_ranks(min(action_min) if action_min else None, ranks)
        return Scored(full["lp"], full["sig"], full["ent"], full["ref"], low, full["val"])
