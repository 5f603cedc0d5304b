"""Countdown as a task plugin: reach a target number with some given numbers and + - * / and parentheses.

`task: {name: countdown:Countdown, numbers: 3}` with this directory on the plugin path (a campaign's own
directory is). The completion's last `<answer>...</answer>` is read by a small recursive-descent parser over
exact fractions: only digits, + - * / and parentheses, each given number used at most once, bounded length and
nesting. Model text is never evaluated as Python (no `eval`), and there is no power operator, so no input can run
code or take long.
"""

from __future__ import annotations

import re
from fractions import Fraction

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from workers.tasks.base import EpochCursor, Problem, ScoreResult, Task, held_out_indices

MAX_CHARS = 200  # an answer longer than this is wrong without being parsed
MAX_DEPTH = 20  # parentheses nested deeper are wrong
_TOKEN = re.compile(r"\s*(?:(\d{1,4})|([-+*/()]))")


class CountdownConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    numbers: int = Field(3, ge=2, le=5, description="numbers given per problem")
    max_number: int = Field(9, ge=2, le=100, description="numbers are drawn from 1..max_number")
    problems: int = Field(500, ge=4, description="distinct problems generated (independent of the trial seed)")
    heldout_fraction: float = Field(0.2, ge=0.0, lt=1.0)


class ParseError(ValueError):
    pass


def _tokens(text: str) -> list[str]:
    out, pos = [], 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None:
            if text[pos:].strip() == "":
                break
            raise ParseError(f"unexpected {text[pos]!r}")
        out.append(m.group(1) or m.group(2))
        pos = m.end()
    return out


class _Parser:
    """expr := term (('+'|'-') term)*; term := atom (('*'|'/') atom)*; atom := number | '(' expr ')'."""

    def __init__(self, tokens: list[str]):
        self.tokens, self.pos, self.used = tokens, 0, []

    def _peek(self) -> str | None:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def expr(self, depth: int = 0) -> Fraction:
        value = self.term(depth)
        while self._peek() in ("+", "-"):
            op = self.tokens[self.pos]
            self.pos += 1
            rhs = self.term(depth)
            value = value + rhs if op == "+" else value - rhs
        return value

    def term(self, depth: int) -> Fraction:
        value = self.atom(depth)
        while self._peek() in ("*", "/"):
            op = self.tokens[self.pos]
            self.pos += 1
            rhs = self.atom(depth)
            if op == "/" and rhs == 0:
                raise ParseError("division by zero")
            value = value * rhs if op == "*" else value / rhs
        return value

    def atom(self, depth: int) -> Fraction:
        tok = self._peek()
        if tok is None:
            raise ParseError("expression ends early")
        self.pos += 1
        if tok == "(":
            if depth >= MAX_DEPTH:
                raise ParseError("nested too deep")
            value = self.expr(depth + 1)
            if self._peek() != ")":
                raise ParseError("missing ')'")
            self.pos += 1
            return value
        if tok.isdigit():
            self.used.append(int(tok))
            return Fraction(int(tok))
        raise ParseError(f"unexpected {tok!r}")


def evaluate(expression: str) -> tuple[Fraction, list[int]]:
    """The exact value of an arithmetic expression and the numbers it uses; ParseError for anything else."""
    if len(expression) > MAX_CHARS:
        raise ParseError("answer too long")
    parser = _Parser(_tokens(expression))
    value = parser.expr()
    if parser.pos != len(parser.tokens):
        raise ParseError(f"unexpected {parser.tokens[parser.pos]!r}")
    return value, parser.used


def extract(completion: str) -> str | None:
    """The last `<answer>...</answer>` block's content (None: no block); two reverse scans, linear time."""
    end = completion.rfind("</answer>")
    start = completion.rfind("<answer>", 0, max(end, 0))
    return completion[start + len("<answer>"):end].strip() if end >= 0 and start >= 0 else None


def grade(completion: str, numbers: list[int], target: int) -> bool:
    """The answer reaches `target` using each of `numbers` at most once."""
    expression = extract(completion)
    if expression is None:
        return False
    try:
        value, used = evaluate(expression)
    except ParseError:
        return False
    pool = list(numbers)
    for n in used:
        if n not in pool:
            return False
        pool.remove(n)
    return value == target


def make_problem(rng: np.random.Generator, count: int, max_number: int) -> Problem:
    """Numbers drawn uniformly; the target is the value of a random left-to-right + - * combination of them
    (positive), so every problem has a solution."""
    while True:
        nums = [int(x) for x in rng.integers(1, max_number + 1, size=count)]
        value, text = nums[0], str(nums[0])
        for n in nums[1:]:
            op = "+-*"[int(rng.integers(3))]
            value = value + n if op == "+" else value - n if op == "-" else value * n
            text = f"({text} {op} {n})"
        if value > 0:
            listed = ", ".join(map(str, nums))
            prompt = (f"Using the numbers {listed}, write an equation that equals {value}. Use each number at most "
                      "once, with + - * / and parentheses. Put the equation in <answer></answer>.")
            return Problem(id=f"{listed}={value}", prompt=prompt, answer=f"{text}")


class Countdown(Task):
    """Generated countdown problems (a fixed set, seed-independent), held out by a fixed fraction."""

    name = "countdown"
    Config = CountdownConfig

    def __init__(self, config: CountdownConfig, seed: int):
        rng = np.random.default_rng([config.numbers, config.max_number, 2024])
        problems: dict[str, Problem] = {}
        for _ in range(20 * config.problems):
            p = make_problem(rng, config.numbers, config.max_number)
            problems.setdefault(p.id, p)
            if len(problems) == config.problems:
                break
        everything = list(problems.values())
        held = set(held_out_indices(len(everything), config.heldout_fraction).tolist())
        self.held = [p for i, p in enumerate(everything) if i in held]
        self.train = [p for i, p in enumerate(everything) if i not in held]
        self.cursor = EpochCursor(len(self.train), seed)

    def score(self, problems: list[Problem], completions: list[str]) -> ScoreResult:
        rewards = []
        for p, c in zip(problems, completions, strict=True):
            listed, _, target = p.id.partition("=")
            rewards.append(float(grade(c, [int(x) for x in listed.split(", ")], int(target))))
        return ScoreResult(rewards=rewards)
