"""Learner: the HF policy with a PEFT LoRA adapter, its optimizer, and one training step.

Thin by design: the math lives in `workers.credit` (advantages) and `workers.objectives` (loss). A value head
for PPO + GAE can sit beside the policy here later: `train_step` already separates "score tokens" from
"optimise", and the state dict is a plain dict of named parts.
"""

from __future__ import annotations

import io
import math
import random
import tempfile
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from workers.credit import CreditConfig, compute_advantages, planning_masks, token_uncertainty
from workers.credit.pipeline import resolve_plugins
from workers.interventions import InterventionsConfig
from workers.models import load_model, load_tokenizer, token_pieces
from workers.objectives import (
    aggregate,
    entropy_floor_penalty,
    entropy_from_logits,
    kl_penalty,
    ppo_token_loss,
    sequence_logprobs,
)
from workers.probability_floor import floor_probs, floored_token_logprobs


def _pad(rows: list[list[Any]], fill: Any, dtype: torch.dtype) -> Tensor:
    width = max((len(r) for r in rows), default=0)
    return torch.tensor([list(r) + [fill] * (width - len(r)) for r in rows], dtype=dtype)


def _token_samples(before: Tensor, after: Tensor | None, mask: Tensor, planning: Tensor,
                   cap: int = 4096) -> dict[str, list[float]]:
    """Per-token uncertainty of execution / planning tokens before and after the token stages, at most `cap`
    evenly spaced values per array (the report's mechanistic histogram; bounded so logs stay small)."""
    after = before if after is None else after.reshape(before.shape)
    out = {}
    for cls, sel in (("exec", mask & ~planning), ("plan", mask & planning)):
        for name, values in (("before", before), ("after", after)):
            v = values[sel]
            if v.numel() > cap:
                v = v[torch.linspace(0, v.numel() - 1, cap).long()]
            out[f"{cls}_{name}"] = v.tolist()
    return out


class Learner:
    """Owns model + LoRA + AdamW + LR schedule. All inputs arrive as plain Python lists (Ray-friendly)."""

    def __init__(self, model_path: str, *, learner: dict, credit: dict, seed: int, total_steps: int,
                 dtype: str = "auto", interventions: dict | None = None) -> None:
        from peft import LoraConfig, get_peft_model
        from transformers import get_constant_schedule_with_warmup, get_cosine_schedule_with_warmup

        self.device = "cuda" if torch.cuda.is_available() else "cpu"
        if dtype == "auto":
            dtype = "bfloat16" if self.device == "cuda" else "float32"
        self.dtype = getattr(torch, dtype)
        self.cfg = learner
        self.credit = CreditConfig.model_validate(credit)
        self.iv = InterventionsConfig.model_validate(interventions or {})
        self.total_steps = max(total_steps, 1)
        self.reference_passes = 0  # counted so tests can check that KL coef 0 costs no reference pass
        self.detector = resolve_plugins(self.credit).get("planning_detector")  # import plugins early
        torch.manual_seed(seed)
        random.seed(seed)
        self.tokenizer = load_tokenizer(model_path)
        base = load_model(model_path, dtype=self.dtype, device=self.device)
        lora = learner["lora"]
        self.model = get_peft_model(base, LoraConfig(
            r=lora["rank"], lora_alpha=lora["alpha"], lora_dropout=lora["dropout"],
            target_modules=lora["target_modules"], task_type="CAUSAL_LM",
        ))
        opt = learner["optim"]
        params = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(params, lr=opt["lr"], betas=tuple(opt["betas"]),
                                           weight_decay=opt["weight_decay"])
        if opt["schedule"] == "cosine":
            self.scheduler = get_cosine_schedule_with_warmup(self.optimizer, opt["warmup_steps"], total_steps)
        else:
            self.scheduler = get_constant_schedule_with_warmup(self.optimizer, opt["warmup_steps"])

    # -- forward ----------------------------------------------------------------------------------------
    def _logprobs(self, seqs: Tensor, attn: Tensor, comp_start: Tensor, comp_len: int, temperature: float,
                  want_logits: bool, floor: tuple[list[int], float] | None = None) -> tuple[Tensor, Tensor | None]:
        """Completion-token log-probs `[b, comp_len]` (and their logits) from one forward pass.

        `floor = (action_token_ids, min_prob)`: the first completion token (the action position) is scored under
        the probability-floored distribution the sampler drew it from.
        """
        logits = self.model(input_ids=seqs.to(self.device), attention_mask=attn.to(self.device)).logits
        idx = comp_start[:, None] - 1 + torch.arange(comp_len)[None, :]  # logits at p-1 predict token p
        idx = idx.clamp(max=seqs.shape[1] - 2).to(self.device)
        pred = logits.gather(1, idx[..., None].expand(-1, -1, logits.shape[-1]))
        targets = seqs.to(self.device).gather(1, idx + 1)
        if floor is None:
            lp = sequence_logprobs(pred, targets, temperature)
        else:
            positions = torch.zeros_like(targets, dtype=torch.bool)
            positions[:, 0] = True
            lp = floored_token_logprobs(pred, targets, floor[0], floor[1], temperature, positions=positions)
        return lp, (pred if want_logits else None)

    def _reference_logprobs(self, seqs: Tensor, attn: Tensor, comp_start: Tensor, comp_len: int,
                            temperature: float, floor) -> Tensor:
        """Log-probs under the frozen reference = the base model with the adapter disabled (no second copy)."""
        self.reference_passes += 1
        with self.model.disable_adapter():
            lp, _ = self._logprobs(seqs, attn, comp_start, comp_len, temperature, False, floor)
        return lp

    def train_step(self, batch: dict) -> dict:
        """One optimizer step on one batch.

        batch: prompt_ids [B][*], completion_ids [B][*], rollout_logprobs [B][*], rewards [N][G] (B = N*G,
        completions grouped by prompt), temperature, sepa_lambda, step; optional loss_scale, action_token_ids,
        want_uncertainty (return per-token uncertainty samples before/after the token stages).
        Returns metrics plus `exec_values` (raw execution-token uncertainties, for SEPA's auto schedule) and
        `uncertainty` (the samples, or None).
        """
        prompts, comps = batch["prompt_ids"], batch["completion_ids"]
        rewards = torch.tensor(batch["rewards"], dtype=torch.float32)
        n_groups, group = rewards.shape
        temp = float(batch["temperature"])
        pad_id = self.tokenizer.pad_token_id
        seqs = _pad([p + c for p, c in zip(prompts, comps, strict=True)], pad_id, torch.long)
        attn = _pad([[1] * (len(p) + len(c)) for p, c in zip(prompts, comps, strict=True)], 0, torch.long)
        comp_start = torch.tensor([len(p) for p in prompts])
        mask = _pad([[True] * len(c) for c in comps], False, torch.bool)
        t_comp = mask.shape[1]
        old_lp = _pad(batch["rollout_logprobs"], 0.0, torch.float32)
        mb = self.cfg["optim"]["micro_batch_size"]
        kind = self.credit.uncertainty_kind
        iv = self.iv
        floor = None
        if batch.get("action_token_ids") and iv.probability_floor.is_active:
            floor = (list(batch["action_token_ids"]), iv.probability_floor.min_prob)
        use_ref = iv.kl.is_active or iv.kl.measure
        progress = min(max(int(batch.get("step", 0)) / self.total_steps, 0.0), 1.0)
        self.model.train()

        # 1) score tokens with the current policy (no grad): log-probs, uncertainty, entropy, reference log-probs
        lps, sigs, ents, refs, action_min = [], [], [], [], []
        with torch.no_grad():
            for s in range(0, len(comps), mb):
                args = (seqs[s:s + mb], attn[s:s + mb], comp_start[s:s + mb], t_comp, temp)
                lp, logits = self._logprobs(*args, True, floor)
                lps.append(lp.float().cpu())
                sig = token_uncertainty(kind, logprobs=lp, logits=logits, temperature=temp)
                sigs.append(sig.float().cpu())
                ents.append(entropy_from_logits(logits, temp, iv.entropy_bonus.chunk_size).float().cpu())
                if use_ref:
                    refs.append(self._reference_logprobs(*args, floor).float().cpu())
                if floor is not None:  # every valid action's probability at the action position
                    valid = torch.zeros(logits.shape[-1], dtype=torch.bool, device=logits.device)
                    valid[floor[0]] = True
                    action_min.append(float(floor_probs(logits[:, 0], valid, floor[1], temp)[:, floor[0]].exp().min()))
        learner_lp, signals, entropy = torch.cat(lps), torch.cat(sigs), torch.cat(ents)
        ref_lp = torch.cat(refs) if use_ref else None
        gap = (learner_lp - old_lp).abs()[mask]

        # 2) credit assignment
        planning = None
        floors = iv.entropy_floor
        if self.credit.needs_planning or (floors.is_active and {"planning", "execution"} & set(floors.specs())):
            pieces = [token_pieces(self.tokenizer, c) for c in comps]
            planning = planning_masks(pieces, t_comp, self.credit.strategic_grams, self.detector)
            planning = planning.reshape(n_groups, group, t_comp)
        credit = compute_advantages(
            rewards, signals.reshape(n_groups, group, t_comp), mask.reshape(n_groups, group, t_comp),
            self.credit, planning=planning if self.credit.needs_planning else None,
            sepa_lambda=float(batch.get("sepa_lambda", 0.0)), step=int(batch.get("step", 0)),
        )
        adv = credit.token_advantages.reshape(-1, t_comp)
        plan_flat = planning.reshape(-1, t_comp) if planning is not None else torch.zeros_like(mask)
        exec_mask = mask & ~plan_flat
        exec_values = signals[exec_mask]

        # entropy floors: value from the whole batch; the gradient surrogate below reproduces its exact gradient
        # under micro-batching (d/dθ of coef * gap^2 = -2 coef gap * d mean_c / dθ, gap a constant here)
        loss_cfg = self.cfg["loss"]
        total_tokens, total_seqs = float(mask.sum()), float(len(comps))
        classes = {"all": mask, "planning": mask & plan_flat, "execution": exec_mask}
        floor_terms: dict[str, float] = {}  # class -> 2 * coef * gap / n_class
        floor_metrics: dict[str, float] = {}
        if floors.is_active:
            targets, coefs = floors.floors_at(progress), floors.coefs()
            penalty, floor_metrics = entropy_floor_penalty(entropy, {c: classes[c] for c in targets}, targets, coefs)
            floor_metrics["entropy/floor_penalty"] = float(penalty)
            for c, target in targets.items():
                if f"entropy/{c}_mean" in floor_metrics:  # absent when the class has no tokens
                    gap_c = max(0.0, target - floor_metrics[f"entropy/{c}_mean"])
                    floor_terms[c] = 2.0 * coefs[c] * gap_c / float(classes[c].sum())

        # 3) one optimizer step, gradient accumulated over micro-batches
        scale = float(batch.get("loss_scale", 1.0))
        need_logits = iv.entropy_bonus.is_active or bool(floor_terms)
        self.optimizer.zero_grad(set_to_none=True)
        pg_sum, kl_sum, ent_sum, clipped = 0.0, 0.0, 0.0, 0.0
        for s in range(0, len(comps), mb):
            lp, logits = self._logprobs(seqs[s:s + mb], attn[s:s + mb], comp_start[s:s + mb], t_comp, temp,
                                        need_logits, floor)
            m = mask[s:s + mb].to(self.device)
            tok_loss, was_clipped = ppo_token_loss(
                lp, old_lp[s:s + mb].to(self.device), adv[s:s + mb].to(self.device),
                clip_low=loss_cfg["clip_low"], clip_high=loss_cfg["clip_high"], dual_clip=loss_cfg["dual_clip"],
            )
            agg = {"total_tokens": total_tokens, "total_seqs": total_seqs}
            pg = aggregate(tok_loss, m, loss_cfg["aggregation"], **agg)
            loss = pg
            if iv.kl.is_active:
                kl = aggregate(kl_penalty(lp, ref_lp[s:s + mb].to(self.device), iv.kl.estimator), m,
                               loss_cfg["aggregation"], **agg)
                loss = loss + iv.kl.coef * kl
                kl_sum += kl.item()
            if need_logits:
                ent = entropy_from_logits(logits, temp, iv.entropy_bonus.chunk_size)
                if iv.entropy_bonus.is_active:
                    h = aggregate(ent, m, loss_cfg["aggregation"], **agg)
                    loss = loss - iv.entropy_bonus.coeff * h
                    ent_sum += h.item()
                for c, weight in floor_terms.items():
                    cm = classes[c][s:s + mb].to(self.device)
                    loss = loss - weight * (ent * cm).sum()
            loss = loss * scale
            loss.backward()
            pg_sum += pg.item()
            clipped += float((was_clipped & m).sum())
        params = [p for p in self.model.parameters() if p.requires_grad]
        grad_norm = float(torch.nn.utils.clip_grad_norm_(params, self.cfg["optim"]["grad_clip"]))
        self.optimizer.step()
        self.scheduler.step()

        metrics = {
            # the objective itself (the floor's gradient surrogate is not its value)
            "loss/total": scale * (pg_sum + iv.kl.coef * kl_sum - iv.entropy_bonus.coeff * ent_sum
                                   + floor_metrics.get("entropy/floor_penalty", 0.0)),
            "loss/policy": pg_sum,
            "train/grad_norm": grad_norm if math.isfinite(grad_norm) else float("nan"),
            "train/clip_frac": clipped / max(total_tokens, 1.0),
            "train/lr": self.scheduler.get_last_lr()[0],
            "train/logprob_gap_mean": float(gap.mean()) if gap.numel() else 0.0,
            "train/logprob_gap_max": float(gap.max()) if gap.numel() else 0.0,
            "train/tokens": total_tokens,
            "train/loss_scale": scale,
            "policy/entropy_mean": float(entropy[mask].mean()) if mask.any() else 0.0,
        }
        if iv.entropy_bonus.is_active:
            metrics["loss/entropy_bonus"] = ent_sum
        if use_ref:
            per_token = kl_penalty(learner_lp, ref_lp, iv.kl.estimator)
            metrics["kl/ref"] = float(per_token[mask].mean()) if mask.any() else 0.0
            metrics["kl/ref_k3"] = float(kl_penalty(learner_lp, ref_lp, "k3")[mask].mean()) if mask.any() else 0.0
            if iv.kl.is_active:
                metrics["loss/kl"] = kl_sum
        metrics.update(floor_metrics)
        if floor is not None:
            first = learner_lp[:, 0][mask[:, 0]]
            metrics["floor/action_logprob_min"] = float(first.min()) if first.numel() else 0.0
            metrics["floor/learner_min_valid_prob"] = min(action_min)
        metrics.update({f"credit/{k}": v for k, v in credit.stats.items()})
        return {"metrics": metrics, "exec_values": exec_values,
                "uncertainty": _token_samples(signals, credit.signal_after, mask, plan_flat)
                if batch.get("want_uncertainty") else None}

    # -- adapters and state -----------------------------------------------------------------------------
    def export_adapter(self, version: int) -> dict[str, bytes]:
        """The adapter as files (bytes), written to a fresh directory so vLLM never sees a stale one."""
        with tempfile.TemporaryDirectory(prefix=f"adapter-v{version}-") as d:
            self.model.save_pretrained(d)
            return {p.name: p.read_bytes() for p in Path(d).iterdir() if p.is_file()}

    def state_dict(self) -> bytes:
        """Adapter, optimizer, scheduler and RNG states, serialised (bytes travel through Ray unchanged)."""
        from peft import get_peft_model_state_dict

        state = {
            "adapter": {k: v.detach().cpu() for k, v in get_peft_model_state_dict(self.model).items()},
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "torch_rng": torch.random.get_rng_state(),
            "python_rng": random.getstate(),
        }
        buf = io.BytesIO()
        torch.save(state, buf)
        return buf.getvalue()

    def load_state_dict(self, blob: bytes) -> None:
        from peft import set_peft_model_state_dict

        state = torch.load(io.BytesIO(blob), weights_only=False)
        set_peft_model_state_dict(self.model, state["adapter"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        torch.random.set_rng_state(state["torch_rng"])
        random.setstate(state["python_rng"])

    def ready(self) -> bool:
        return True
