"""Learner: the HF policy (a PEFT LoRA adapter, or every weight under `learner.mode: full`), its optimizer, and one
training step; one rank of the learner group when the group has several (workers/learner/ranks.py).

Thin by design: the math lives in `workers.credit` (advantages) and `workers.objectives.losses` (loss), the batch and
how it is cut into mini- / micro-batches in `workers.learner.batch`, what a step reports in `workers.learner.metrics`.
It trains on sequences with a loss mask: the response window after the prompt holds the sampled ids of every turn
(loss mask True) and, for multi-turn episodes, the observation ids between turns (loss mask False). Every
per-token quantity reads the loss mask; a single-turn completion is the case of one contiguous sampled run.
`train_step` is split by concept: collate -> score (no grad) -> planning mask -> credit -> entropy floors ->
optimise -> metrics.
In a group of N ranks every rank gets the whole batch, scores and trains its token-balanced share of each
(mini-)batch and gathers the scored tensors, so the credit stack runs on the whole batch, unchanged, on every rank;
the models (workers/learner/modules.py) are FSDP2-sharded and the gradients are summed over the ranks.
"""

from __future__ import annotations

import random

import torch
from torch import Tensor

from workers.credit import CreditConfig, compute_advantages, planning_masks, token_uncertainty
from workers.credit.decomposition import decomposition_metrics
from workers.credit.gae import gae, token_rewards
from workers.credit.plugin_paths import resolve_plugins
from workers.learner.batch import Batch, Scored, collate, micro_batches, sampled_runs
from workers.learner.critic import ADAPTER as CRITIC_ADAPTER
from workers.learner.critic import FullCritic, LoraCritic
from workers.learner.metrics import critic_metrics, probe_metrics, step_metrics, token_samples
from workers.learner.modules import (
    frozen_copy,
    load_causal_lm,
    lora_config,
    response_logits,
    shard,
)
from workers.learner.ranks import (
    ONE_RANK,
    Ranks,
    gather_rows,
    join_group,
    min_over_ranks,
    pad_passes,
    rendezvous_address,
    split_rows,
)
from workers.learner.state import LearnerState
from workers.learner.update import LearnerUpdate
from workers.models.loading import head_is_linear, load_tokenizer, token_pieces
from workers.objectives.interventions import InterventionsConfig, scoring_pass_needs
from workers.objectives.losses import (
    entropy_floor_surrogate,
    entropy_from_logits,
    truncated_importance_weights,
)
from workers.objectives.probability_floor import floor_probs, floored_token_logprobs


def _decomposes(credit: CreditConfig) -> bool:
    """Whether the learner logs `credit/decomp_*`: asked for, or the signal is computed from logits anyway."""
    return credit.log_decomposition or credit.uncertainty_kind != "surprisal"


class Learner(LearnerUpdate, LearnerState):
    """Owns model(s) + AdamW + LR schedule. All inputs arrive as plain Python lists (Ray-friendly)."""

    def __init__(self, model_path: str, *, learner: dict, credit: dict, seed: int, total_steps: int,
                 dtype: str = "auto", interventions: dict | None = None, ranks: Ranks = ONE_RANK,
                 init_method: str | None = None) -> None:
        from transformers import get_constant_schedule_with_warmup, get_cosine_schedule_with_warmup

        cuda = torch.cuda.is_available()
        self.device = "cuda" if cuda else "cpu"
        self.ranks = ranks
        if dtype == "auto":
            dtype = "bfloat16" if cuda else "float32"
        self.dtype = getattr(torch, dtype)  # the compute dtype (and the rollout engine's)
        self.cfg = learner
        self.full = learner.get("mode", "lora") == "full"
        # sharded: FSDP2 over the group; also one rank that offloads, or trains every weight on a GPU (fp32 master
        # weights, bf16 compute: full fine-tuning at lr 1e-6 would lose its updates in bf16 weights)
        offload = bool(learner.get("cpu_offload")) and cuda  # offloads GPU state; nothing to offload on a CPU
        self.sharded = ranks.grouped or offload or (self.full and cuda)
        if self.sharded:  # FSDP needs a process group, of one rank when this learner has no group
            join_group(ranks, init_method or rendezvous_address(), cuda)
        weights_dtype = torch.float32 if self.sharded else self.dtype
        self.credit = CreditConfig.model_validate(credit)
        self.iv = InterventionsConfig.model_validate(interventions or {})
        self.total_steps = max(total_steps, 1)
        self.reference_passes = 0  # counted so tests can check that KL coef 0 costs no reference pass
        self.detector = resolve_plugins(self.credit).get("planning_detector")  # import plugins early
        torch.manual_seed(seed)  # the same on every rank: FSDP shards identical initial weights
        random.seed(seed)
        self.tokenizer = load_tokenizer(model_path)
        self._build_models(model_path, learner, weights_dtype, cuda, offload)
        opt = learner["optim"]
        self.params = [p for n, p in self.model.named_parameters()  # the policy's: never the critic adapter's
                       if p.requires_grad and f".{CRITIC_ADAPTER}." not in n]
        self.optimizer = torch.optim.AdamW(self.params, lr=opt["lr"], betas=tuple(opt["betas"]),
                                           weight_decay=opt["weight_decay"])
        if opt["schedule"] == "cosine":
            self.scheduler = get_cosine_schedule_with_warmup(self.optimizer, opt["warmup_steps"], total_steps)
        else:
            self.scheduler = get_constant_schedule_with_warmup(self.optimizer, opt["warmup_steps"])
        self.seed, self.steps_done, self.optimizer_steps = seed, 0, 0
        # the PPO ratio's anchor pi_old: "recompute" = the scoring pass's log-probs (verl's default, decoupled
        # mode), "rollout" = vLLM's (verl's bypass mode), which skips the scoring pass
        self.skip_scoring = learner.get("old_logprobs", "recompute") == "rollout"
        if self.skip_scoring and (needs := scoring_pass_needs(self.credit, self.iv)):
            raise ValueError(f"old_logprobs 'rollout' skips the scoring pass that {needs} needs")

    def _build_models(self, model_path: str, learner: dict, weights_dtype: torch.dtype, cuda: bool,
                      offload: bool) -> None:
        """Policy (+ the LoRA critic's adapter on it), the frozen reference (full mode, when KL reads it) and the
        full critic, each sharded as soon as it is built, so at most one unsharded model is in memory at a time."""
        ranks, grad_ckpt = self.ranks, bool(learner.get("gradient_checkpointing"))

        def shard_fn(m):
            return shard(m, ranks.world, cuda=cuda, cpu_offload=offload, param_dtype=self.dtype) \
                if self.sharded else m

        base = load_causal_lm(model_path, weights_dtype, self.device, grad_ckpt)
        self._head_only = head_is_linear(base)
        critic = learner["critic"] if self.credit.uses_critic else None
        critic_kind = (critic or {}).get("model") or ("full" if self.full else "lora")
        critic_lora = lora_config((critic or {}).get("lora") or learner["lora"])
        if self.full:  # the policy is the model itself; a LoRA critic wraps it in a PeftModel of its adapter
            lora_critic = critic is not None and critic_kind == "lora"
            self.model = LoraCritic.on_full_policy(base, critic_lora) if lora_critic else base
        else:
            from peft import get_peft_model

            self.model = get_peft_model(base, lora_config(learner["lora"]))
        self.critic = None
        if critic is not None and critic_kind == "lora":  # its adapter joins the policy's model
            self.critic = LoraCritic(self.model, critic, critic_lora, self.device, ranks)
        shard_fn(self.model)
        self.reference = None  # full mode: a frozen copy, only when the KL reference is read
        if self.full and (self.iv.kl.is_active or self.iv.kl.measure):
            self.reference = shard_fn(frozen_copy(model_path, self.dtype, self.device))  # frozen: no fp32 master
        if critic is not None and critic_kind == "full":
            self.critic = FullCritic(model_path, critic, self.device, weights_dtype, ranks=ranks,
                                     shard_fn=shard_fn if self.sharded else None, gradient_checkpointing=grad_ckpt)
        if isinstance(self.critic, LoraCritic):
            self.critic.sharded = self.sharded
            self.critic.make_optimizer()

    def _passes(self, b: Batch, rows: Tensor) -> list:
        """This rank's micro-batches of `rows` as (micro-batch, real) pairs, padded so every rank runs as many
        passes (workers/learner/ranks.py); one rank: its micro-batches, all real."""
        optim = self.cfg["optim"]
        shares = split_rows(rows, b.attn.sum(-1), self.ranks.world)
        mine = list(micro_batches(b, shares[self.ranks.rank], optim))
        if not self.ranks.grouped:
            return [(m, True) for m in mine]
        counts = [len(mine) if k == self.ranks.rank else sum(1 for _ in micro_batches(b, s, optim))
                  for k, s in enumerate(shares)]
        return pad_passes(mine, counts, next(micro_batches(b, rows[:1], optim)))

    # -- forward ----------------------------------------------------------------------------------------
    def _logprobs(self, seqs: Tensor, attn: Tensor, comp_start: Tensor, comp_len: int, temperature: float,
                  want_logits: bool, floor: tuple[list[int], float] | None = None,
                  model=None) -> tuple[Tensor, Tensor | None]:
        """Response-window log-probs `[b, comp_len]` (and the logits divided by `temperature`, float32) from one
        forward pass.

        One `[b, comp_len, V]` tensor only: the decoder runs over the whole sequence and the LM head only at the
        response positions (no `[b, P + T, V]` logits, no gathered copy of them); the temperature is applied in
        place and the log-probs are gathered from that tensor (log_softmax(z)[y] = z[y] - logsumexp(z)).
        `floor = (action_token_ids, min_prob)`: the first response token (the action position) is scored under
        the probability-floored distribution the sampler drew it from.
        """
        idx = comp_start[:, None] - 1 + torch.arange(comp_len)[None, :]  # logits at p-1 predict token p
        idx = idx.clamp(max=seqs.shape[1] - 2).to(self.device)
        ids, mask = seqs.to(self.device), attn.to(self.device)
        z = response_logits(model if model is not None else self.model, ids, mask, idx, self._head_only,
                            self.sharded)
        z = z.float().div_(temperature)  # a no-op cast in fp32: z / T in place, nothing else [b, T, V]
        targets = ids.gather(1, idx + 1)
        if floor is None:
            lp = z.gather(-1, targets[..., None]).squeeze(-1) - torch.logsumexp(z, dim=-1)
        else:
            positions = torch.zeros_like(targets, dtype=torch.bool)
            positions[:, 0] = True
            lp = floored_token_logprobs(z, targets, floor[0], floor[1], 1.0, positions=positions)
        return lp, (z if want_logits else None)

    def _reference_logprobs(self, seqs: Tensor, attn: Tensor, comp_start: Tensor, comp_len: int,
                            temperature: float, floor) -> Tensor:
        """Log-probs under the frozen reference: the base model with the adapter disabled (lora: no second copy),
        or the frozen copy of the initial policy (full)."""
        self.reference_passes += 1
        if self.reference is not None:
            return self._logprobs(seqs, attn, comp_start, comp_len, temperature, False, floor, self.reference)[0]
        with self.model.disable_adapter():
            lp, _ = self._logprobs(seqs, attn, comp_start, comp_len, temperature, False, floor)
        return lp

    def train_step(self, batch: dict) -> dict:
        """One training step on one batch of sequences: one optimizer step, or one per PPO mini-batch and epoch.

        batch: prompt_ids [B][*], response_ids [B][*] (everything after the prompt: for multi-turn episodes the
        sampled ids of every turn with the observation ids between them), loss_mask [B][*] (True on sampled ids;
        omitted = all True, the single-turn case), rollout_logprobs [B][*] (aligned with response_ids; read only
        where loss_mask is True), rewards [N][G] (B = N*G, grouped by prompt / level), temperature, sepa_lambda,
        step; optional loss_scale, action_token_ids, want_uncertainty (return per-token uncertainty samples
        before/after the token stages), and for the critic reward_positions [B][*] / turn_rewards [B][*] (each
        turn's reward and the response index of its last sampled id; default: one turn ending at the last
        sampled id with the sequence's reward); `tis_cap` (each token's loss weighted by the truncated importance
        weight min(pi_old / pi_rollout, tis_cap); needs old_logprobs 'recompute').
        The PPO ratio is to pi_old: the scoring pass's log-probs (old_logprobs 'recompute'), or vLLM's
        ('rollout', no scoring pass).
        Returns metrics plus `exec_values` (raw execution-token uncertainties, for SEPA's auto schedule) and
        `uncertainty` (the samples, or None).
        """
        b = collate(batch, self.tokenizer.pad_token_id)
        temp = float(batch["temperature"])
        iv = self.iv
        floor = None
        if batch.get("action_token_ids") and iv.probability_floor.is_active:
            floor = (list(batch["action_token_ids"]), iv.probability_floor.min_prob)
        progress = min(max(int(batch.get("step", 0)) / self.total_steps, 0.0), 1.0)
        self.model.train()

        probe = None
        if self.skip_scoring:  # old_logprobs: rollout; the first update's forward measures the gap instead
            if batch.get("tis_cap") is not None:
                raise ValueError("the truncated importance weight (tis_cap) needs pi_old: old_logprobs 'recompute'")
            nan = torch.full_like(b.old_lp, float("nan"))
            scored = Scored(b.old_lp, token_uncertainty("surprisal", logprobs=b.old_lp), nan, None, None)
            probe = {"lp": nan.clone(), "entropy": nan.clone()}
        else:
            scored = self._score(b, temp, floor)
        ratio_base, tis, tis_metrics = truncated_importance_weights(scored.learner_lp, b.old_lp, b.mask,
                                                                    batch.get("tis_cap"))
        planning = self._planning(b)
        gae_adv = returns = None
        if self.critic is not None:
            gae_adv, returns = self._gae(batch, b, scored.values)
        shape = (b.n_groups, b.group, b.t)
        credit = compute_advantages(
            b.rewards, scored.signals.reshape(shape), b.mask.reshape(shape),
            self.credit, planning=planning.reshape(shape) if self._detects_planning() else None,
            sepa_lambda=float(batch.get("sepa_lambda", 0.0)), step=int(batch.get("step", 0)),
            token_advantages=gae_adv.reshape(shape) if gae_adv is not None else None,
        )
        adv = credit.token_advantages.reshape(-1, b.t)
        classes = {"all": b.mask, "planning": b.mask & planning, "execution": b.mask & ~planning}
        floors = iv.entropy_floor  # the penalty's value and, per class, its gradient surrogate's weight
        floor_terms, floor_metrics = entropy_floor_surrogate(
            scored.entropy, classes, floors.floors_at(progress), floors.coefs()) if floors.is_active else ({}, {})
        scale = float(batch.get("loss_scale", 1.0))
        sums = self._optimise(b, adv, scored, returns, floor_terms, classes, temp, floor, scale,
                              step=int(batch.get("step", 0)), ratio_base=ratio_base, tis=tis, probe=probe)
        self.steps_done += 1

        metrics = step_metrics(b, scored, sums, floor_metrics, floor, scale, iv=iv,
                               ppo_epochs=self.cfg["optim"].get("ppo_epochs", 1), lr=self.scheduler.get_last_lr()[0])
        metrics.update(tis_metrics)
        if probe is not None:
            metrics.update(probe_metrics(b, probe))
        if self.critic is not None:
            metrics.update(critic_metrics(scored.values, returns, b.mask, sums,
                                          ppo_epochs=self.cfg["optim"].get("ppo_epochs", 1)))
        metrics.update({f"credit/{k}": v for k, v in credit.stats.items()
                        if not (self.critic is not None and k.startswith("groups_skipped"))})  # GAE skips none
        if _decomposes(self.credit):  # surprisal vs entropy from this pass (workers/credit/decomposition.py)
            lam = float(batch.get("sepa_lambda", 0.0)) if "sepa" in self.credit.stages else None
            metrics.update(decomposition_metrics(-scored.learner_lp, scored.entropy, b.mask, planning,
                                                 sepa_lambda=lam))
        return {"metrics": metrics, "exec_values": scored.signals[classes["execution"]],
                "uncertainty": token_samples(scored.signals, credit.signal_after, b.mask, planning,
                                              entropy=scored.entropy if _decomposes(self.credit) else None)
                if batch.get("want_uncertainty") else None}

    def _score(self, b: Batch, temp: float, floor) -> Scored:
        """Score the batch with the current policy (no grad): log-probs, uncertainty signal, entropy, reference
        log-probs (KL on or measured) and, under the probability floor, the smallest valid action probability.
        In eval mode: pi_old, the reference and the old values are the models themselves, without LoRA dropout."""
        self.model.eval()
        if self.critic is not None:
            self.critic.train(False)
        try:
            return self._score_eval(b, temp, floor)
        finally:
            self.model.train()
            if self.critic is not None:
                self.critic.train(True)

    def _score_eval(self, b: Batch, temp: float, floor) -> Scored:
        iv = self.iv
        use_ref = iv.kl.is_active or iv.kl.measure
        lps, sigs, ents, refs, action_min, vals, order = [], [], [], [], [], [], []
        with torch.no_grad():
            for (seqs, attn, start, length, _, r), real in self._passes(b, torch.arange(b.size)):
                args = (seqs, attn, start, length, temp)
                lp, logits = self._logprobs(*args, True, floor)  # logits / temp
                ref = self._reference_logprobs(*args, floor) if use_ref else None
                val = None
                if self.critic is not None:
                    with self.critic.active():
                        val = self.critic.values(*args[:4])
                if not real:  # a pass that only keeps the group's collectives in step
                    continue
                order.append(r)
                lps.append(lp.float().cpu())
                sig = token_uncertainty(self.credit.uncertainty_kind, logprobs=lp, logits=logits, temperature=1.0)
                sigs.append(sig.float().cpu())
                ents.append(entropy_from_logits(logits, 1.0, iv.entropy_bonus.chunk_size).float().cpu())
                if ref is not None:
                    refs.append(ref.float().cpu())
                if val is not None:
                    vals.append(val.float().cpu())
                if floor is not None:  # every valid action's probability at the action position
                    valid = torch.zeros(logits.shape[-1], dtype=torch.bool, device=logits.device)
                    valid[floor[0]] = True
                    action_min.append(float(floor_probs(logits[:, 0], valid, floor[1], 1.0)[:, floor[0]].exp().min()))

        def cat(parts, on: bool = True):  # micro-batches packed by tokens may reorder the rows
            return (torch.cat(parts) if parts else torch.zeros(0, b.t)) if on else None

        rows = torch.cat(order) if order else torch.zeros(0, dtype=torch.long)
        full = gather_rows(rows, {"lp": cat(lps), "sig": cat(sigs), "ent": cat(ents), "ref": cat(refs, use_ref),
                                  "val": cat(vals, self.critic is not None)}, b.size, self.ranks)
        low = min_over_ranks(min(action_min) if action_min else None, self.ranks)
        return Scored(full["lp"], full["sig"], full["ent"], full["ref"], low, full["val"])

    def _gae(self, batch: dict, b: Batch, values: Tensor) -> tuple[Tensor, Tensor]:
        """GAE advantages and returns `[B, T]` from the turn rewards and the critic's (pre-update) values."""
        g = self.credit.gae
        flat = b.rewards.reshape(-1).tolist()
        positions = batch.get("reward_positions") or [[max(i for i, m in enumerate(row) if m)] if any(row) else []
                                                       for row in b.mask_rows]
        rewards = batch.get("turn_rewards") or [[r] if pos else [] for r, pos in zip(flat, positions, strict=True)]
        tok_rewards = token_rewards(b.mask, positions, rewards, g.reward_placement)
        return gae(tok_rewards, values * b.mask, b.mask, g.gamma, g.lam, whiten=g.whiten)

    def _detects_planning(self) -> bool:
        """Whether this learner finds planning tokens: a credit stage reads them, the surprisal/entropy
        decomposition splits by them, or an entropy floor targets a token class. When found they also reach the
        credit stack's batch statistics (`credit/planning_token_frac`, `credit/exec_*` / `plan_*`), so a condition
        whose stages ignore them (GRPO, MaxRL) reports the same split as one that uses them."""
        floors = self.iv.entropy_floor
        return (self.credit.needs_planning or _decomposes(self.credit)
                or (floors.is_active and bool({"planning", "execution"} & set(floors.specs()))))

    def _planning(self, b: Batch) -> Tensor:
        """`[B, T]` planning mask over the sampled text only: each contiguous run of loss-masked ids (one turn)
        is matched on its own, so observation text never counts and grams never span turns. All False when
        nothing reads it."""
        if not self._detects_planning():
            return torch.zeros_like(b.mask)
        runs = [(i, s, e) for i, row in enumerate(b.mask_rows) for s, e in sampled_runs(row)]
        pieces = [token_pieces(self.tokenizer, b.response_rows[i][s:e]) for i, s, e in runs]
        found = planning_masks(pieces, max((e - s for _, s, e in runs), default=0), self.credit.strategic_grams,
                               self.detector)
        out = torch.zeros_like(b.mask)
        for k, (i, s, e) in enumerate(runs):
            out[i, s:e] = found[k, : e - s]
        return out
