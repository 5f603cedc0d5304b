"""The self-contained sections of a trial's config (`TrialConfig`, orchestrator/config/trial.py): `eval:`,
`checkpoint:`, `resources:`, `timeouts:`, `wandb:`, `plugins:` and `logging:`. Each validates alone; the checks
across sections live on `TrialConfig`. YAML keys == field names; `extra="forbid"` everywhere.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from orchestrator.config.eval_sets import EvalSetConfig, check_unique


class StrictConfig(BaseModel):
    """A config section whose unknown keys are errors (every section here and in trial.py)."""

    model_config = ConfigDict(extra="forbid")


class EvalConfig(StrictConfig):
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


class CheckpointSettings(StrictConfig):
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


class SupervisorConfig(StrictConfig):
    """How the campaign driver watches a shared pool's actors (orchestrator/pool/supervisor.py): an actor that
    misses a deadline is killed, and Ray restarts it (an engine's trials then redo their requests on it)."""

    every_s: float = Field(10.0, gt=0.0, description="seconds between two probes of each pool actor")
    answer_s: float = Field(30.0, gt=0.0, description=(
        "seconds an actor has to answer a probe (on its control thread, not behind generate or train): a stopped "
        "or frozen process does not"))
    engine_stall_s: float = Field(120.0, gt=0.0, description=(
        "seconds an engine may go without finishing an engine step or call while it has requests in flight"))
    learner_call_s: float = Field(3600.0, gt=0.0, description=(
        "seconds one call of the learner (a slot's train step, export, checkpoint, restore) may run; raise it for "
        "steps longer than an hour"))


class SharedBaseConfig(StrictConfig):
    """One pool per base model of the campaign (orchestrator/pool/): the rollout engines (vLLM multi-LoRA) and the
    learners each hold the base model once; every trial is an adapter in a slot of its own, trained on one learner
    (slot mod learners) and sampled on `rollout.num_workers` of the engines (orchestrator/config/pool_key.py:
    slot_learner, slot_engines). LoRA trials only, one learner rank."""

    slots: int = Field(ge=1, description=(
        "trials a pool serves at once (each its adapter, optimizer and RNG in a slot); Tune runs at most this many "
        "trials of a pool at once, the rest queue; a campaign sweeping base models gets a pool per model"))
    learners: int = Field(1, ge=1, description=(
        "learner processes of the pool (one GPU each), each holding the base once and a share of the slots "
        "(their adapters, optimizers, RNG): slot s trains on learner s mod learners"))
    engines: int | None = Field(None, ge=1, description=(
        "rollout engines of the pool, each serving every slot's adapter; None: rollout.num_workers, as a "
        "separate trial of the campaign would start"))
    shape: Literal["auto"] | None = Field(None, description=(
        "auto: `run` takes the shape `plan` picks for the cluster at hand (learners, engines and at most `slots` "
        "slots: the shortest makespan among the shapes within 10% of the lowest GPU-hours; "
        "orchestrator/preflight/shape_choice.py), a resumed campaign the shape it started with; None: as written"))
    supervisor: SupervisorConfig = Field(default_factory=SupervisorConfig, description=(
        "deadlines under which the campaign driver probes the pool's engines and learner"))
    batch_invariant: bool = Field(False, description=(
        "vLLM's batch-invariant kernels on the pool's engines (VLLM_BATCH_INVARIANT=1 in each engine's "
        "environment), so a slot's samples do not depend on which other slots' requests share its batch; CUDA "
        "GPUs of the H100/H200 class (compute capability 9.0+) only: refused before launch with worker_gpus 0 "
        "(on CPU the engines already give each slot what a separate engine would, bit for bit) and with an "
        "accelerator_type known to be older. Off on GPU: the report's step-0 check accepts a stated tolerance "
        "(orchestrator/report/sections/trajectories.py)"))


class ResourcesConfig(StrictConfig):
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
    scratch_dir: str | None = Field(None, description=(
        "node-local folder under which each trial keeps its temporary files (its engines' file store and sockets, "
        "policy files, checkpoint staging), removed when the trial ends or fails (workers/sync/scratch.py); "
        "None: each node's temp dir ($TMPDIR or /tmp)"))
    shared_base: SharedBaseConfig | None = Field(None, description=(
        "run every trial of a LoRA campaign as an adapter on one shared pool of engines and learner "
        "(orchestrator/pool/); None: each trial starts its own engines and learner"))

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


class TimeoutsConfig(StrictConfig):
    """Deadlines of the trial loop's actor calls (orchestrator/trial/actors/calls.py). A phase without a fixed value
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


class WandbConfig(StrictConfig):
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


class PluginsConfig(StrictConfig):
    paths: list[str] = Field(default_factory=list, description=(
        "directories put first on the Python path of every process of the trial, where `task: {name: "
        "module:Class}` plugins are imported from (a campaign sets them, absolute, from its own plugins.paths)"))


class SamplesSettings(StrictConfig):
    """Sampled text kept for reading (orchestrator/trial/artifacts/samples.py): `trials/<trial>/samples/step_<s>.jsonl.gz`
    (training groups) and `eval_step_<s>.jsonl.gz` (every held-out evaluation's generations)."""

    every: int = Field(1, ge=0, description="write training samples every this many steps; 0 = never (held-out "
                       "evaluations are still written)")
    per_step: int = Field(2, ge=0, description="training groups written per step (the first ones of the batch)")
    eval: bool = Field(True, description="write every held-out evaluation's generations")
    max_mb: float = Field(100.0, gt=0.0, description=(
        "cap on one trial's samples/ folder (and on its eval/ folder, the `eval` command's generations): a file "
        "that would take it past the cap is not written (the first one skipped is said in the trial's "
        "events.jsonl, `samples_capped`); earlier files are kept"))


class LoggingConfig(StrictConfig):
    samples: SamplesSettings = SamplesSettings()
    batches: bool = Field(False, description=(
        "save every step's training batch (all sampled groups: token ids, loss masks, rollout log-probs, rewards; "
        "orchestrator/trial/artifacts/batches.py) as trials/<trial>/batches/step_<s>.npz, which `trial --replay` trains on"))
