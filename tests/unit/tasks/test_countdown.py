"""The countdown example's grader: exact arithmetic from a fixed grammar, hostile text never runs or hangs."""

from __future__ import annotations

import sys
from fractions import Fraction
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "examples" / "countdown"))
from countdown import ParseError, evaluate, grade  # noqa: E402


@pytest.mark.parametrize("text, value", [
    ("1+2*3", 7), ("(1+2)*3", 9), ("8/3", Fraction(8, 3)), ("7 - 2 - 1", 4), ("(((5)))", 5), ("6/4*2", 3),
])
def test_evaluates_exactly(text, value):
    assert evaluate(text)[0] == value


def test_grade_uses_each_number_once():
    assert grade("<answer>(3 + 5) * 2</answer>", [2, 3, 5], 16)
    assert not grade("<answer>5 + 5 + 3</answer>", [2, 3, 5], 13)  # 5 twice
    assert not grade("<answer>3 + 4</answer>", [2, 3, 5], 7)  # 4 not given
    assert grade("think <answer>9</answer> then <answer>2*5</answer>", [2, 5], 10)  # the last answer counts
    assert not grade("<answer>1/0</answer>", [1, 0], 1)


@pytest.mark.parametrize("hostile", [
    "__import__('os').system('touch /tmp/pwned')", "9**9**9**9", "9^9^9", "(" * 5000 + "1" + ")" * 5000,
    "1" * 10_000, "+".join(["9999"] * 2500), "2*" * 5000 + "2", "lambda: 1", "1e999", "0x10", "1_000",
])
def test_hostile_answers_are_wrong_and_fast(hostile):
    with pytest.raises(ParseError):
        evaluate(hostile)
    assert not grade(f"<answer>{hostile}</answer>", [1, 2, 9], 1)
    assert not grade("<answer>" * 2000 + hostile, [1, 2, 9], 1)
