"""Tasks: problem sources with binary rewards and a resumable, seeded data cursor (see base.Task)."""

from __future__ import annotations

from .arithmetic import ArithmeticMCTask, ArithmeticTask
from .base import Problem, ScoreResult, Task
from .config import TaskBase, TaskConfig, task_config


def make_task(config: TaskBase, seed: int):
    """Build the task named by `config.name`; `seed` (the trial seed) fixes the training order.

    Agentic tasks return a `workers.envs.EnvTask` (level seeds, not problems); a mix (workers/tasks/mix.py) its
    members' tasks, each seeded by `member_seed(seed, i)`."""
    from .mix import MixConfig

    if isinstance(config, MixConfig):
        from .mix import MixedTask, member_seed

        return MixedTask(config, [make_task(m.task, member_seed(seed, i)) for i, m in enumerate(config.mix)])
    if config.agentic:
        from workers.envs import EnvTask

        return EnvTask(config, seed)
    if ":" in config.name:  # a single-turn plugin: its class gets its own validated Config
        from workers.envs.plugin import load_class

        return load_class(config.name)(config.config, seed)
    if config.name == "arithmetic":
        return ArithmeticTask(config, seed)
    if config.name == "arithmetic_mc":
        return ArithmeticMCTask(config, seed)
    if config.name == "chain":
        from .chain import ChainTask

        return ChainTask(config, seed)
    if config.name == "dataset":
        from .dataset import DatasetTask

        return DatasetTask(config, seed)
    if config.name == "math":
        from .math import MathTask  # imports math_verify/sympy only when needed

        return MathTask(config, seed)
    raise ValueError(f"unknown task {config.name!r}")


__all__ = ["ArithmeticMCTask", "ArithmeticTask", "Problem", "ScoreResult", "Task", "TaskBase", "TaskConfig", "make_task",
           "task_config"]
