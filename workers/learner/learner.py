"""Learner: the HF policy (a PEFT LoRA adapter, or every weight under `learner.mode: full`), its optimizer, and one
training step; one rank of the learner group when the group has several (workers/learner/ranks.py).

Thin by design: the math lives in `workers.credit` (advantages) and `workers.objectives.losses` (loss), the batch and
how it is cut into mini- / micro-batches in `workers.learner.batch`, what a step reports in `workers.learner.metrics`.
It trains on sequences with a loss mask: the response window after the prompt holds the sampled ids of every turn
(loss mask True) and, for multi-turn episodes, the observation ids between turns (loss mask False). Every
per-token quantity reads the loss mask; a single-turn completion is the case of one contiguous sampled run.
`train_step` is split by concept: collate -> planning mask (these two `prepare`: CPU only, no model, no random
stream) -> score (no grad) -> credit -> entropy floors -> optimise -> metrics. The parts it composes each get what they use: `PolicyForward` (forward passes,
workers/learner/passes/forward.py), `Scorer` (the scoring pass), `Updater` (the PPO updates), `PolicyExport` and
`LearnerStateIO` (what leaves the learner: workers/learner/state.py).
In a group of N ranks every rank gets the whole batch, scores and trains its token-balanced share of each
(mini-)batch and gathers the scored tensors, so the credit stack runs on the whole batch, unchanged, on every rank;
the models (workers/learner/modules.py) are FSDP2-sharded and the gradients are summed over the ranks.
"""

from __future__ import annotations

import random
from contextlib import nullcontext
from dataclasses import dataclass

import torch
from torch import Tensor

from workers.credit import CreditConfig, compute_advantages, planning_masks, token_uncertainty
from workers.credit.decomposition import decomposition_metrics
from workers.credit.gae import gae, token_rewards
from workers.credit.plugin_paths import resolve_plugins
from workers.learner.batch import Batch, Scored, collate, sampled_runs
from workers.learner.config import LearnerConfig
from workers.learner.context import Layout, PolicyOptim, Scoring, UpdatePlan
from workers.learner.critic import ADAPTER as CRITIC_ADAPTER
from workers.learner.critic import FullCritic, LoraCritic
from workers.learner.inputs import LearnerBatch, RunSettings, StepResult
from workers.learner.metrics import critic_metrics, probe_metrics, step_metrics, token_samples
from workers.learner.modules import frozen_copy, load_causal_lm, lora_config, shard
from workers.learner.offload import StateOffload
from workers.learner.passes.forward import PolicyForward
from workers.learner.passes.scoring import Scorer
from workers.learner.passes.token_stats import TokenStats
from workers.learner.ranks import ONE_RANK, Ranks, join_group, rendezvous_address
from workers.learner.state import LearnerStateIO, PolicyExport, Progress
from workers.learner.update import Updater
from workers.models.loading import head_is_linear, load_tokenizer, token_pieces
from workers.objectives.interventions import InterventionsConfig, scoring_pass_needs
from workers.objectives.losses import entropy_floor_surrogate
from workers.objectives.offpolicy import offpolicy_weights
from workers.startup import imports_done
from workers.sync.policy import PolicyUpdate

POLICY, MODELS = "policy", "models"  # offload groups (workers/learner/offload.py): the policy's weights, the others'


def _decomposes(credit: CreditConfig) -> bool:
    """Whether the learner logs `credit/decomp_*`: asked for, or the signal is computed from logits anyway."""
    return credit.log_decomposition or credit.uncertainty_kind != "surprisal"


@dataclass(frozen=True)
class StepInputs:
    """A step's batch as `Learner.prepare` made it: the plain batch, its padded tensors, its planning mask."""

    batch: LearnerBatch
    b: Batch
    planning: Tensor


class Learner:
    """Owns model(s) + AdamW + LR schedule. All inputs arrive as plain Python data (Ray-friendly)."""

    def __init__(self, model_path: str, *, learner: LearnerConfig, credit: CreditConfig, run: RunSettings,
                 interventions: InterventionsConfig | None = None, ranks: Ranks = ONE_RANK,
                 init_method: str | None = None) -> None:
        from transformers import get_constant_schedule_with_warmup, get_cosine_schedule_with_warmup

        cuda = torch.cuda.is_available()
        self.device = "cuda" if cuda else "cpu"
        self.ranks = ranks
        dtype = run.dtype
        if dtype == "auto":
            dtype = "bfloat16" if cuda else "float32"
        self.dtype = getattr(torch, dtype)  # the compute dtype (and the rollout engine's)
        self.cfg = learner
        self.full = learner.mode == "full"
        # sharded: FSDP2 over the group; also one rank that offloads, or trains every weight on a GPU (fp32 master
        # weights, bf16 compute: full fine-tuning at lr 1e-6 would lose its updates in bf16 weights)
        offload = learner.cpu_offload and cuda  # offloads GPU state; nothing to offload on a CPU
        self.sharded = ranks.grouped or offload or (self.full and cuda)
        if self.sharded:  # FSDP needs a process group, of one rank when this learner has no group
            join_group(ranks, init_method or rendezvous_address(), cuda, timeout_s=run.collective_timeout_s)
        weights_dtype = torch.float32 if self.sharded else self.dtype
        self.credit = credit
        self.iv = interventions if interventions is not None else InterventionsConfig()
        self.total_steps = max(run.total_steps, 1)
        self.detector = resolve_plugins(self.credit).get("planning_detector")  # import plugins early
        torch.manual_seed(run.seed)  # the same on every rank: FSDP shards identical initial weights
        random.seed(run.seed)
        self.tokenizer = load_tokenizer(model_path)
        self._build_models(model_path, weights_dtype, cuda, offload)
        opt = learner.optim
        self.params = [p for n, p in self.model.named_parameters()  # the policy's: never the critic adapter's
                       if p.requires_grad and f".{CRITIC_ADAPTER}." not in n]
        self.optimizer = torch.optim.AdamW(self.params, lr=opt.lr, betas=tuple(opt.betas),
                                           weight_decay=opt.weight_decay)
        if opt.schedule == "cosine":
            self.scheduler = get_cosine_schedule_with_warmup(self.optimizer, opt.warmup_steps, run.total_steps)
        else:
            self.scheduler = get_constant_schedule_with_warmup(self.optimizer, opt.warmup_steps)
        self.seed, self.progress = run.seed, Progress()
        # the PPO ratio's anchor pi_old: "recompute" = the scoring pass's log-probs (verl's default, decoupled
        # mode), "rollout" = vLLM's (verl's bypass mode), which skips the scoring pass
        self.skip_scoring = learner.old_logprobs == "rollout"
        if self.skip_scoring and (needs := scoring_pass_needs(self.credit, self.iv)):
            raise ValueError(f"old_logprobs 'rollout' skips the scoring pass that {needs} needs")
        self._compose()
        imports_done()  # the rank has its imports and models: workers/startup.py

    def _compose(self) -> None:
        """The parts, each given what it uses."""
        layout = Layout(self.full, self.sharded, self.dtype, self.device, self.ranks)
        optim = PolicyOptim(self.params, self.optimizer, self.scheduler)
        self.forward = PolicyForward(self.model, self.reference, layout, head_only=self._head_only,
                                     optim=self.cfg.optim)
        self.scorer = Scorer(self.forward, self.critic, self.credit, self.iv)
        self.updater = Updater(self.forward, optim, self.critic, cfg=self.cfg, iv=self.iv, seed=self.seed)
        self.exporter = PolicyExport(self.model, self.critic, layout)
        self.state_io = LearnerStateIO(self.model, optim, self.critic, layout, self.progress)
        self.offloader = self._offload_parts() if self.cfg.offload_between_steps else None

    def _offload_parts(self) -> StateOffload:
        """learner.offload_between_steps (workers/learner/offload.py): every optimizer's state; under full mode
        also the weights of the policy, its reference and the critic (LoRA keeps its frozen base and adapter)."""
        critic = self.critic
        critic_module = critic.head if isinstance(critic, LoraCritic) else getattr(critic, "model", None)
        optimizers = [self.optimizer] + ([critic.optimizer] if critic is not None else [])
        weights = {POLICY: [self.model], MODELS: [self.reference, critic_module]} if self.full else {}
        return StateOffload(optimizers, weights, [self.model, critic_module])

    def load_base(self, model_path: str, dtype: torch.dtype, gradient_checkpointing: bool):
        """The transformers model the policy is built on: a fresh load. A slot of the shared learner
        (workers/learner/pool/shared.py) overrides it with a module tree of its own over one shared copy of the
        frozen tensors; everything else it runs is this class's."""
        return load_causal_lm(model_path, dtype, self.device, gradient_checkpointing)

    def _build_models(self, model_path: str, weights_dtype: torch.dtype, cuda: bool, offload: bool) -> None:
        """Policy (+ the LoRA critic's adapter on it), the frozen reference (full mode, when KL reads it) and the
        full critic, each sharded as soon as it is built, so at most one unsharded model is in memory at a time."""
        ranks, learner = self.ranks, self.cfg
        grad_ckpt = learner.gradient_checkpointing

        def shard_fn(m):
            return shard(m, ranks.world, cuda=cuda, cpu_offload=offload, param_dtype=self.dtype) \
                if self.sharded else m

        base = self.load_base(model_path, weights_dtype, grad_ckpt)
        self._head_only = head_is_linear(base)
        critic = learner.critic if self.credit.uses_critic else None
        critic_kind = (critic.model if critic is not None else None) or ("full" if self.full else "lora")
        critic_lora = lora_config((critic.lora if critic is not None else None) or learner.lora)
        if self.full:  # the policy is the model itself; a LoRA critic wraps it in a PeftModel of its adapter
            lora_critic = critic is not None and critic_kind == "lora"
            self.model = LoraCritic.on_full_policy(base, critic_lora) if lora_critic else base
        else:
            from peft import get_peft_model

            self.model = get_peft_model(base, lora_config(learner.lora))
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

    # -- counters and forward passes (tests and benchmarks read them) -----------------------------------
    @property
    def steps_done(self) -> int:
        return self.progress.steps_done

    @property
    def optimizer_steps(self) -> int:
        return self.progress.optimizer_steps

    @property
    def reference_passes(self) -> int:
        return self.forward.reference_passes

    def _logprobs(self, seqs: Tensor, attn: Tensor, comp_start: Tensor, comp_len: int, temperature: float,
                  want_stats: bool, floor: tuple[list[int], float] | None = None) -> tuple[Tensor, TokenStats | None]:
        """`PolicyForward.logprobs` of `self.model` (read at call time) at `temperature` and `floor`."""
        return self.forward.logprobs(seqs, attn, comp_start, comp_len, Scoring(temperature, floor), want_stats,
                                     self.model)

    def _score(self, b: Batch, temp: float, floor) -> Scored:
        return self.scorer.score(b, Scoring(temp, floor))

    # -- training -----------------------------------------------------------------------------------------
    def train_step(self, batch: LearnerBatch) -> StepResult:
        """One training step on one batch of sequences (workers/learner/inputs.py: `LearnerBatch`): one optimizer
        step, or one per PPO mini-batch and epoch.

        The PPO ratio is to pi_old: the scoring pass's log-probs (old_logprobs 'recompute'), or vLLM's
        ('rollout', no scoring pass); the off-policy weights (`batch.offpolicy_settings()`) need 'recompute'.
        Returns the metrics plus `exec_values` (raw execution-token uncertainties, for SEPA's auto schedule) and
        `uncertainty` (the samples when `batch.want_uncertainty`, else None).
        """
        return self.train_prepared(self.prepare(batch))

    def prepare(self, batch: LearnerBatch) -> StepInputs:
        """The step's CPU work that reads neither the model nor a random stream, a pure function of `batch` (and
        this learner's tokenizer and credit settings): the padded tensors and the planning mask. `train_step` is
        `train_prepared(prepare(batch))`; the shared learner runs it outside its device lock
        (workers/learner/pool/shared.py), beside another slot's training."""
        b = collate(batch, self.tokenizer.pad_token_id)
        return StepInputs(batch, b, self._planning(b))

    def train_prepared(self, prepared: StepInputs) -> StepResult:
        """`train_step` on a batch `prepare` made (by this learner: its tokenizer and settings)."""
        batch, b, planning = prepared.batch, prepared.b, prepared.planning
        moved = self.offloader.reload() if self.offloader is not None else {}  # the state left in host memory
        iv = self.iv
        floor = None
        if batch.action_token_ids and iv.probability_floor.is_active:
            floor = (list(batch.action_token_ids), iv.probability_floor.min_prob)
        scoring, step = Scoring(float(batch.temperature), floor), int(batch.step)
        progress = min(max(step / self.total_steps, 0.0), 1.0)
        self.model.train()

        probe, offpolicy = None, batch.offpolicy_settings()
        if self.skip_scoring:  # old_logprobs: rollout; the first update's forward measures the gap instead
            if offpolicy.active:
                raise ValueError("the off-policy correction (tis_cap, rollout.correction, rejection, mismatch "
                                 "metrics) needs pi_prox: old_logprobs 'recompute'")
            nan = torch.full_like(b.old_lp, float("nan"))
            scored = Scored(b.old_lp, token_uncertainty("surprisal", logprobs=b.old_lp), nan, None, None)
            probe = {"lp": nan.clone(), "entropy": nan.clone()}
        else:
            scored = self.scorer.score(b, scoring)
        # the ratio's anchor is pi_prox (pi_old); the weight to pi_behav is apart from it (objectives/offpolicy.py)
        ratio_base = scored.learner_lp
        tis, tis_metrics = offpolicy_weights(scored.learner_lp, b.old_lp, b.mask, offpolicy) \
            if offpolicy.active else (None, {})
        gae_adv = returns = None
        if self.critic is not None:
            gae_adv, returns = self._gae(batch, b, scored.values)
        shape = (b.n_groups, b.group, b.t)
        credit = compute_advantages(
            b.rewards, scored.signals.reshape(shape), b.mask.reshape(shape),
            self.credit, planning=planning.reshape(shape) if self._detects_planning() else None,
            sepa_lambda=float(batch.sepa_lambda), step=step,
            token_advantages=gae_adv.reshape(shape) if gae_adv is not None else None,
        )
        adv = credit.token_advantages.reshape(-1, b.t)
        classes = {"all": b.mask, "planning": b.mask & planning, "execution": b.mask & ~planning}
        floors = iv.entropy_floor  # the penalty's value and, per class, its gradient surrogate's weight
        floor_terms, floor_metrics = entropy_floor_surrogate(
            scored.entropy, classes, floors.floors_at(progress), floors.coefs()) if floors.is_active else ({}, {})
        plan = UpdatePlan(b, scored, adv, returns, scoring, float(batch.loss_scale), step, floor_terms, classes,
                          ratio_base=ratio_base, tis=tis, probe=probe)
        sums = self.updater.optimise(plan, self.progress.steps_done)
        self.progress.optimizer_steps += sums["policy_steps"]
        self.progress.steps_done += 1

        ppo_epochs = self.cfg.optim.ppo_epochs
        metrics = step_metrics(plan, sums, floor_metrics, iv=iv, ppo_epochs=ppo_epochs,
                               lr=self.scheduler.get_last_lr()[0])
        metrics.update(tis_metrics)
        if probe is not None:
            metrics.update(probe_metrics(b, probe))
        if self.critic is not None:
            metrics.update(critic_metrics(scored.values, returns, b.mask, sums, ppo_epochs=ppo_epochs))
        metrics.update({f"credit/{k}": v for k, v in credit.stats.items()
                        if not (self.critic is not None and k.startswith("groups_skipped"))})  # GAE skips none
        if _decomposes(self.credit):  # surprisal vs entropy from this pass (workers/credit/decomposition.py)
            lam = float(batch.sepa_lambda) if "sepa" in self.credit.stages else None
            metrics.update(decomposition_metrics(-scored.learner_lp, scored.entropy, b.mask, planning,
                                                 sepa_lambda=lam))
        if self.offloader is not None:  # until the next step the engine beside this rank may have the memory
            metrics.update({**moved, **self.offloader.offload()})
        counts = b.mask.sum(-1).clamp(min=1)
        return StepResult(metrics=metrics, exec_values=scored.signals[classes["execution"]],
                          uncertainty=token_samples(scored.signals, credit.signal_after, b.mask, planning,
                                                    entropy=scored.entropy if _decomposes(self.credit) else None)
                          if batch.want_uncertainty else None,
                          episode_advantages=credit.episode_advantages.reshape(-1).tolist(),
                          token_advantage_means=((adv * b.mask).sum(-1) / counts).tolist())

    def _gae(self, batch: LearnerBatch, b: Batch, values: Tensor) -> tuple[Tensor, Tensor]:
        """GAE advantages and returns `[B, T]` from the turn rewards and the critic's (pre-update) values."""
        g = self.credit.gae
        flat = b.rewards.reshape(-1).tolist()
        positions = batch.reward_positions or [[max(i for i, m in enumerate(row) if m)] if any(row) else []
                                                       for row in b.mask_rows]
        rewards = batch.turn_rewards or [[r] if pos else [] for r, pos in zip(flat, positions, strict=True)]
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

    # -- what leaves the learner (workers/learner/state.py) ---------------------------------------------
    def _resident(self, *groups: str):
        """The offloaded `groups` (all when none is named) back on the device for one call (a no-op context
        without offload)."""
        return self.offloader.resident(*groups) if self.offloader is not None else nullcontext()

    def export_policy(self, version: int) -> PolicyUpdate | None:
        with self._resident(POLICY):  # only the policy: its reference, critic and optimizer stay away
            return self.exporter.export_policy(version)

    def export_adapter(self, version: int) -> dict[str, bytes] | None:
        with self._resident(POLICY):
            return self.exporter.export_adapter(version)

    def checkpoint_files(self) -> dict[str, bytes]:
        with self._resident():
            return self.state_io.checkpoint_files()

    def restore(self, files, source: str = "checkpoint") -> None:
        with self._resident():
            self.state_io.restore(files, source)

    def state_dict(self) -> bytes:
        with self._resident():
            return self.state_io.state_dict()

    def load_state_dict(self, blob: bytes, source: str = "learner state") -> None:
        with self._resident():
            self.state_io.load_state_dict(blob, source)

    def ready(self) -> bool:
        return True
