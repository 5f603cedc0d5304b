"""The rollout section of a trial's schema (`rollout:`): how the engines sample (`engine`), the batch and its
refill (`fill`), overlong shaping and rejection, and the rollout mode with its staleness settings (sync,
one_step_off, async: orchestrator/trial/step/staleness.py). Checks within the section live here; those across
sections (the model's length, the task) in orchestrator/config/trial.py."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from orchestrator.config.sections import StrictConfig


class EngineConfig(StrictConfig):
    """`vllm.LLM` settings a GPU user tunes, passed through to every rollout worker's engine (workers/rollout/worker.py).
    None = vLLM's own default (or the platform's, for `enforce_eager`)."""

    tensor_parallel_size: int = Field(1, ge=1, description="GPUs per rollout worker's engine")
    gpu_memory_utilization: float = Field(0.85, gt=0.0, le=1.0)
    enforce_eager: bool | None = Field(None, description=(
        "None: off on a GPU (CUDA graphs run), on for the CPU build"))
    enable_prefix_caching: bool = Field(True, description="the n samples of a prompt share its prefill")
    max_num_seqs: int | None = Field(None, ge=1, description="sequences per engine step")
    max_num_batched_tokens: int | None = Field(None, ge=1, description="tokens per engine step")
    in_process: bool | None = Field(None, description=(
        "run vLLM's engine core and model worker inside the rollout actor's process. None: on for the CPU build "
        "(saves two process starts per engine) except with rollout.mode one_step_off or async with max_staleness > "
        "0 (generation overlapping the "
        "learner in-process fights it for the cores), off on a GPU (a separate engine core overlaps scheduling "
        "with the forward pass)"))

    @model_validator(mode="after")
    def _one_worker_in_process(self) -> EngineConfig:
        if self.in_process and self.tensor_parallel_size > 1:
            raise ValueError("in_process runs one model worker: it needs tensor_parallel_size 1")
        return self


class FillConfig(StrictConfig):
    """Refill (DAPO's dynamic sampling): sample rounds of `rollout.prompts_per_step` fresh prompts (or levels)
    until `groups` usable groups are in hand (rewards not all equal, finite, kept by the RV filter; under
    credit.advantage_mode gae, whose uniform groups still carry signal, rollout.skip_uninformative defaults to
    false and uniform groups count too) or `max_rounds` rounds have run; the learner trains on exactly the first
    `groups` of them (the last round's surplus is dropped, in sampling order)."""

    groups: int = Field(ge=1, description="usable groups the learner trains on every step")
    max_rounds: int = Field(4, ge=1, description="rounds of prompts_per_step prompts at most per step")


class OverlongConfig(StrictConfig):
    """What happens to samples that hit the length limit (single-turn: the completion stopped at
    rollout.max_tokens; multi-turn: a turn did, or the episode ran out of model.max_model_len)."""

    mode: Literal["keep", "mask", "penalty"] = Field("keep", description=(
        "keep: trained like finished ones; mask: their tokens leave the loss (DAPO's overlong filtering, "
        "counted in train/overlong_masked); penalty: DAPO's soft overlong punishment, reward - penalty x "
        "(length - (max_tokens - buffer)) / buffer over the last `buffer` tokens before the limit"))
    buffer: int = Field(16, ge=1, description="penalty: the last this many tokens before max_tokens (per turn)")
    penalty: float = Field(1.0, ge=0.0, description="penalty: reward subtracted at the limit")


class RejectionConfig(StrictConfig):
    """Sequence rejection by a policy-mismatch measure (workers/objectives/offpolicy.py): a sequence whose mean
    over its trained tokens of the chosen estimator of KL(pi_behav || pi_prox) exceeds `threshold` leaves the
    loss (its tokens weigh 0; the loss's denominators are unchanged)."""

    measure: Literal["k1", "k2", "k3"] = Field("k3", description=(
        "the per-token estimator, r = pi_prox / pi_behav: k1 = -log r (its mean's absolute value is compared), "
        "k2 = (log r)^2 / 2, k3 = r - 1 - log r"))
    threshold: float = Field(gt=0.0, description="sequences whose measure exceeds this are rejected")


class RolloutConfig(StrictConfig):
    num_workers: int = Field(2, ge=1)
    prompts_per_step: int = Field(16, ge=1)
    n: int = Field(8, ge=1, description="rollouts per prompt (the group size G)")
    temperature: float = Field(1.0, gt=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0, description=(
        "< 1 needs learner.old_logprobs 'rollout': the learner cannot reproduce vLLM's renormalised nucleus"))
    max_tokens: int = Field(64, ge=1)
    skip_uninformative: bool | None = Field(None, description=(
        "drop groups whose rewards are all equal before training (their group-relative advantages are 0). "
        "None: true, except under credit.advantage_mode gae, whose advantages of such groups are not 0"))
    fill: FillConfig | None = Field(None, description=(
        "refill to a fixed number of usable groups per step; None: train on what prompts_per_step gives"))
    overlong: OverlongConfig = OverlongConfig()
    # agentic (multi-turn) tasks; max_tokens is then per turn
    max_turns: int = Field(5, ge=1, description="turns per episode (agentic tasks)")
    max_actions_per_turn: int = Field(2, ge=1, description="actions read from one answer (agentic tasks)")
    max_actions_per_episode: int = Field(10, ge=1, description="actions per episode (agentic tasks)")
    engine: EngineConfig = EngineConfig()
    mode: Literal["sync", "one_step_off", "async"] = Field("sync", description=(
        "sync: each step samples with the policy it trains. one_step_off: step t+1 is generated (with the "
        "policy of step t-1's update) while the learner trains on step t; the same as async with max_staleness 1 "
        "and correction tis. async: generation runs ahead of the learner by at most rollout.max_staleness policy "
        "versions (docs: Staleness)"))
    max_staleness: int | None = Field(None, ge=0, description=(
        "async: how many policy versions a trained group may lag the policy it trains: staleness = the learner's "
        "version when it trains the group - the version that sampled the group's oldest token. 0 is the "
        "synchronous trial, 1 one_step_off; the generator samples up to this many steps ahead while the learner "
        "trains. None: 1 under async; sync and one_step_off set it to theirs (0, 1) and refuse another"))
    admission: Literal["paced", "discard"] = Field("paced", description=(
        "async: what happens at the bound. paced: the generator waits rather than sample a batch that would be "
        "trained past max_staleness; nothing is thrown away and the oldest batch trains first (reproducible bit "
        "for bit). discard: the generator never waits (it samples one step further ahead); groups whose "
        "staleness at training exceeds max_staleness are dropped, counted in async/groups_dropped, and that "
        "step trains on what is left (possibly nothing, which skips its update). sync and one_step_off are paced"))
    decode_per_step: int | None = Field(None, ge=1, description=(
        "async with admission discard: groups are admitted as they complete. A deterministic clock in tokens: a "
        "sample decodes decode_per_step tokens while the learner takes one step, so a group sampled ahead is ready "
        "ceil(its longest completion / decode_per_step) steps after it was sampled, and long groups train staler "
        "(orchestrator/trial/step/completion.py). None: whole batches, as before. Under paced the learner waits "
        "for the oldest batch, so the clock changes nothing. Single-turn tasks only, without rollout.fill"))
    difficulty_samples: int | None = Field(None, ge=1, description=(
        "async: each offered problem is also sampled this many times by the starting policy (the base model: a "
        "LoRA trial's first adapter is zero), seeded apart from the training samples, and the composition's "
        "difficulty bins (async/*_by_difficulty/*) are that pass rate, a property of the problem the same in "
        "every arm of a seed; None: each group's own pass rate under the policy that sampled it, which is older, "
        "so likelier 'hard', in the staler arms. Single-turn LoRA trials (on a shared base the pool's engines serve it "
        "under a zero adapter of their own)"))
    correction: Literal["none", "tis", "decoupled"] | None = Field(None, description=(
        "the off-policy correction of the policy loss, with w = pi_prox / pi_behav (pi_prox: the learner's "
        "recomputed log-prob before the update, pi_behav: vLLM's at sampling). none: the PPO ratio to pi_prox "
        "only; tis: the loss weighted by min(w, tis_cap) (truncated importance sampling); decoupled: AReaL's "
        "decoupled PPO, weighted by w where w <= tis_cap and masked where it exceeds it. All need learner."
        "old_logprobs 'recompute' and vLLM log-probs on every trained token. None: tis when tis_cap is set or "
        "the trial is stale (one_step_off, async with max_staleness > 0), else none"))
    correction_level: Literal["token", "sequence"] = Field("token", description=(
        "where the correction's weight is taken: token: per token; sequence: one weight per sequence, the "
        "product of its tokens' ratios (exp of the summed log-ratio), on every token of it"))
    rejection: RejectionConfig | None = Field(None, description=(
        "drop whole sequences whose policy mismatch exceeds a threshold (apart from the correction's weight); "
        "None: no rejection"))
    correction_metrics_only: bool = Field(False, description=(
        "compute the correction's weights, the rejection and the mismatch (logged under mismatch/ and tis/ or "
        "decoupled/) but leave the loss as correction none would: to measure what a correction would do"))
    tis_cap: float | None = Field(None, ge=1.0, description=(
        "the correction's cap C: tis truncates the weight at C (verl's token-level rollout_is, threshold 2); "
        "decoupled masks the tokens (or sequences) whose weight exceeds C (AReaL's behav_imp_weight_cap). "
        "None: 2.0 whenever a correction is on. Setting it with correction unset turns tis on (the vLLM / learner "
        "mismatch of a sync trial)"))

    @property
    def staleness_bound(self) -> int:
        """The most policy versions a trained batch may lag: 0 (sync), 1 (one_step_off), max_staleness (async)."""
        return {"sync": 0, "one_step_off": 1}.get(self.mode, 1 if self.max_staleness is None else self.max_staleness)

    @property
    def checks_mismatch(self) -> bool:
        """Whether the learner needs pi_prox beside vLLM's log-probs: a correction, a rejection or its metrics."""
        return self.correction != "none" or self.rejection is not None or self.correction_metrics_only

    @model_validator(mode="after")
    def _staleness_settings(self) -> RolloutConfig:
        bound = self.staleness_bound
        if self.max_staleness not in (None, bound):
            raise ValueError(f"max_staleness {self.max_staleness} needs rollout.mode 'async' (mode '{self.mode}' "
                             f"is max_staleness {bound})")
        self.max_staleness = bound  # the dumped config says what ran
        if self.decode_per_step is not None and self.mode != "async":
            raise ValueError(f"decode_per_step admits groups as they complete under rollout.mode 'async': mode "
                             f"'{self.mode}' trains whole batches")
        if self.decode_per_step is not None and self.fill is not None:
            raise ValueError("decode_per_step admits single groups as they complete; rollout.fill chooses a "
                             "step's groups within its whole batch: use one or the other")
        if self.difficulty_samples is not None and self.mode != "async":
            raise ValueError(f"difficulty_samples bins the groups of rollout.mode 'async' (the composition of what "
                             f"was trained); mode '{self.mode}' logs no composition")
        if self.mode != "async" and self.admission != "paced":
            raise ValueError(f"admission '{self.admission}' needs rollout.mode 'async' (mode '{self.mode}' is paced)")
        if self.correction is None:
            self.correction = "tis" if (self.tis_cap is not None or self.staleness_bound > 0) else "none"
        if self.correction == "none" and self.tis_cap is not None:
            raise ValueError("tis_cap is the cap of a correction: with correction 'none' nothing reads it "
                             "(drop tis_cap, or choose correction 'tis' or 'decoupled')")
        if self.correction != "none" and self.tis_cap is None:
            self.tis_cap = 2.0
        if self.correction == "none" and self.correction_level != "token":
            raise ValueError("correction_level chooses where the correction's weight is taken: with correction "
                             "'none' there is none")
        return self

    @model_validator(mode="after")
    def _fill_reachable(self) -> RolloutConfig:
        if self.fill is not None and self.fill.groups > self.prompts_per_step * self.fill.max_rounds:
            raise ValueError(f"fill.groups ({self.fill.groups}) can never be reached: at most prompts_per_step x "
                             f"fill.max_rounds = {self.prompts_per_step * self.fill.max_rounds} groups are sampled")
        if self.overlong.mode == "penalty" and self.overlong.buffer > self.max_tokens:
            raise ValueError(f"overlong.buffer ({self.overlong.buffer}) must be <= max_tokens ({self.max_tokens})")
        return self

    @model_validator(mode="after")
    def _action_budget(self) -> RolloutConfig:
        if self.max_actions_per_turn > self.max_actions_per_episode:
            raise ValueError(f"max_actions_per_turn ({self.max_actions_per_turn}) must be <= "
                             f"max_actions_per_episode ({self.max_actions_per_episode})")
        return self
