"""Whether a rollout engine is asleep (colocated trials: its GPU memory handed to the learner beside it), kept by
the worker itself so that sampling or loading a policy into a sleeping engine fails loudly instead of reading
freed memory (vLLM issues 16564, 29341: a level-2 engine woken without new weights samples garbage)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class SleepState:
    """`real`: vLLM's sleep mode is on (a GPU engine built with enable_sleep_mode); False on CPU, where sleep and
    wake only change this record. `level`: 0 awake, 1 or 2 asleep. `log`: every transition in order."""

    real: bool = False
    level: int = 0
    log: list[tuple[str, int]] = field(default_factory=list)

    def enter(self, level: int) -> None:
        if level not in (1, 2):
            raise ValueError(f"sleep level must be 1 (keep the weights in host memory) or 2 (drop them), got {level}")
        if self.level:
            raise RuntimeError(f"the engine is already asleep (level {self.level})")
        self.level = level
        self.log.append(("sleep", level))

    def leave(self) -> None:
        if not self.level:
            raise RuntimeError("wake_up on an engine that is awake")
        self.level = 0
        self.log.append(("wake", 0))

    def check_awake(self, what: str) -> None:
        if self.level:
            raise RuntimeError(f"{what} on a sleeping engine (level {self.level}): wake_up first")
