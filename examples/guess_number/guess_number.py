"""Guess the number as a multi-turn environment plugin: find a secret in low..high from "higher" / "lower" hints.

`task: {name: guess_number:GuessNumber, high: 8}` with this directory on the plugin path. The actions are the
numbers themselves (`<answer>4</answer>`); the level seed fixes the secret. Reward 1 on the turn the secret is
named, then the episode ends.
"""

from __future__ import annotations

import math

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from workers.envs.plugin import TextEnv


class GuessConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    low: int = Field(1, ge=0)
    high: int = Field(8, ge=1, le=100)


class GuessNumber(TextEnv):
    Config = GuessConfig

    def __init__(self, config: GuessConfig, level_seed: int):
        super().__init__(config, level_seed)
        self.actions = tuple(str(n) for n in range(config.low, config.high + 1))
        self.instruction = (f"Guess the secret number between {config.low} and {config.high}. After each guess you "
                            "are told whether the secret is higher or lower. Answer with one number, e.g. "
                            f"<answer>{(config.low + config.high) // 2}</answer>.")
        self.secret = config.low + int(np.random.default_rng(int(level_seed)).integers(len(self.actions)))
        self.history: list[str] = []
        self.found = False

    def reset(self, seed: int) -> None:  # no randomness within an episode
        self.history, self.found = [], False

    def state_text(self) -> str:
        return "Guesses so far: " + (", ".join(self.history) if self.history else "none") + "."

    def step(self, action: int) -> tuple[float, bool]:
        guess = int(self.actions[action])
        self.found = guess == self.secret
        self.history.append(f"{guess} ({'correct' if self.found else 'higher' if self.secret > guess else 'lower'})")
        return (1.0 if self.found else 0.0), self.found

    @property
    def solved(self) -> bool:
        return self.found

    @classmethod
    def solve(cls, config: GuessConfig, level_seed: int) -> int:
        """Binary search's worst case over the range (the secret's own optimum is no smaller on average)."""
        return math.ceil(math.log2(config.high - config.low + 1)) + 1
