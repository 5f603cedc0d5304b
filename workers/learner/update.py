"""The learner's optimisation: PPO updates over mini-batches (policy, then critic), gradient accumulated over
micro-batches, with the regularisers (KL to the reference, entropy bonus, entropy floors). In a group each rank
runs its share of every mini-batch (`PolicyForward.passes`) and the loss parts it reports are summed over the
ranks.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from workers.learner.batch import loss_totals, mini_batches
from workers.learner.context import MicroRows, PolicyOptim, UpdatePlan
from workers.learner.modules import clip_grad_norm
from workers.learner.ranks import gather_rows, sum_over_ranks
from workers.objectives.interventions import InterventionsConfig
from workers.objectives.losses import aggregate, kl_penalty, ppo_token_loss

if TYPE_CHECKING:
    from workers.learner.config import LearnerConfig
    from workers.learner.passes.forward import PolicyForward


class Updater:
    """One training step's optimizer steps: the policy's (`optim`, through `forward`) and the `critic`'s (None
    without one), by the learner's settings `cfg`, the interventions `iv` and the mini-batch shuffle's `seed`."""

    def __init__(self, forward: PolicyForward, optim: PolicyOptim, critic, *, cfg: LearnerConfig,
                 iv: InterventionsConfig, seed: int) -> None:
        self.forward, self.optim, self.critic = forward, optim, critic
        self.cfg, self.iv, self.seed = cfg, iv, seed
        self.device, self.ranks = forward.layout.device, forward.layout.ranks

    def optimise(self, plan: UpdatePlan, steps_done: int) -> dict[str, float]:
        """PPO updates: one optimizer step per mini-batch (policy, then critic), gradient accumulated over
        micro-batches. Importance ratios are to `plan.ratio_base` (pi_old: recomputed or the rollout's), the
        policy before the step's first update. `steps_done`: training steps before this one (critic warmup).
        Returns the loss parts averaged over optimizer steps."""
        b, scored = plan.b, plan.scored
        chunks = mini_batches(b.size, self.cfg.optim, self.seed, plan.step)
        train_policy = self.trains_policy(steps_done)
        sums = {"pg": 0.0, "kl": 0.0, "ent": 0.0, "clipped": 0.0, "grad_norm": 0.0, "policy_steps": 0,
                "value_loss": 0.0, "value_clipped": 0.0, "critic_grad_norm": 0.0, "critic_steps": 0}
        for rows in chunks:
            if train_policy:
                first = sums["policy_steps"] == 0
                for k, v in self._policy_update(plan, rows, plan.probe if first else None).items():
                    sums[k] += v
                sums["policy_steps"] += 1
            if self.critic is not None:
                out = self.critic.update(self.forward.passes(b, rows), plan.returns, scored.values,
                                         self.cfg.loss.aggregation, loss_totals(b, rows))
                out = {**sum_over_ranks({k: out[k] for k in ("value_loss", "clipped")}, self.ranks),
                       "grad_norm": out["grad_norm"]}
                sums["value_loss"] += out["value_loss"]
                sums["value_clipped"] += out["clipped"]
                sums["critic_grad_norm"] += out["grad_norm"]
                sums["critic_steps"] += 1
        if train_policy:
            self.optim.scheduler.step()  # the LR schedule counts training steps, not mini-batches
        for k, n in (("pg", "policy_steps"), ("kl", "policy_steps"), ("ent", "policy_steps"),
                     ("grad_norm", "policy_steps"), ("value_loss", "critic_steps"),
                     ("critic_grad_norm", "critic_steps")):
            if sums[n] > 1:
                sums[k] /= sums[n]
        return sums

    def trains_policy(self, steps_done: int) -> bool:
        """verl's critic warmup: the policy is first updated at training step `warmup_steps` - 1 counted from 0
        (verl: `critic_warmup <= global_steps`, global_steps from 1), so N gives N - 1 critic-only steps."""
        return self.critic is None or steps_done + 1 >= self.cfg.critic.warmup_steps

    def _policy_update(self, plan: UpdatePlan, rows: Tensor, probe: dict[str, Tensor] | None) -> dict[str, float]:
        """One policy optimizer step on the rows of one mini-batch. `probe`: [B, T] tensors that receive these
        rows' pre-update log-probs and entropy (old_logprobs: rollout)."""
        iv, loss_cfg, b, fwd = self.iv, self.cfg.loss, plan.b, self.forward
        ratio_base = b.old_lp if plan.ratio_base is None else plan.ratio_base
        need_entropy = iv.entropy_bonus.is_active or bool(plan.floor_terms) or probe is not None
        agg = loss_totals(b, rows)  # the whole mini-batch's denominators, on every rank
        self.optim.optimizer.zero_grad(set_to_none=True)
        sums = {"pg": 0.0, "kl": 0.0, "ent": 0.0, "clipped": 0.0}
        probed = []
        for (seqs, attn, start, length, mask, r), real in fwd.passes(b, rows):
            lp, stats = fwd.logprobs(seqs, attn, start, length, plan.scoring, need_entropy)
            m = mask.to(self.device)
            tok_loss, was_clipped = ppo_token_loss(
                lp, ratio_base[r].to(self.device), plan.adv[r].to(self.device),
                clip_low=loss_cfg.clip_low, clip_high=loss_cfg.clip_high, dual_clip=loss_cfg.dual_clip,
            )
            if plan.tis is not None:
                tok_loss = tok_loss * plan.tis[r].to(self.device)
            if probe is not None and real:
                probed.append(r)
                with torch.no_grad():
                    probe["lp"][r] = lp.detach().float().cpu()
                    probe["entropy"][r] = stats.entropy.detach().float().cpu()
            pg = aggregate(tok_loss, m, loss_cfg.aggregation, **agg)
            loss = pg + self._regularisers(plan, lp, stats.entropy if need_entropy else None,
                                           MicroRows(rows, r, m, agg),
                                           sums if real else {"kl": 0.0, "ent": 0.0})
            loss = loss * plan.scale
            (loss if real else loss * 0.0).backward()  # a padding pass keeps FSDP's collectives in step
            if real:
                sums["pg"] += pg.item()
                sums["clipped"] += float((was_clipped & m).sum())
        sums = sum_over_ranks(sums, self.ranks)
        if probe is not None and self.ranks.grouped:
            mine = torch.cat(probed) if probed else torch.zeros(0, dtype=torch.long)
            probe.update(gather_rows(mine, {k: v[mine] for k, v in probe.items()}, b.size, self.ranks,
                                     fill=float("nan")))
        sums["grad_norm"] = clip_grad_norm(self.optim.params, self.cfg.optim.grad_clip)
        if not math.isfinite(sums["grad_norm"]):  # before the step: the weights stay as they were
            raise FloatingPointError(
                f"step {plan.step}: the policy gradient's norm is {sums['grad_norm']} (a non-finite loss or "
                f"gradient: learning rate, rewards or advantages); the update is not applied and the trial stops")
        self.optim.optimizer.step()
        return sums

    def _regularisers(self, plan: UpdatePlan, lp: Tensor, ent: Tensor | None, at: MicroRows,
                      sums: dict[str, float]) -> Tensor:
        """The loss terms besides the policy gradient on one micro-batch (`at`): KL to the reference, entropy
        bonus, entropy-floor surrogates. Adds their values to `sums`."""
        iv, mode, classes = self.iv, self.cfg.loss.aggregation, plan.classes
        r, m, rows = at.r, at.m, at.rows
        loss = lp.new_zeros(())
        if iv.kl.is_active:
            kl = aggregate(kl_penalty(lp, plan.scored.ref_lp[r].to(self.device), iv.kl.estimator), m, mode,
                           **at.totals)
            loss = loss + iv.kl.coef * kl
            sums["kl"] += kl.item()
        if ent is None:  # the token entropy at the sampling temperature, from the chunked pass
            return loss
        if iv.entropy_bonus.is_active:
            h = aggregate(ent, m, mode, **at.totals)
            loss = loss - iv.entropy_bonus.coeff * h
            sums["ent"] += h.item()
        whole = len(rows) == len(classes["all"])
        for c, weight in plan.floor_terms.items():
            # the surrogate's weight is per class token of the batch; a mini-batch rescales it to its own
            w = weight if whole else weight * float(classes[c].sum()) / max(float(classes[c][rows].sum()), 1.0)
            loss = loss - w * (ent * classes[c][r].to(self.device)).sum()
        return loss
