"""Typed configuration of the task (problem source + reward function): one pydantic class per task.

`task:` in a trial is a union chosen by `name`: a built-in name picks its class (`TASK_CLASSES`), a dotted path
`module:Class` names a plugin (workers/tasks/plugins.py) whose own `Config` class validates the other keys. Each
class forbids keys it does not have, so `task: {name: chain, dataset: x}` is an error that lists chain's keys.
Embedded in the trial config like `CreditConfig`: field names equal YAML keys.
"""

from __future__ import annotations

import difflib
from typing import Annotated, Any, ClassVar, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PlainValidator,
    SerializeAsAny,
    ValidationError,
    field_validator,
    model_serializer,
    model_validator,
)
from pydantic_core import PydanticCustomError


class TaskBase(BaseModel):
    """What every task config has: its `name`. `agentic`: played against an environment (workers/envs) over
    several turns, not prompt -> one completion."""

    model_config = ConfigDict(extra="forbid")

    name: str
    agentic: ClassVar[bool] = False

    @property
    def label(self) -> str:
        """The task's short name in metrics and messages (a plugin's class name)."""
        return self.name


class _HeldOut(TaskBase):
    heldout_fraction: float = Field(0.2, ge=0.0, lt=1.0, description="share of problems never trained on")


class ArithmeticConfig(_HeldOut):
    """`a op b =` problems over every operand pair; reward: the first integer of the completion is right."""

    name: Literal["arithmetic"] = "arithmetic"
    max_operand: int = Field(4, ge=1, description="operands are drawn from 0..max_operand")
    ops: list[Literal["+", "-", "*"]] = Field(default_factory=lambda: ["+"], min_length=1)

    @field_validator("ops")
    @classmethod
    def _unique_ops(cls, ops: list[str]) -> list[str]:
        if len(set(ops)) != len(ops):
            raise ValueError(f"ops must not repeat: {ops}")
        return ops


class ArithmeticMCConfig(ArithmeticConfig):
    """The multiple-choice form of `arithmetic` (same problem set): the prompt lists labelled options and the
    first completion token is the chosen label (its action position)."""

    name: Literal["arithmetic_mc"] = "arithmetic_mc"  # type: ignore[assignment]
    num_choices: int = Field(4, ge=2, le=4, description="options per question, labelled A, B, C, D in order")


class ChainConfig(_HeldOut):
    """Chained arithmetic with step-by-step solutions (the tiny-reasoner's task)."""

    name: Literal["chain"] = "chain"
    chain_steps: int = Field(3, ge=1, le=8, description="operations per problem")
    chain_max_value: int = Field(19, ge=9, le=99, description="running values stay in 0..chain_max_value")
    chain_problems: int = Field(4000, ge=2, description="distinct problems drawn (held out by id hash)")


class MathConfig(_HeldOut):
    """Word problems from a JSONL file or a Hugging Face dataset, graded by math-verify."""

    name: Literal["math"] = "math"
    dataset: str = Field(description="local .jsonl path, or a Hugging Face dataset name")
    split: str = "train"
    eval_split: str | None = Field(None, description="HF split for held-out eval; None: hold out a fraction")
    problem_field: str = "problem"
    answer_field: str = "answer"
    prompt_template: str = "{problem}\nPut the final answer in \\boxed{{}}."
    answer_fallback: Literal["last_number", "none"] = "last_number"
    grader_timeout_s: float = Field(5.0, gt=0.0)

    @field_validator("prompt_template")
    @classmethod
    def _template_formats(cls, template: str) -> str:
        return check_template(template)


def check_template(template: str) -> str:
    """A prompt template must contain `{problem}` and format with only that name."""
    if "{problem}" not in template:
        raise ValueError("prompt_template must contain '{problem}'")
    try:
        template.format(problem="x")
    except (KeyError, IndexError, ValueError) as e:
        raise ValueError(f"prompt_template does not format with only 'problem': {e!r}") from e
    return template


class DatasetConfig(_HeldOut):
    """Problems from a dataset file (workers/tasks/dataset.py); defaults read verl's parquet schema as it is."""

    name: Literal["dataset"] = "dataset"
    path: str = Field(description="a .jsonl or .parquet file, or a datasets.save_to_disk directory")
    format: Literal["jsonl", "parquet", "hf_disk"] | None = Field(None, description="None: from the path")
    split: str = Field("train", description="hf_disk: the split of a saved DatasetDict")
    prompt_field: str = Field("prompt", description="dotted path; text, or chat messages [system?, user]")
    answer_field: str = Field("reward_model.ground_truth", description="dotted path of the reference answer")
    source_field: str = Field("data_source", description="dotted path of the per-source metric label (optional)")
    prompt_template: str = Field("{problem}", description="applied to a text prompt")
    grader: str = Field("math", description="math | exact | regex | a plugin 'module:function(completion, answer)'")
    answer_pattern: str = Field(r"\\boxed\{([^{}]*)\}", description="regex grader: its first group is the answer")
    answer_fallback: Literal["last_number", "none"] = "last_number"
    grader_timeout_s: float = Field(5.0, gt=0.0)
    heldout_path: str | None = Field(None, description="held-out problems from this file; None: a seeded fraction")
    heldout_seed: int = Field(0, description="the held-out fraction's permutation seed")

    @field_validator("prompt_template")
    @classmethod
    def _template_formats(cls, template: str) -> str:
        return check_template(template)

    @field_validator("grader")
    @classmethod
    def _grader(cls, v: str) -> str:
        if v not in ("math", "exact", "regex") and ":" not in v:
            raise ValueError(f"grader must be math, exact, regex or 'module:function', got {v!r}")
        return v

    @field_validator("answer_pattern")
    @classmethod
    def _pattern(cls, v: str) -> str:
        import re

        try:
            re.compile(v)
        except re.error as e:
            raise ValueError(f"answer_pattern is not a regular expression ({e})") from None
        return v


class _GridConfig(TaskBase):
    """Agentic, multi-turn grid tasks (workers/envs)."""

    agentic: ClassVar[bool] = True
    size: int | None = Field(None, ge=4, le=12, description="grid side; default 4 (frozen_lake), 6 (sokoban)")
    protocol: Literal["ragen", "plain"] = Field("ragen", description=(
        "turn protocol (workers/envs/protocol.py). ragen: system message, coordinates, <think> prefill, strict "
        "parse, format penalty added to the return at the end; plain: no system message, lenient parse, the "
        "penalty shown in each turn's Reward line"))
    dynamics: Literal["shared", "independent"] = Field("shared", description=(
        "env randomness (FrozenLake slips) of a group. shared: every member plays the level's own random stream "
        "(RAGEN's: a fixed plan gives the same outcome across the group); independent: one stream per member"))
    fixed_level: int | None = Field(None, ge=0, description=(
        "play this one level seed in training and validation (e.g. a fixed FrozenLake map); None: a new level "
        "per group"))
    training_context: Literal["sampled", "ragen"] = Field("sampled", description=(
        "the context each agentic turn is trained in. sampled: exactly the ids the turn was sampled from; ragen: "
        "RAGEN's rebuilt training sequence, which drops the 'No valid action provided previously' warning from "
        "the user turn after a turn with no valid action (it is still shown at generation); needs protocol ragen "
        "and learner.old_logprobs 'recompute' (vLLM's log-probs are of another context)"))

    @model_validator(mode="after")
    def _ragen_context_needs_ragen_protocol(self):
        if self.training_context == "ragen" and self.protocol != "ragen":
            raise ValueError("training_context 'ragen' is RAGEN's rebuilt training sequence: it needs protocol "
                             f"'ragen', got {self.protocol!r}")
        return self


class FrozenLakeConfig(_GridConfig):
    name: Literal["frozen_lake"] = "frozen_lake"
    levels: Literal["ragen", "gymnasium"] = Field("ragen", description=(
        "level generator: ragen (random start and goal, always solvable) or gymnasium (generate_random_map's "
        "corner maps)"))
    frozen_prob: float = Field(0.9, gt=0.0, le=1.0, description="probability a tile is ice")
    success_rate: float = Field(1.0, gt=0.0, le=1.0,
                                description="chance a move goes where intended (1 = not slippery)")


class SokobanConfig(_GridConfig):
    name: Literal["sokoban"] = "sokoban"
    levels: str = Field("ragen", description="level generator: ragen only (gym-sokoban's reverse-play search)")
    boxes: int = Field(1, ge=1, le=3, description="boxes (and targets) per level")
    max_env_steps: int = Field(100, ge=1, description="env steps before truncation")

    @field_validator("levels")
    @classmethod
    def _ragen_only(cls, v: str) -> str:
        if v != "ragen":
            raise ValueError(f"levels {v!r} is for frozen_lake; sokoban has levels 'ragen' only")
        return v


class PluginTaskConfig(TaskBase):
    """A task or environment named by dotted path `module:Class`, with its own validated `config` (an instance of
    the class's `Config`). Dumped flat (`{name, **config}`), as the user wrote it."""

    model_config = ConfigDict(extra="forbid", arbitrary_types_allowed=True)

    config: BaseModel
    kind: Literal["task", "env"]

    @property
    def agentic(self) -> bool:  # type: ignore[override]
        return self.kind == "env"

    @property
    def label(self) -> str:
        return self.name.rpartition(":")[2] or self.name

    # an env plugin's turn settings: its Config may declare them, else the built-in grid tasks' defaults
    @property
    def protocol(self) -> str:
        return getattr(self.config, "protocol", "ragen")

    @property
    def dynamics(self) -> str:
        return getattr(self.config, "dynamics", "shared")

    @property
    def fixed_level(self) -> int | None:
        return getattr(self.config, "fixed_level", None)

    @model_serializer(mode="plain")
    def _flat(self) -> dict[str, Any]:
        return {"name": self.name, **self.config.model_dump(mode="json")}


BUILTIN = (ArithmeticConfig, ArithmeticMCConfig, ChainConfig, MathConfig, DatasetConfig, FrozenLakeConfig,
           SokobanConfig)
TASK_CLASSES: dict[str, type[TaskBase]] = {c.model_fields["name"].default: c for c in BUILTIN}


def _custom(kind: str, msg: str, loc: tuple, value: Any) -> dict:
    return {"type": PydanticCustomError(kind, msg), "loc": loc, "input": value}


def _raise(title: str, errors: list[dict]) -> None:
    raise ValidationError.from_exception_data(title, errors)


def unknown_key_errors(err: ValidationError, cls: type[BaseModel], owner: str) -> list[dict]:
    """`err`'s errors with unknown keys first and explained: "did you mean" and the keys `owner` has."""
    allowed = list(cls.model_fields)
    out, rest = [], []
    for e in err.errors():
        if e["type"] == "extra_forbidden" and len(e["loc"]) == 1:
            key = str(e["loc"][0])
            close = difflib.get_close_matches(key, allowed, n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            msg = f"unknown key for {owner}{hint}; {owner} has: {', '.join(allowed)}"
            out.append(_custom("unknown_key", msg, e["loc"], e["input"]))
        else:  # re-raised as rendered: the message stays what pydantic said
            msg = e["msg"].removeprefix("Value error, ")
            rest.append(_custom(e["type"], msg, e["loc"], e.get("input")))
    return out + rest


def parse_task(value: Any) -> TaskBase:
    """The task config of `value` (a dict with `name`, or a config already built); errors are located in it."""
    if isinstance(value, TaskBase):
        return value
    if not isinstance(value, dict):
        _raise("task", [_custom("task_type", "must be a table with a 'name'", (), value)])
    name = value.get("name", "arithmetic")
    if not isinstance(name, str):
        _raise("task", [_custom("task_name", "must be a string", ("name",), name)])
    if ":" in name:
        return plugin_config(name, {k: v for k, v in value.items() if k != "name"})
    cls = TASK_CLASSES.get(name)
    if cls is None:
        close = difflib.get_close_matches(name, list(TASK_CLASSES), n=1)
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        msg = (f"unknown task {name!r}{hint}; built-in: {', '.join(TASK_CLASSES)}, or a plugin "
               "'module:Class' (docs/tasks.md)")
        _raise("task", [_custom("unknown_task", msg, ("name",), name)])
    try:
        return cls.model_validate({**value, "name": name})
    except ValidationError as err:
        _raise("task", unknown_key_errors(err, cls, f"task '{name}'"))
    raise AssertionError("unreachable")


# ------------------------------------------------------------------------------------------- plugins
def plugin_kind(cls: type) -> str:
    """'task' (a Task subclass) or 'env' (a TextEnv subclass); else a PluginError."""
    from workers.envs.plugin import TextEnv
    from workers.tasks.base import Task

    if issubclass(cls, Task):
        return "task"
    if issubclass(cls, TextEnv):
        return "env"
    from workers.envs.plugin import PluginError

    raise PluginError(f"{cls.__module__}.{cls.__qualname__} is neither a workers.tasks.base.Task (single-turn) "
                      "nor a workers.envs.plugin.TextEnv (multi-turn) subclass")


def config_class(cls: type) -> type[BaseModel]:
    from workers.envs.plugin import PluginError

    conf = getattr(cls, "Config", None)
    if not (isinstance(conf, type) and issubclass(conf, BaseModel)):
        raise PluginError(f"{cls.__qualname__} has no Config class (a pydantic BaseModel with its task: keys)")
    return conf


def _fail(msg: str, value: Any) -> None:
    err = {"type": PydanticCustomError("task_plugin", msg),
           "loc": ("name",), "input": value}
    raise ValidationError.from_exception_data("task", [err])


def plugin_config(name: str, fields: dict[str, Any]) -> PluginTaskConfig:
    """The validated config of plugin `name` with the user's other `task:` keys."""
    from workers.envs.plugin import PluginError, load_class  # imports the plugin: only for dotted names

    try:
        cls = load_class(name)
        kind, conf = plugin_kind(cls), config_class(cls)
    except PluginError as exc:
        _fail(str(exc), name)
    owner = f"task '{name}'"
    unknown = [k for k in fields if k not in conf.model_fields]
    try:
        if unknown and conf.model_config.get("extra") != "allow":
            conf.model_validate({k: v for k, v in fields.items() if k not in unknown})  # its own errors first
            raise ValidationError.from_exception_data(
                "task", [{"type": "extra_forbidden", "loc": (k,), "input": fields[k]} for k in unknown])
        config = conf.model_validate(fields)
    except ValidationError as err:
        raise ValidationError.from_exception_data("task", unknown_key_errors(err, conf, owner)) from None
    return PluginTaskConfig(name=name, config=config, kind=kind)


TaskConfig = Annotated[SerializeAsAny[TaskBase], PlainValidator(parse_task)]


def task_config(**fields: Any) -> TaskBase:
    """Build a task config from keyword fields (`name` defaults to 'arithmetic'), as `task:` in YAML would."""
    return parse_task(fields)


class _Check(BaseModel):
    task: TaskConfig


def validate_task(data: dict) -> TaskBase:
    """`data` as the `task:` table; a ValidationError's locations start with 'task'."""
    return _Check.model_validate({"task": data}).task


__all__ = ["ArithmeticConfig", "ArithmeticMCConfig", "ChainConfig", "DatasetConfig", "FrozenLakeConfig", "MathConfig",
           "PluginTaskConfig", "SokobanConfig", "TASK_CLASSES", "TaskBase", "TaskConfig", "check_template",
           "parse_task", "task_config", "validate_task"]
