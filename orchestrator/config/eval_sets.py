"""`eval.sets`: named held-out sets evaluated beside the trial's own (issue 31), each logged under its own name.

A set is the trial's own task's held-out problems (no `task`: e.g. more problems than `eval.problems`), a
dataset file (`task: {name: dataset, path: ..., heldout_path: ...}`, workers/tasks/dataset.py) or a task
plugin by dotted path (`task: {name: my.mod:Countdown, ...}`, workers/tasks/plugins.py): any `task:` table, the
same union and the same errors as the trial's `task:`. In training its metrics are `eval/<set>/pass@1`, ... at
every held-out evaluation (orchestrator/trial/collect/eval_sets.py); `python -m orchestrator eval` evaluates checkpoints
on them afterwards (orchestrator/evaluate/offline.py).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator

from workers.tasks.config import TaskConfig

DEFAULT_SET = "default"  # the trial's own held-out set, as the `eval` command and its CSV name it
SET_NAME = r"^[A-Za-z][A-Za-z0-9_-]{0,63}$"


class EvalSetConfig(BaseModel):
    """One named held-out set."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=SET_NAME, description=(
        "the set's name in metrics (`eval/<name>/pass@1`) and files (`eval/<name>.csv`); not 'default'"))
    task: TaskConfig | None = Field(None, description=(
        "the set's problems: a `task:` table (a dataset file, a plugin, a built-in task), its held-out problems "
        "evaluated; None: the trial's own task"))
    problems: int | None = Field(None, ge=1, description="held-out problems evaluated; None: eval.problems")

    @field_validator("name")
    @classmethod
    def _not_default(cls, v: str) -> str:
        if v == DEFAULT_SET:
            raise ValueError(f"'{DEFAULT_SET}' names the trial's own held-out set (eval/pass@1); pick another name")
        return v


def check_unique(sets: list[EvalSetConfig]) -> list[EvalSetConfig]:
    """Set names are unique (each is a metric prefix and a file name)."""
    seen: set[str] = set()
    for s in sets:
        if s.name in seen:
            raise ValueError(f"set name {s.name!r} appears twice; each set needs its own name")
        seen.add(s.name)
    return sets


def label_clash(sets: list[EvalSetConfig], task_labels: list[str]) -> str | None:
    """Why a set cannot have its name: a mix member's label (both would log `eval/<name>/pass@1`), or None. (A
    dataset's `data_source` labels are read with its file: orchestrator/config/task_check.py.)"""
    for s in sets:
        if s.name in task_labels:
            return (f"set {s.name!r} has the label of a mix member (eval/{s.name}/pass@1 is the member's); a set's "
                    f"name must not be one of: {', '.join(task_labels)}")
    return None


def agentic_mismatch(sets: list[EvalSetConfig], trial_agentic: bool) -> str | None:
    """Why a multi-turn set cannot run in a single-turn trial (its engines' context is sized for one turn), or
    None."""
    for s in sets:
        if s.task is not None and s.task.agentic and not trial_agentic:
            return (f"set {s.name!r} is a multi-turn environment ({s.task.name}) but the trial's task is "
                    "single-turn: its engines' context (model.max_model_len) is sized for one turn")
    return None

