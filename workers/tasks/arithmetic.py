"""Toy arithmetic task for the tiny test model: prompts like "3 + 4 =", answer "7"."""

from __future__ import annotations

import itertools
import re

from .base import EpochCursor, Problem, ScoreResult, Task, check_lengths, held_out_indices
from .config import TaskConfig

_INT = re.compile(r"-?\d+")
_OPS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}


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

    def __init__(self, config: TaskConfig, seed: int):
        problems = all_problems(config.max_operand, list(config.ops))
        held = set(held_out_indices(len(problems), config.heldout_fraction).tolist())
        self.held = [p for i, p in enumerate(problems) if i in held]
        self.train = [p for i, p in enumerate(problems) if i not in held]
        self.cursor = EpochCursor(len(self.train), seed)

    def score(self, problems: list[Problem], completions: list[str]) -> ScoreResult:
        check_lengths(problems, completions)
        return ScoreResult(
            rewards=[
                1.0 if first_int_matches(c, p.answer) else 0.0
                for p, c in zip(problems, completions, strict=True)
            ]
        )
