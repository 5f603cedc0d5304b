"""The contract of a multi-turn environment plugin (`task: {name: my_envs.maze:Maze, ...}`) and the adapter that
lets the turn protocols (workers/envs/protocol.py) and `TextEpisode` play it like a built-in grid env.

A plugin subclasses `TextEnv`: a nested pydantic `Config` (its `task:` keys), `actions` (the action names the
model writes inside `<answer>...</answer>`, matched case-insensitively, never evaluated), `instruction` (the
rules, shown once), `legend` (optional: what the state's symbols mean, shown after the rules), `reset(seed)` (the episode's own randomness; the level comes from `level_seed` at
construction), `state_text()` (what the model reads each turn), `step(action)` -> (reward, done) and `solved`.
`solve(config, level_seed)` (optional) returns the fewest actions that solve a level, for difficulty tables.
"""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from typing import Any, ClassVar

from pydantic import BaseModel


class PluginError(ValueError):
    """A plugin that cannot be used as a task: one line saying why."""


def load_class(path: str) -> type:
    """Import `module:Class`; any failure is a PluginError."""
    module_name, _, attr = path.partition(":")
    if not module_name or not attr:
        raise PluginError(f"{path!r} is not a plugin path like 'package.module:Class'")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # noqa: BLE001 - any import-time failure is the plugin's, reported in one line
        first = str(exc).splitlines()[0] if str(exc) else ""
        raise PluginError(f"cannot import module {module_name!r} ({type(exc).__name__}: {first})") from None
    cls = module
    for part in attr.split("."):
        cls = getattr(cls, part, None)
        if cls is None:
            raise PluginError(f"module {module_name!r} has no class {attr!r}")
    if not isinstance(cls, type):
        raise PluginError(f"{path!r} is not a class")
    return cls


class TextEnv(ABC):
    """A multi-turn text environment: one level per `level_seed`, played one parsed action at a time."""

    Config: ClassVar[type[BaseModel]]
    actions: tuple[str, ...] = ()
    instruction: str = ""
    legend: str = ""  # optional; the ragen protocol's system message shows it under "The meaning of each symbol"

    def __init__(self, config: Any, level_seed: int):
        self.config, self.level_seed = config, int(level_seed)

    @abstractmethod
    def reset(self, seed: int) -> None:
        """Start the episode; `seed` fixes the env's own randomness (shared by a group under dynamics shared)."""

    @abstractmethod
    def state_text(self) -> str:
        """The state as the model reads it this turn."""

    @abstractmethod
    def step(self, action: int) -> tuple[float, bool]:
        """Apply `actions[action]`; returns (reward, done)."""

    @property
    def solved(self) -> bool:
        """Whether the episode ended in success (the trial's success rate)."""
        return False

    @classmethod
    def solve(cls, config: Any, level_seed: int) -> int | None:
        """Fewest actions that solve the level (None: unknown / unsolvable); optional."""
        return None


class PluginEnv:
    """A `TextEnv` with the face `TextEpisode` and the turn protocols use (gymnasium-style `step`, action ids)."""

    def __init__(self, env: TextEnv):
        self.env = env
        self.action_names = tuple(env.actions)
        self.action_ids = tuple(range(len(self.action_names)))
        self.instruction_actions = self.action_names

    @property
    def instruction(self) -> str:
        return self.env.instruction

    @property
    def rules(self) -> str:
        return self.env.instruction

    @property
    def legend(self) -> str:
        return self.env.legend

    def state_text(self) -> str:
        return self.env.state_text()

    def reset(self, seed: int | None = None) -> None:
        self.env.reset(int(seed or 0))

    def step(self, action: int) -> tuple[None, float, bool, bool, dict]:
        reward, done = self.env.step(int(action))
        return None, float(reward), bool(done), False, {}

    @property
    def solved(self) -> bool:
        return bool(self.env.solved)
