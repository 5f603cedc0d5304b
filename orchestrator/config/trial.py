"""The one typed schema of a trial. YAML keys == field names; `extra="forbid"` everywhere. The model, rollout and
engine sections are here; the self-contained others (eval, checkpoint, resources, timeouts, wandb, plugins,
logging) are in orchestrator/config/sections.py.

Defaults run the local default: the tiny reasoning model (built locally, warm-started: workers/tiny/reasoner.py) on
the chain task, two vLLM-CPU rollout workers, a LoRA learner, on a local Ray. Tests where learning is not the
point pin `model: {name: tiny}` (random init) with `task: {name: arithmetic}` and short completions.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, ValidationError, model_validator
from pydantic_core import PydanticCustomError

from orchestrator.config.eval_sets import agentic_mismatch, label_clash
from orchestrator.config.sections import (
    CheckpointSettings,
    EvalConfig,
    LoggingConfig,
    PluginsConfig,
    ResourcesConfig,
    StrictConfig,
    TimeoutsConfig,
    TrialWandb,
)
from workers.credit.config import CreditConfig, SepaConfig
from workers.learner.config import FULL_MODE_LR, LearnerConfig
from workers.objectives.interventions import InterventionsConfig, scoring_pass_needs
from workers.tasks.config import ChainConfig
from workers.tasks.mix import MixConfig, TrialTaskConfig, members
from workers.tasks.plugins import add_plugin_paths

AGENTIC_MAX_MODEL_LEN = 2048


def _refuse(loc: tuple, value: Any, msg: str) -> None:
    """A check across sections that is about one key: the error names that key's path."""
    raise ValidationError.from_exception_data("trial", [
        {"type": PydanticCustomError("trial", msg), "loc": loc, "input": value}])


class ModelConfig(StrictConfig):
    name: str = Field("tiny-reasoner", description=(
        "hub name, local path, or a locally built model: 'tiny-reasoner' (warm-started on the chain task), "
        "'tiny' (random init, arithmetic vocabulary), 'tiny-agent' (agentic tasks), or a tiny random-init model "
        "of a seed's family (workers/tiny/families.py): 'tiny-qwen2-base', 'tiny-qwen2-instruct', 'tiny-qwen3', "
        "'tiny-qwen3-2507'"))
    tiny_seed: int = 0
    dtype: Literal["auto", "float32", "bfloat16"] = Field("auto", description="auto: fp32 on CPU, bf16 on GPU")
    max_model_len: int | None = Field(None, ge=16, description=(
        "context length of the engines. None: 128 for single-turn tasks, 2048 for agentic ones (a 5-turn episode "
        "is the first prompt + turns x (answer + observation)); checked against the task's first prompt before "
        "launch"))


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


class TrialConfig(StrictConfig):
    name: str = "local"
    seed: int = 0
    steps: int = Field(40, ge=1)
    output_dir: str | None = Field(None, description="absolute dir or URI for metrics.jsonl; set by the launcher")
    model: ModelConfig = ModelConfig()
    plugins: PluginsConfig = PluginsConfig()
    task: TrialTaskConfig = ChainConfig()
    rollout: RolloutConfig = RolloutConfig()
    learner: LearnerConfig = LearnerConfig()
    credit: CreditConfig = CreditConfig()
    interventions: InterventionsConfig = InterventionsConfig()
    eval: EvalConfig = EvalConfig()
    checkpoint: CheckpointSettings = CheckpointSettings()
    resources: ResourcesConfig = ResourcesConfig()
    timeouts: TimeoutsConfig = TimeoutsConfig()
    wandb: TrialWandb = TrialWandb()
    logging: LoggingConfig = LoggingConfig()
    replay: str | None = Field(None, description=(
        "a run directory whose saved batches (logging.batches) the trial trains on instead of sampling "
        "(orchestrator/trial/artifacts/replay.py); set by `python -m orchestrator trial --replay RUN_DIR`, which checks it"))
    labels: dict[str, Any] = Field(default_factory=dict, description=(
        "extra top-level keys logged with the config (campaigns set condition, seed and every swept key)"))

    @model_validator(mode="before")
    @classmethod
    def _plugin_paths(cls, data: Any) -> Any:
        """Plugin directories go on sys.path before `task` is validated: a plugin task is imported to be read."""
        paths = data.get("plugins", {}).get("paths") if isinstance(data, dict) else None
        if isinstance(paths, list) and all(isinstance(p, str) for p in paths):
            add_plugin_paths(paths)
        return data

    @model_validator(mode="after")
    def _eval_sets(self) -> TrialConfig:
        labels = self.task.labels if isinstance(self.task, MixConfig) else []
        why = agentic_mismatch(self.eval.sets, self.task.agentic) or label_clash(self.eval.sets, labels)
        if why:
            raise ValueError(f"eval.sets: {why}")
        return self

    @model_validator(mode="after")
    def _learner_mode(self) -> TrialConfig:
        lrn = self.learner
        if lrn.mode == "full" and "lr" not in lrn.optim.model_fields_set:
            lrn.optim.lr = FULL_MODE_LR
        if lrn.critic.model is None:
            lrn.critic.model = lrn.mode
        if lrn.cpu_offload and self.resources.learner_gpus == 0:
            raise ValueError("learner.cpu_offload moves the learner's GPU state to CPU memory: it needs "
                             "resources.learner_gpus > 0")
        if lrn.critic.model == "full" and lrn.mode == "lora":
            raise ValueError("learner.critic.model 'full' needs learner.mode 'full': under lora only the adapter "
                             "trains, and the critic is an adapter on the policy's frozen base (critic.model 'lora')")
        return self

    @model_validator(mode="after")
    def _colocated(self) -> TrialConfig:
        r, ro = self.resources, self.rollout
        if r.placement != "colocated":
            return self
        if ro.mode == "one_step_off":
            raise ValueError("rollout.mode one_step_off generates while the learner trains, which needs both awake "
                             "on separate GPUs: use resources.placement 'separate', or rollout.mode 'sync'")
        if ro.mode == "async":
            raise ValueError("rollout.mode async generates while the learner trains, which needs both awake on "
                             "separate GPUs (a colocated engine sleeps while its learner trains): use "
                             "resources.placement 'separate', or rollout.mode 'sync' (max_staleness 0)")
        if r.learner_gpus != 1:
            raise ValueError(f"resources.placement 'colocated' puts each learner rank and one engine on one GPU: it "
                             f"needs resources.learner_gpus 1 (got {r.learner_gpus:g})")
        if ro.engine.tensor_parallel_size != 1:
            raise ValueError("resources.placement 'colocated' runs one engine per learner GPU: it needs "
                             "rollout.engine.tensor_parallel_size 1")
        if "num_workers" in ro.model_fields_set and ro.num_workers != r.learner_ranks:
            raise ValueError(f"rollout.num_workers ({ro.num_workers}) must equal resources.learner_ranks "
                             f"({r.learner_ranks}) under placement 'colocated' (one engine beside each rank)")
        ro.num_workers = r.learner_ranks
        return self

    @model_validator(mode="after")
    def _fits(self) -> TrialConfig:
        if self.model.max_model_len is None:
            self.model.max_model_len = AGENTIC_MAX_MODEL_LEN if self.task.agentic else 128
        if self.rollout.max_tokens >= self.model.max_model_len:
            raise ValueError("rollout.max_tokens must be smaller than model.max_model_len")
        if self.task.agentic and self.model.name in ("tiny", "tiny-reasoner"):
            raise ValueError(f"task '{self.task.name}' needs a model whose vocabulary covers the environment's "
                             f"text: use model.name 'tiny-agent' (or a real model), not '{self.model.name}'")
        if any(t.name == "chain" for t in members(self.task)) and self.model.name == "tiny":
            raise ValueError("task 'chain' needs a model that reads its text: use model.name 'tiny-reasoner' (or a "
                             "real model), or task.name 'arithmetic' with 'tiny'")
        if self.task.agentic and self.rollout.decode_per_step is not None:
            raise ValueError("rollout.decode_per_step clocks single-turn completions by their length; "
                             f"task '{self.task.name}' plays multi-turn episodes (drop decode_per_step)")
        if self.task.agentic and self.interventions.probability_floor.is_active:
            raise ValueError("interventions.probability_floor needs a task with a one-token action set; "
                             f"task '{self.task.name}' answers with multi-token actions")
        if self.learner.old_logprobs == "rollout" and (needs := self._scoring_pass_needs()):
            raise ValueError(f"learner.old_logprobs 'rollout' skips the scoring pass that {needs} needs: "
                             "use 'recompute'")
        if self.rollout.engine.tensor_parallel_size > max(self.resources.worker_gpus, 1.0):
            raise ValueError(f"rollout.engine.tensor_parallel_size ({self.rollout.engine.tensor_parallel_size}) "
                             f"needs resources.worker_gpus >= it (got {self.resources.worker_gpus})")
        if self.rollout.skip_uninformative is None:
            self.rollout.skip_uninformative = not self.credit.uses_critic
        if self.rollout.top_p < 1.0 and self.learner.old_logprobs != "rollout":
            raise ValueError(f"rollout.top_p {self.rollout.top_p} needs learner.old_logprobs 'rollout': with "
                             "'recompute' the learner's pi_old is the full softmax, not vLLM's renormalised nucleus")
        if self.rollout.correction == "tis" and self.learner.old_logprobs == "rollout":
            raise ValueError("rollout.tis_cap weights the loss by pi_old / pi_rollout: it needs learner.old_logprobs "
                             "'recompute' (with 'rollout' the ratio is already to vLLM's log-probs)")
        if self.rollout.checks_mismatch and self.learner.old_logprobs == "rollout":
            raise ValueError(f"rollout.correction '{self.rollout.correction}' (or rejection, or its metrics) compares "
                             "the learner's pi_prox with vLLM's log-probs: it needs learner.old_logprobs 'recompute', "
                             "which computes pi_prox ('rollout' skips it)")
        if self.learner.loss_mask == "assistant_segments":
            if not self.task.agentic:
                raise ValueError("learner.loss_mask 'assistant_segments' is for agentic tasks (frozen_lake, sokoban); "
                                 f"task '{self.task.name}' trains its one completion: use 'sampled'")
            if self.learner.old_logprobs == "rollout" or self.rollout.tis_cap is not None:
                raise ValueError("learner.loss_mask 'assistant_segments' trains tokens vLLM never sampled (no "
                                 "rollout log-probs): it needs learner.old_logprobs 'recompute' and no "
                                 "rollout.tis_cap")
            if self.rollout.checks_mismatch:
                raise ValueError("learner.loss_mask 'assistant_segments' trains tokens vLLM never sampled (no "
                                 f"rollout log-probs): rollout.correction '{self.rollout.correction}' (rejection, "
                                 "its metrics) needs them on every trained token: use correction 'none'")
        if any(getattr(t, "training_context", "sampled") == "ragen" for t in members(self.task)) \
                and self.learner.old_logprobs == "rollout":
            raise ValueError("task.training_context 'ragen' trains in a context other than the one vLLM sampled "
                             "from: it needs learner.old_logprobs 'recompute'")
        if self.interventions.probability_floor.is_active and self.rollout.top_p != 1.0:
            raise ValueError("interventions.probability_floor needs rollout.top_p = 1 (the learner cannot "
                             "reproduce a top-p truncated, floored distribution)")
        return self

    @model_validator(mode="after")
    def _mix_groups(self) -> TrialConfig:
        """A mix's batch is its members' groups: rollout.prompts_per_step is their sum (a different one set by
        the user is refused)."""
        if not isinstance(self.task, MixConfig):
            return self
        ro, total = self.rollout, self.task.groups
        if "prompts_per_step" in ro.model_fields_set and ro.prompts_per_step != total:
            _refuse(("rollout", "prompts_per_step"), ro.prompts_per_step,
                    f"{ro.prompts_per_step} conflicts with task.mix, whose groups add up to {total}: leave "
                    "prompts_per_step out (a mix sets it)")
        ro.prompts_per_step = total
        if ro.fill is not None and ro.fill.groups > total * ro.fill.max_rounds:
            _refuse(("rollout", "fill", "groups"), ro.fill.groups,
                    f"{ro.fill.groups} can never be reached: task.mix samples {total} groups a round, "
                    f"{total * ro.fill.max_rounds} in fill.max_rounds rounds")
        if ro.fill is not None and ro.fill.groups != total:
            _refuse(("rollout", "fill", "groups"), ro.fill.groups,
                    f"{ro.fill.groups} differs from task.mix's groups ({total}): a mix refills each member to its "
                    f"own groups, so fill.groups must be their sum, {total}")
        if self.interventions.probability_floor.is_active:
            _refuse(("interventions", "probability_floor"), None,
                    "needs one action set per trial: not available with task.mix")
        return self

    def _scoring_pass_needs(self) -> str | None:
        """What reads the learner's no-grad scoring pass (None: nothing, `old_logprobs: rollout` may skip it)."""
        if self.rollout.mode == "one_step_off":
            return "rollout.mode one_step_off (pi_old of the importance weight)"
        return scoring_pass_needs(self.credit, self.interventions)


def sepa_settings(cfg: TrialConfig) -> SepaConfig:
    """The schedule that drives lambda: the trial's `sepa:` where SEPA (or a plugin transform) runs, else off,
    so conditions without SEPA log lambda 0 even when a shared base carries SEPA settings."""
    c = cfg.credit
    uses = "sepa" in c.stages or (isinstance(c.transform_mode, str) and "." in c.transform_mode)
    return c.sepa if (c.sepa is not None and uses) else SepaConfig(steps=0)
