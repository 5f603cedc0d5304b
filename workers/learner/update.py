"""The learner's optimisation: PPO updates over mini-batches (policy, then critic), gradient accumulated over
micro-batches, with the regularisers (KL to the reference, entropy bonus, entropy floors). A mixin of
`workers.learner.learner.Learner`; in a group each rank runs its share of every mini-batch (`Learner._passes`) and the
loss parts it reports are summed over the ranks.
"""

from __future__ import annotations

import torch
from torch import Tensor

from workers.learner.batch import Batch, Scored, loss_totals, mini_batches
from workers.learner.modules import clip_grad_norm
from workers.learner.ranks import gather_rows, sum_over_ranks
from workers.objectives.losses import aggregate, entropy_from_logits, kl_penalty, ppo_token_loss


class LearnerUpdate:
    """Mixin: `_optimise` and its parts (see module docstring)."""

    def _optimise(self, b: Batch, adv: Tensor, scored: Scored, returns: Tensor | None,
                  floor_terms: dict[str, float], classes: dict[str, Tensor], temp: float, floor, scale: float,
                  step: int, ratio_base: Tensor | None = None, tis: Tensor | None = None,
                  probe: dict[str, Tensor] | None = None) -> dict[str, float]:
        """PPO updates: one optimizer step per mini-batch (policy, then critic), gradient accumulated over
        micro-batches. Importance ratios are to `ratio_base` (pi_old: recomputed or the rollout's), the policy
        before the step's first update. Returns the loss parts averaged over optimizer steps."""
        chunks = mini_batches(b.size, self.cfg["optim"], self.seed, step)
        train_policy = self._trains_policy()
        sums = {"pg": 0.0, "kl": 0.0, "ent": 0.0, "clipped": 0.0, "grad_norm": 0.0, "policy_steps": 0,
                "value_loss": 0.0, "value_clipped": 0.0, "critic_grad_norm": 0.0, "critic_steps": 0}
        for rows in chunks:
            if train_policy:
                first = sums["policy_steps"] == 0
                for k, v in self._policy_update(b, rows, adv, scored.ref_lp, floor_terms, classes, temp, floor,
                                                scale, ratio_base=ratio_base, tis=tis,
                                                probe=probe if first else None).items():
                    sums[k] += v
                sums["policy_steps"] += 1
            if self.critic is not None:
                out = self.critic.update(self._passes(b, rows), returns, scored.values,
                                         self.cfg["loss"]["aggregation"], loss_totals(b, rows))
                out = {**sum_over_ranks({k: out[k] for k in ("value_loss", "clipped")}, self.ranks),
                       "grad_norm": out["grad_norm"]}
                sums["value_loss"] += out["value_loss"]
                sums["value_clipped"] += out["clipped"]
                sums["critic_grad_norm"] += out["grad_norm"]
                sums["critic_steps"] += 1
        if train_policy:
            self.scheduler.step()  # the LR schedule counts training steps, not mini-batches
        for k, n in (("pg", "policy_steps"), ("kl", "policy_steps"), ("ent", "policy_steps"),
                     ("grad_norm", "policy_steps"), ("value_loss", "critic_steps"),
                     ("critic_grad_norm", "critic_steps")):
            if sums[n] > 1:
                sums[k] /= sums[n]
        self.optimizer_steps += sums["policy_steps"]
        return sums

    def _trains_policy(self) -> bool:
        """verl's critic warmup: the policy is first updated at training step `warmup_steps` - 1 counted from 0
        (verl: `critic_warmup <= global_steps`, global_steps from 1), so N gives N - 1 critic-only steps."""
        return self.critic is None or self.steps_done + 1 >= self.cfg["critic"]["warmup_steps"]

    def _policy_update(self, b: Batch, rows: Tensor, adv: Tensor, ref_lp: Tensor | None,
                       floor_terms: dict[str, float], classes: dict[str, Tensor], temp: float, floor,
                       scale: float, ratio_base: Tensor | None = None, tis: Tensor | None = None,
                       probe: dict[str, Tensor] | None = None) -> dict[str, float]:
        """One policy optimizer step on the rows of one mini-batch. `ratio_base`: the PPO ratio's pi_old
        (default the rollout's log-probs); `tis`: per-token loss weights; `probe`: [B, T] tensors that receive
        these rows' pre-update log-probs and entropy (old_logprobs: rollout)."""
        iv, loss_cfg = self.iv, self.cfg["loss"]
        ratio_base = b.old_lp if ratio_base is None else ratio_base
        need_logits = iv.entropy_bonus.is_active or bool(floor_terms) or probe is not None
        agg = loss_totals(b, rows)  # the whole mini-batch's denominators, on every rank
        self.optimizer.zero_grad(set_to_none=True)
        sums = {"pg": 0.0, "kl": 0.0, "ent": 0.0, "clipped": 0.0}
        probed = []
        for (seqs, attn, start, length, mask, r), real in self._passes(b, rows):
            lp, logits = self._logprobs(seqs, attn, start, length, temp, need_logits, floor)
            m = mask.to(self.device)
            tok_loss, was_clipped = ppo_token_loss(
                lp, ratio_base[r].to(self.device), adv[r].to(self.device),
                clip_low=loss_cfg["clip_low"], clip_high=loss_cfg["clip_high"], dual_clip=loss_cfg["dual_clip"],
            )
            if tis is not None:
                tok_loss = tok_loss * tis[r].to(self.device)
            if probe is not None and real:
                probed.append(r)
                with torch.no_grad():
                    probe["lp"][r] = lp.detach().float().cpu()
                    probe["entropy"][r] = entropy_from_logits(logits.detach(), 1.0,
                                                              iv.entropy_bonus.chunk_size).float().cpu()
            pg = aggregate(tok_loss, m, loss_cfg["aggregation"], **agg)
            loss = pg + self._regularisers(lp, logits if need_logits else None, r, m, rows, ref_lp, floor_terms,
                                           classes, agg, sums if real else {"kl": 0.0, "ent": 0.0})
            loss = loss * scale
            (loss if real else loss * 0.0).backward()  # a padding pass keeps FSDP's collectives in step
            if real:
                sums["pg"] += pg.item()
                sums["clipped"] += float((was_clipped & m).sum())
        sums = sum_over_ranks(sums, self.ranks)
        if probe is not None and self.ranks.grouped:
            mine = torch.cat(probed) if probed else torch.zeros(0, dtype=torch.long)
            probe.update(gather_rows(mine, {k: v[mine] for k, v in probe.items()}, b.size, self.ranks,
                                     fill=float("nan")))
        sums["grad_norm"] = clip_grad_norm(self.params, self.cfg["optim"]["grad_clip"])
        self.optimizer.step()
        return sums

    def _regularisers(self, lp: Tensor, logits: Tensor | None, r: Tensor, m: Tensor, rows: Tensor,
                      ref_lp: Tensor | None, floor_terms: dict[str, float], classes: dict[str, Tensor], agg: dict,
                      sums: dict[str, float]) -> Tensor:
        """The loss terms besides the policy gradient on one micro-batch (rows `r` of mini-batch `rows`): KL to
        the reference, entropy bonus, entropy-floor surrogates. Adds their values to `sums`."""
        iv, mode = self.iv, self.cfg["loss"]["aggregation"]
        loss = lp.new_zeros(())
        if iv.kl.is_active:
            kl = aggregate(kl_penalty(lp, ref_lp[r].to(self.device), iv.kl.estimator), m, mode, **agg)
            loss = loss + iv.kl.coef * kl
            sums["kl"] += kl.item()
        if logits is None:
            return loss
        ent = entropy_from_logits(logits, 1.0, iv.entropy_bonus.chunk_size)  # logits / temp
        if iv.entropy_bonus.is_active:
            h = aggregate(ent, m, mode, **agg)
            loss = loss - iv.entropy_bonus.coeff * h
            sums["ent"] += h.item()
        whole = len(rows) == len(classes["all"])
        for c, weight in floor_terms.items():
            # the surrogate's weight is per class token of the batch; a mini-batch rescales it to its own
            w = weight if whole else weight * float(classes[c].sum()) / max(float(classes[c][rows].sum()), 1.0)
            loss = loss - w * (ent * classes[c][r].to(self.device)).sum()
        return loss
