"""Chained arithmetic: a procedurally generated multi-step task with step-by-step solutions.

A problem is a start value and `chain_steps` operations `+ b` / `- b` (b in 1..9) whose running value stays in
0..`chain_max_value` (so steps carry and borrow across the tens): prompt `solve 7 + 5 - 3 + 8 :`, answer `17`.
A solution writes one step per operation and ends with the answer:

    ` 7 + 5 = 12 . 12 - 3 = 9 . 9 + 8 = 17 . answer 17`

Reward: 1 iff the integer after the last `answer` equals the reference.

`solution_trace` writes such a solution with a `TraceStyle`: deliberate mistakes (a wrong step result that the
rest of the solution then builds on), caught mistakes ("wait let me check ..." then the recomputed step) and
strategic phrases where a reasoner would use them (verifying a step, a plan at the start). It is the corpus the
local reasoning model (`workers.tiny.reasoner`) is supervised on, so the model starts imperfect, and checking a step
is worth something to it.

Held-out problems are chosen by a hash of the problem id (`problem_fraction(id) < heldout_fraction`): the same
problems for every seed and problem count, and the reasoner's corpus only uses problems with
`problem_fraction >= 0.5`, so no held-out problem was ever in it while `heldout_fraction <= 0.5`.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

import numpy as np

from .base import EpochCursor, Problem, ScoreResult, Task, check_lengths
from .config import ChainConfig

_ANSWER = re.compile(r"answer\s*(-?\d+)")
MAX_OPERAND = 9
CORPUS_MIN_FRACTION = 0.5  # the reasoner's corpus uses only problems at or above this hash fraction


@dataclass(frozen=True)
class Chain:
    start: int
    ops: tuple[tuple[str, int], ...]  # (op, operand) per step

    @property
    def id(self) -> str:
        return f"{self.start}" + "".join(f"{op}{b}" for op, b in self.ops)

    def values(self) -> list[int]:
        """The running value after each step (without the start)."""
        out, x = [], self.start
        for op, b in self.ops:
            x = x + b if op == "+" else x - b
            out.append(x)
        return out

    @property
    def answer(self) -> int:
        return self.values()[-1]

    def prompt(self) -> str:
        return "solve " + " ".join([str(self.start)] + [f"{op} {b}" for op, b in self.ops]) + " :"

    def problem(self) -> Problem:
        return Problem(id=self.id, prompt=self.prompt(), answer=str(self.answer))


def problem_fraction(problem_id: str) -> float:
    """A stable pseudo-random number in [0, 1) per problem id (held-out split, corpus split)."""
    return int.from_bytes(hashlib.sha256(problem_id.encode()).digest()[:8], "big") / 2**64


def random_chain(rng: np.random.Generator, steps: int, max_value: int) -> Chain:
    """A uniformly drawn valid chain: each step picks uniformly among the (op, b) keeping 0 <= x <= max_value."""
    x = int(rng.integers(0, min(9, max_value) + 1))
    start, ops = x, []
    for _ in range(steps):
        moves = [("+", b) for b in range(1, MAX_OPERAND + 1) if x + b <= max_value]
        moves += [("-", b) for b in range(1, MAX_OPERAND + 1) if x - b >= 0]
        op, b = moves[int(rng.integers(len(moves)))]
        x = x + b if op == "+" else x - b
        ops.append((op, b))
    return Chain(start, tuple(ops))


def problem_set(steps: int, max_value: int, count: int) -> list[Chain]:
    """`count` distinct chains drawn with a fixed generator (independent of the trial seed), in draw order."""
    rng = np.random.default_rng([steps, max_value, 12_345])
    seen: dict[str, Chain] = {}
    tries = 0
    while len(seen) < count and tries < 50 * count:
        c = random_chain(rng, steps, max_value)
        seen.setdefault(c.id, c)
        tries += 1
    return list(seen.values())


def parse_chain(problem_id: str) -> Chain:
    """Inverse of `Chain.id` (ids look like `7+5-3+8`)."""
    parts = re.findall(r"[+-]\d", problem_id)
    return Chain(int(re.match(r"\d+", problem_id).group()), tuple((p[0], int(p[1:])) for p in parts))


def final_answer(completion: str) -> int | None:
    """The integer after the last `answer` in the completion (None: no answer)."""
    found = _ANSWER.findall(completion)
    if not found:
        return None
    try:
        return int(found[-1])
    except ValueError:
        return None


# ------------------------------------------------------------------------------------------------- traces
@dataclass(frozen=True)
class TraceStyle:
    """How a solution is written. Probabilities per step unless said otherwise.

    error: a step's result is wrong (off by 1, 2 or 10); the solution continues from the wrong value.
    catch: a wrong step is caught right after ("wait let me check ..." + the recomputed step).
    verify: a correct step is verified ("let me check ..." / "double check ..." + the same step again).
    plan: per solution, an opening plan phrase ("the key is ...", "notice that ...").
    """

    error: float = 0.3
    catch: float = 0.3
    verify: float = 0.04
    plan: float = 0.04


CATCH = (" wait let me check {s} .", " wait , that's not right . let me verify {s} .", " is this right ? let me check {s} .")
VERIFY = (" let me check {s} .", " double check {s} .")
PLANS = (" the key is to go one step at a time .", " notice that there are {k} steps .")


def _wrong(value: int, rest: tuple[tuple[str, int], ...], rng: np.random.Generator) -> int:
    """A wrong result (off by 1, 2 or 10) from which the remaining steps never go below 0."""
    low = min([0] + list(np.cumsum([b if op == "+" else -b for op, b in rest])))  # lowest suffix offset
    deltas = [d for d in (-10, -2, -1, 1, 2, 10) if value + d + low >= 0]
    return value + deltas[int(rng.integers(len(deltas)))]


def solution_trace(chain: Chain, rng: np.random.Generator, style: TraceStyle = TraceStyle()) -> str:
    """One step-by-step solution of `chain` written in `style` (the completion text, without EOS)."""
    out = []
    if rng.random() < style.plan:
        out.append(PLANS[int(rng.integers(len(PLANS)))].format(k=len(chain.ops)))
    x = chain.start
    for i, (op, b) in enumerate(chain.ops):
        true = x + b if op == "+" else x - b
        written = _wrong(true, chain.ops[i + 1:], rng) if rng.random() < style.error else true
        out.append(f" {x} {op} {b} = {written} .")
        step = f"{x} {op} {b} = {true}"
        if written != true and rng.random() < style.catch:
            out.append(CATCH[int(rng.integers(len(CATCH)))].format(s=step))
            written = true
        elif written == true and rng.random() < style.verify:
            out.append(VERIFY[int(rng.integers(len(VERIFY)))].format(s=step))
        x = written
    out.append(f" answer {x}")
    return "".join(out)


class ChainTask(Task):
    """`chain_problems` chains of `chain_steps` steps; held out by id hash (see the module docstring)."""

    name = "chain"

    def __init__(self, config: ChainConfig, seed: int):
        chains = problem_set(config.chain_steps, config.chain_max_value, config.chain_problems)
        frac = {c.id: problem_fraction(c.id) for c in chains}
        held = sorted((c for c in chains if frac[c.id] < config.heldout_fraction), key=lambda c: frac[c.id])
        self.held = [c.problem() for c in held]
        self.train = [c.problem() for c in chains if frac[c.id] >= config.heldout_fraction]
        self.cursor = EpochCursor(len(self.train), seed)

    def score(self, problems: list[Problem], completions: list[str]) -> ScoreResult:
        check_lengths(problems, completions)
        return ScoreResult(rewards=[1.0 if final_answer(c) == int(p.answer) else 0.0
                                    for p, c in zip(problems, completions, strict=True)])
