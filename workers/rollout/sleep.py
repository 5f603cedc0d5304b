"""Whether a rollout engine is asleep (colocated trials: its GPU memory handed to the learner beside it), kept by
the worker itself so that sampling or loading a policy into a sleeping engine fails loudly instead of reading
freed memory (vLLM issues 16564, 29341: a level-2 engine woken without new weights samples garbage).

Waking is in two parts, vLLM's wake tags: the weights first (a policy can then be loaded), the KV cache after the
weight sync (sampling needs both), so the sync's transfer buffers and the KV cache never hold memory at once."""

from __future__ import annotations

from dataclasses import dataclass, field

PARTS = ("weights", "kv_cache")  # vLLM's wake_up tags, in the order a colocated step wakes them


@dataclass
class SleepState:
    """`real`: vLLM's sleep mode is on (a GPU engine built with enable_sleep_mode); False on CPU, where sleep and
    wake only change this record. `level`: 0 awake, 1 or 2 asleep (until every part is awake). `asleep`: the
    parts still asleep. `log`: every transition in order: ("sleep", level), ("wake", part)."""

    real: bool = False
    level: int = 0
    asleep: list[str] = field(default_factory=list)
    log: list[tuple[str, int | str]] = field(default_factory=list)

    def enter(self, level: int) -> None:
        if level not in (1, 2):
            raise ValueError(f"sleep level must be 1 (keep the weights in host memory) or 2 (drop them), got {level}")
        if self.level:
            raise RuntimeError(f"the engine is already asleep (level {self.level}, asleep: {', '.join(self.asleep)})")
        self.level, self.asleep = level, list(PARTS)
        self.log.append(("sleep", level))

    def waking(self, parts: list[str] | None = None) -> list[str]:
        """The parts a wake of `parts` (None: every part still asleep) wakes, each of which must be asleep.
        Records nothing: the caller wakes the engine, then `leave`s."""
        parts = list(self.asleep) if parts is None else list(parts)
        unknown = [p for p in parts if p not in PARTS]
        if unknown:
            raise ValueError(f"wake_up parts must be among {PARTS}, got {unknown}")
        if not parts or any(p not in self.asleep for p in parts):
            raise RuntimeError(f"wake_up({', '.join(parts) or 'all'}) on an engine whose parts are awake "
                               f"(asleep: {', '.join(self.asleep) or 'none'})")
        return parts

    def leave(self, parts: list[str] | None = None) -> None:
        """Record `parts` (None: every part still asleep) awake; each must be asleep (`waking`)."""
        for p in self.waking(parts):
            self.asleep.remove(p)
            self.log.append(("wake", p))
        if not self.asleep:
            self.level = 0

    def check_awake(self, what: str, needs: tuple[str, ...] = PARTS) -> None:
        """Raise unless every part in `needs` is awake (a policy load needs the weights, sampling everything)."""
        missing = [p for p in needs if p in self.asleep]
        if missing:
            raise RuntimeError(f"{what} on a sleeping engine (level {self.level}, asleep: {', '.join(missing)}): "
                               "wake_up first")
