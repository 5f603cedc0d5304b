"""Toy arithmetic tasks for the tiny test model.

`arithmetic`: prompts like "3 + 4 =", answer "7" (first integer of the completion).
`arithmetic_mc`: the same problems as a multiple-choice question, "what is 3 + 4 ? A: 7, B: 5, C: 8, D: 6. answer:",
answer "A": the first completion token is the chosen label (the task's action position).
"""

from __future__ import annotations

import itertools
import re

import numpy as np

from .base import EpochCursor, Problem, ScoreResult, Task, check_lengths, held_out_indices
from .config import ArithmeticConfig

_INT = re.compile(r"-?\d+")
_OPS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}
LABELS = ("A", "B", "C", "D")  # single tokens of the tiny vocabulary (workers.models.loading.WORDS)
_LABEL = re.compile(r"\s*([A-Za-z]+)")


def all_problems(max_operand: int, ops: list[str]) -> list[Problem]:
    """Every (a, op, b) with a, b in 0..max_operand, in a fixed order (op-major, then a, then b)."""
    rng = range(max_operand + 1)
    return [
        Problem(id=f"{a}{op}{b}", prompt=f"{a} {op} {b} =", answer=str(_OPS[op](a, b)))
        for op, a, b in itertools.product(ops, rng, rng)
    ]


def first_int_matches(completion: str, answer: str) -> bool:
    """The first integer (`-?\\d+`) in the completion equals the answer; no integer is wrong."""
    m = _INT.search(completion)
    if m is None:
        return False
    try:
        return int(m.group()) == int(answer)
    except ValueError:  # absurdly long digit strings exceed int() limits; never a correct answer here
        return False


class ArithmeticTask(Task):
    """Problem set = all operand/op combinations minus a seed-independent held-out subset."""

    name = "arithmetic"

    def __init__(self, config: ArithmeticConfig, seed: int):
        problems = self._problems(config)
        held = set(held_out_indices(len(problems), config.heldout_fraction).tolist())
        self.held = [p for i, p in enumerate(problems) if i in held]
        self.train = [p for i, p in enumerate(problems) if i not in held]
        self.cursor = EpochCursor(len(self.train), seed)

    @staticmethod
    def _problems(config: ArithmeticConfig) -> list[Problem]:
        return all_problems(config.max_operand, list(config.ops))

    @staticmethod
    def _correct(completion: str, answer: str) -> bool:
        return first_int_matches(completion, answer)

    def score(self, problems: list[Problem], completions: list[str]) -> ScoreResult:
        check_lengths(problems, completions)
        return ScoreResult(
            rewards=[1.0 if self._correct(c, p.answer) else 0.0 for p, c in zip(problems, completions, strict=True)]
        )


def mc_problem(a: int, op: str, b: int, num_choices: int) -> Problem:
    """The multiple-choice form of `a op b`: distinct integer options, one correct, labelled A, B, ... in order.

    Distractors are answer + d for d in +-1..+-4 (non-negative when the operation cannot go negative), and the
    correct label's place is drawn too; both depend only on (a, op, b, num_choices), never on the trial seed.
    """
    if not 2 <= num_choices <= len(LABELS):
        raise ValueError(f"num_choices must lie in [2, {len(LABELS)}], got {num_choices}")
    value = _OPS[op](a, b)
    rng = np.random.default_rng([a, b, "+-*".index(op), num_choices])
    cands = [value + d for d in (-4, -3, -2, -1, 1, 2, 3, 4) if op == "-" or value + d >= 0]
    options = [int(x) for x in rng.choice(cands, size=num_choices - 1, replace=False)]
    correct = int(rng.integers(num_choices))
    options.insert(correct, value)
    listed = ", ".join(f"{LABELS[i]}: {v}" for i, v in enumerate(options))
    return Problem(id=f"{a}{op}{b}", prompt=f"what is {a} {op} {b} ? {listed}. answer:", answer=LABELS[correct])


def first_label_matches(completion: str, label: str) -> bool:
    """The completion's first word (leading run of letters, after whitespace) is exactly `label`."""
    m = _LABEL.match(completion)
    return m is not None and m.group(1) == label


class ArithmeticMCTask(ArithmeticTask):
    """`arithmetic` as multiple choice: same problems and held-out split; reward 1 iff the first word is the label.

    `action_tokens` are the labels in use (A, B, ... up to `num_choices`); the action position is the first
    completion token (see `Task`).
    """

    name = "arithmetic_mc"

    def __init__(self, config: ArithmeticConfig, seed: int):
        super().__init__(config, seed)
        self._labels = list(LABELS[: config.num_choices])

    @staticmethod
    def _problems(config: ArithmeticConfig) -> list[Problem]:
        # the same order as all_problems, so the held-out subset is the same problems as in `arithmetic`
        rng = range(config.max_operand + 1)
        return [mc_problem(a, op, b, config.num_choices) for op, a, b in itertools.product(config.ops, rng, rng)]

    @staticmethod
    def _correct(completion: str, answer: str) -> bool:
        return first_label_matches(completion, answer)

    @property
    def action_tokens(self) -> list[str]:
        return list(self._labels)
