"""Task interface shared by the trial loop: problems in, binary rewards out, a resumable data cursor.

A task owns a fixed list of training problems and walks a seeded permutation of it, one epoch at a time
(epoch e uses the permutation seeded by (seed, e)); the cursor (epoch, position) is the whole state.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Problem:
    """One prompt: `prompt` is the text given to the model, `answer` the reference answer as text."""

    id: str
    prompt: str
    answer: str


@dataclass
class ScoreResult:
    """`rewards[i]` is 1.0 / 0.0 for completion i; error counters are for monitoring the grader."""

    rewards: list[float] = field(default_factory=list)
    grader_errors: int = 0
    grader_timeouts: int = 0


def check_lengths(problems: list[Problem], completions: list[str]) -> None:
    """`score` takes one problem per completion (repeat a problem for its group of samples)."""
    if len(problems) != len(completions):
        raise ValueError(f"{len(problems)} problems but {len(completions)} completions")


def held_out_indices(n: int, fraction: float) -> np.ndarray:
    """Seed-independent held-out subset of range(n): sorted indices, about `fraction * n`, at most n - 1."""
    k = min(n - 1, int(round(fraction * n))) if n > 0 else 0
    return np.sort(np.random.default_rng(0).permutation(n)[: max(k, 0)])


class EpochCursor:
    """Walks permutations of range(size): epoch e is `default_rng([seed mod 2**64, e]).permutation(size)`."""

    def __init__(self, size: int, seed: int):
        if size <= 0:
            raise ValueError("a task needs at least one training problem")
        self.size, self.seed = size, int(seed)
        self.epoch, self.position = 0, 0
        self._order = self._permutation(0)

    def _permutation(self, epoch: int) -> np.ndarray:
        return np.random.default_rng([self.seed % 2**64, epoch]).permutation(self.size)

    def take(self, n: int) -> list[int]:
        """The next n indices, crossing epoch boundaries as needed."""
        if n < 0:
            raise ValueError(f"n must be >= 0, got {n}")
        out: list[int] = []
        while len(out) < n:
            if self.position >= self.size:
                self.epoch, self.position = self.epoch + 1, 0
                self._order = self._permutation(self.epoch)
            step = min(n - len(out), self.size - self.position)
            out.extend(int(i) for i in self._order[self.position : self.position + step])
            self.position += step
        return out

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "position": self.position, "size": self.size, "seed": self.seed}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a cursor; state from another problem set or seed, or malformed values, raise ValueError."""
        if not isinstance(state, dict):
            raise ValueError(f"cursor state must be a dict, got {type(state).__name__}")
        vals = {}
        for key in ("epoch", "position", "size", "seed"):
            v = state.get(key)
            if not isinstance(v, int) or isinstance(v, bool):
                raise ValueError(f"cursor state '{key}' must be an int, got {v!r}")
            vals[key] = v
        if vals["size"] != self.size or vals["seed"] != self.seed:
            raise ValueError(
                f"cursor state is for size={vals['size']} seed={vals['seed']}, this task has "
                f"size={self.size} seed={self.seed}"
            )
        if vals["epoch"] < 0 or not 0 <= vals["position"] <= self.size:
            raise ValueError(f"cursor state out of range: epoch={vals['epoch']} position={vals['position']}")
        self.epoch, self.position = vals["epoch"], vals["position"]
        self._order = self._permutation(self.epoch)


class Task(ABC):
    """A problem source with a reward function. Subclasses set `self.train`, `self.held` and `self.cursor`.

    Action position convention: a task whose answer is one choice from a declared set returns that set from
    `action_tokens` (strings, each exactly one token of the policy's tokenizer), and the action is the *first
    completion token*. The sampler restricts and floors that token's distribution over the set
    (`RolloutWorker.generate(action_token_ids=...)`) and the learner recomputes it
    (`workers.probability_floor.floored_token_logprobs` with positions = first completion token). Tasks with
    free-form answers return None.
    """

    name: str = "task"
    train: list[Problem]
    held: list[Problem]
    cursor: EpochCursor

    @property
    def action_tokens(self) -> list[str] | None:
        """The valid first completion tokens (the action set), or None when the task declares none."""
        return None

    def next_batch(self, n: int) -> list[Problem]:
        """The next n training problems in seeded order; advances the cursor."""
        return [self.train[i] for i in self.cursor.take(n)]

    def heldout(self, n: int | None = None) -> list[Problem]:
        """Held-out problems (never returned by next_batch), in a fixed order; the first n when n is given."""
        if n is not None and n < 0:
            raise ValueError(f"n must be >= 0, got {n}")
        return list(self.held if n is None else self.held[:n])

    @abstractmethod
    def score(self, problems: list[Problem], completions: list[str]) -> ScoreResult:
        """Binary reward per (problem, completion) pair; the lists have equal length."""

    def state_dict(self) -> dict[str, Any]:
        """JSON-serialisable data cursor."""
        return {"task": self.name, **self.cursor.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume the data cursor; raises ValueError on corrupt or mismatched state."""
        if not isinstance(state, dict) or state.get("task") != self.name:
            got = state.get("task") if isinstance(state, dict) else type(state).__name__
            raise ValueError(f"state is not a '{self.name}' task state (got {got!r})")
        self.cursor.load_state_dict(state)

    def close(self) -> None:
        """Release resources (grader processes); a no-op for pure tasks."""
        return None
