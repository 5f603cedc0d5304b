"""Mixed tasks: `task: {mix: [{task: {...}, groups: 4}, {task: {...}, groups: 2, label: b}]}`.

Every step's batch holds `groups` groups of each member, in the listed order (RAGEN's `env_configs.tags` /
`n_groups`). A member is any task config, built-in or plugin, single-turn or multi-turn; its `label` (default:
the task's name, a plugin's class name) names its metrics (`train/<label>/correct_rate`, ...). Each member
draws from its own task, seeded by `member_seed(seed, index)`, so its problems and its sampling seeds are a pure
function of (trial seed, step, member) and a resumed trial replays them. `MixedTask` is what `make_task` builds:
the members' tasks, checkpointed together. This module is torch-free (the trial config embeds `MixConfig`).
"""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, PlainValidator, SerializeAsAny, ValidationError
from pydantic_core import PydanticCustomError

from workers.tasks.config import TaskBase, TaskConfig, parse_task, unknown_key_errors

LABEL = re.compile(r"^[A-Za-z0-9_.-]+$")  # one metric path segment


class MixMember(BaseModel):
    """One task of a mix and how many groups of it every step's batch holds."""

    model_config = ConfigDict(extra="forbid")

    task: TaskConfig
    groups: int = Field(ge=1, description="groups of this task in every step's batch")
    label: str | None = Field(None, description="its metrics' name (train/<label>/...); default: the task's")


class MixConfig(TaskBase):
    """`task: {mix: [...]}`. `agentic` when some member is (the trial then gets an agentic context length);
    `rollout.prompts_per_step` is the sum of the members' groups."""

    name: str = "mix"
    mix: list[MixMember]

    @property
    def agentic(self) -> bool:  # type: ignore[override]
        return any(m.task.agentic for m in self.mix)

    @property
    def groups(self) -> int:
        return sum(m.groups for m in self.mix)

    @property
    def labels(self) -> list[str]:
        return [m.label or m.task.label for m in self.mix]


def members(task: TaskBase) -> list[TaskBase]:
    """The task configs a trial of `task` plays: the members of a mix, else `task` itself."""
    return [m.task for m in task.mix] if isinstance(task, MixConfig) else [task]


def member_seed(seed: int, index: int) -> int:
    """Member `index`'s seed in a trial of seed `seed` (its task order and its sampling seeds)."""
    return (seed * 1_000_033 + (index + 1) * 7_919_113) % (2**31 - 1)


def _error(kind: str, msg: str, loc: tuple, value: Any) -> dict:
    return {"type": PydanticCustomError(kind, msg), "loc": loc,
            "input": value}


def _fail(errors: list[dict]) -> None:
    raise ValidationError.from_exception_data("task", errors)


def parse_mix(value: dict) -> MixConfig:
    """`value` ({mix: [...]}, name optional and 'mix') as a MixConfig; errors located as `mix[i].task.<key>`."""
    if isinstance(value, MixConfig):
        return value
    extra = [k for k in value if k not in ("name", "mix")]
    if extra:
        _fail([_error("unknown_key", "unknown key beside mix; a mixed task has: mix (its members hold the tasks)",
                      (extra[0],), value[extra[0]])])
    if value.get("name", "mix") != "mix":
        _fail([_error("mix_name", "a mixed task has no name of its own: put each task under mix[i].task",
                      ("name",), value.get("name"))])
    raw = value["mix"]
    if not isinstance(raw, list) or not raw:
        _fail([_error("mix_empty", "must list at least one member {task: {...}, groups: N}", ("mix",), raw)])
    built: list[MixMember] = []
    for i, member in enumerate(raw):
        where = f"mix[{i}]"
        if not isinstance(member, dict):
            _fail([_error("mix_member", "must be a table {task: {...}, groups: N}", (where,), member)])
        task = member.get("task")
        if isinstance(task, dict) and "mix" in task:
            _fail([_error("mix_nested", "a mix member cannot be a mix", (where, "task", "mix"), task)])
        try:
            built.append(MixMember.model_validate(member))
        except ValidationError as err:
            errors = unknown_key_errors(err, MixMember, "a mix member")
            for e in errors:
                e["loc"] = (where, *e["loc"])
            _fail(errors)
    labels = [m.label or m.task.label for m in built]
    for i, (m, label) in enumerate(zip(built, labels, strict=True)):
        if not LABEL.match(label):
            _fail([_error("mix_label", f"{label!r} must be letters, digits, '_', '.' or '-' (a metric name part)",
                          (f"mix[{i}]", "label"), label)])
        if label in labels[:i]:
            _fail([_error("mix_label", f"label {label!r} repeats mix[{labels.index(label)}]'s: give each member "
                          "its own label", (f"mix[{i}]", "label"), m.label)])
    return MixConfig(mix=built)


def parse_trial_task(value: Any) -> TaskBase:
    """A trial's `task:`: a mix when it has `mix`, else one task (workers/tasks/config.py: parse_task)."""
    if isinstance(value, MixConfig) or (isinstance(value, dict) and "mix" in value):
        return parse_mix(value)
    return parse_task(value)


TrialTaskConfig = Annotated[SerializeAsAny[TaskBase], PlainValidator(parse_trial_task)]


class MixedTask:
    """The members' tasks side by side (built by `workers.tasks.make_task`); the checkpointed state is each
    member's. `action_tokens` is None: the probability floor is refused for mixes (one action set per trial)."""

    action_tokens = None

    def __init__(self, config: MixConfig, tasks: list):
        self.config, self.tasks = config, tasks
        self.labels = config.labels

    def state_dict(self) -> dict[str, Any]:
        return {"members": [t.state_dict() for t in self.tasks]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for t, s in zip(self.tasks, state["members"], strict=True):
            t.load_state_dict(s)

    def close(self) -> None:
        for t in self.tasks:
            t.close()


__all__ = ["MixConfig", "MixMember", "MixedTask", "TrialTaskConfig", "member_seed", "members", "parse_mix",
           "parse_trial_task"]
