"""Task interface shared by the trial loop: problems in, binary rewards out, a resumable data cursor.

A task owns a fixed list of training problems and walks a seeded permutation of it, one epoch at a time
(epoch e uses the permutation seeded by (seed, e)); the cursor (epoch, position) is the whole state.

Every task's `score` is guarded (`Task.__init_subclass__` wraps it): each completion is scored on its own, and
one whose reward function raises, returns something that is not one number, or runs past
`score_time_limit_s` scores 0 and is counted (`grader_errors` / `grader_timeouts`), so a bad reward function
never stops a trial. A task whose grader enforces its own limit in a killable process (math) sets the limit to
None; the guard then only catches errors.
"""

from __future__ import annotations

import functools
import queue
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Problem:
    """One prompt: `prompt` is the text given to the model (the user turn), `answer` the reference answer as
    text; `system`: a system message rendered with it; `source`: a label the trial logs per-source metrics under."""

    id: str
    prompt: str
    answer: str
    system: str | None = None
    source: str = ""


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


DEFAULT_SCORE_TIME_LIMIT_S = 5.0


class _LimitedRunner:
    """Runs calls on one daemon thread and waits at most a time limit for each. A call past its limit is
    abandoned with its thread (Python cannot stop a thread; it finishes or idles in the background) and the
    next call gets a fresh thread. Only for in-process reward functions: a grader that can hang for good
    belongs in a child process (workers.tasks.math.IsolatedGrader)."""

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue | None = None
        self.abandoned = 0

    @staticmethod
    def _loop(jobs: queue.SimpleQueue) -> None:
        while True:
            fn, args, box, done = jobs.get()
            try:
                box.append(("ok", fn(*args)))
            except BaseException as exc:  # noqa: BLE001 - reported to the caller, never fatal here
                box.append(("error", exc))
            done.set()

    def run(self, fn: Callable, args: tuple, limit_s: float) -> tuple[str, Any]:
        if self._jobs is None:
            self._jobs = queue.SimpleQueue()
            threading.Thread(target=self._loop, args=(self._jobs,), daemon=True, name="task-score").start()
        box: list = []
        done = threading.Event()
        self._jobs.put((fn, args, box, done))
        if not done.wait(limit_s):
            self._jobs, self.abandoned = None, self.abandoned + 1  # that thread is stuck in fn: leave it
            return "timeout", None
        return box[0]


def _one_reward(value: Any) -> tuple[float | None, int, int]:
    """(reward, grader_errors, grader_timeouts) from a one-item ScoreResult; reward None when malformed.
    A NaN or inf reward is passed on as it is: the trial drops and counts such groups (non-finite filter)."""
    if not isinstance(value, ScoreResult) or len(value.rewards) != 1:
        return None, 0, 0
    try:
        reward = float(value.rewards[0])
    except (TypeError, ValueError):
        return None, 0, 0
    return reward, int(value.grader_errors), int(value.grader_timeouts)


def guarded_score(task: Task, fn: Callable, problems: list[Problem], completions: list[str]) -> ScoreResult:
    """`fn(task, [problem], [completion])` for each pair; a raise, a malformed result or a run past
    `task.score_time_limit_s` scores 0 and is counted in `grader_errors` / `grader_timeouts`."""
    check_lengths(problems, completions)
    limit = task.score_time_limit_s
    runner = task.__dict__.get("_score_runner")
    if limit is not None and runner is None:
        runner = task.__dict__.setdefault("_score_runner", _LimitedRunner())
    result = ScoreResult()
    for problem, completion in zip(problems, completions, strict=True):
        if limit is None:
            try:
                status, value = "ok", fn(task, [problem], [completion])
            except Exception as exc:  # noqa: BLE001 - counted, scored 0
                status, value = "error", exc
        else:
            status, value = runner.run(fn, (task, [problem], [completion]), limit)
        reward, errors, timeouts = _one_reward(value) if status == "ok" else (None, 0, 0)
        result.grader_errors += errors + (status == "error" or (status == "ok" and reward is None))
        result.grader_timeouts += timeouts + (status == "timeout")
        result.rewards.append(0.0 if reward is None else reward)
    return result


class Task(ABC):
    """A problem source with a reward function. Subclasses set `self.train`, `self.held` and `self.cursor`.

    `score` is guarded in every subclass (see the module docstring): `score_time_limit_s` is the wall-clock
    limit per completion (None: the task enforces its own limit, only errors are caught).

    Action position convention: a task whose answer is one choice from a declared set returns that set from
    `action_tokens` (strings, each exactly one token of the policy's tokenizer), and the action is the *first
    completion token*. The sampler restricts and floors that token's distribution over the set
    (`RolloutWorker.generate(action_token_ids=...)`) and the learner recomputes it
    (`workers.objectives.probability_floor.floored_token_logprobs` with positions = first completion token). Tasks with
    free-form answers return None.
    """

    name: str = "task"
    train: list[Problem]
    held: list[Problem]
    cursor: EpochCursor
    score_time_limit_s: float | None = DEFAULT_SCORE_TIME_LIMIT_S

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        fn = cls.__dict__.get("score")
        if fn is not None and not getattr(fn, "__isabstractmethod__", False) and not getattr(fn, "_guarded", False):

            @functools.wraps(fn)
            def score(self: Task, problems: list[Problem], completions: list[str]) -> ScoreResult:
                return guarded_score(self, fn, problems, completions)

            score._guarded = True  # type: ignore[attr-defined]
            cls.score = score  # type: ignore[method-assign]

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

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state.pop("_score_runner", None)  # a thread and its queue: a copy starts its own
        return state

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
