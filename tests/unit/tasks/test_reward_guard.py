"""Every task's reward function is guarded: a raise, a malformed result or a run past the time limit scores 0
and is counted, per completion, and scoring goes on."""

from __future__ import annotations

import math
import pickle
import time

import pytest

import workers.tasks.chain  # noqa: F401  (registers every Task subclass)
import workers.tasks.math as math_task
from workers.tasks import ArithmeticTask, Problem, ScoreResult, Task, task_config


class _Scripted(Task):
    """Reward 1 for "ok", and misbehaviour on demand, keyed by the completion text."""

    name = "scripted"
    score_time_limit_s = 0.3

    def __init__(self):
        self.train = self.held = [Problem("p", "q", "a")]

    def score(self, problems, completions):
        out = ScoreResult()
        for c in completions:
            if c == "raise":
                raise ZeroDivisionError("reward function bug")
            if c == "slow":
                time.sleep(2.0)
            if c == "two":
                return ScoreResult(rewards=[1.0, 1.0])
            if c == "text":
                return ScoreResult(rewards=["yes"])
            if c == "nan":
                out.rewards.append(float("nan"))
                continue
            out.rewards.append(1.0 if c == "ok" else 0.0)
        return out


def _all_subclasses(cls):
    for sub in cls.__subclasses__():
        yield sub
        yield from _all_subclasses(sub)


def test_every_task_is_guarded():
    classes = [c for c in _all_subclasses(Task) if not c.__name__.startswith("_")]
    assert {"ArithmeticTask", "ArithmeticMCTask", "ChainTask", "MathTask"} <= {c.__name__ for c in classes}
    for cls in classes:
        assert getattr(cls.score, "_guarded", False), cls


def test_raise_malformed_and_timeout_score_zero_and_are_counted():
    task = _Scripted()
    completions = ["ok", "raise", "ok", "slow", "two", "text", "nan", "wrong", "ok"]
    t0 = time.perf_counter()
    res = task.score([task.train[0]] * len(completions), completions)
    elapsed = time.perf_counter() - t0
    assert res.rewards[:6] == [1.0, 0.0, 1.0, 0.0, 0.0, 0.0] and math.isnan(res.rewards[6])
    assert res.rewards[7:] == [0.0, 1.0]
    assert (res.grader_errors, res.grader_timeouts) == (3, 1)
    assert elapsed < 1.5  # the slow one was cut at 0.3 s, not waited for
    # the next call works (a fresh scoring thread) and the task still pickles
    again = task.score([task.train[0]] * 2, ["ok", "ok"])
    assert again.rewards == [1.0, 1.0] and (again.grader_errors, again.grader_timeouts) == (0, 0)
    assert pickle.loads(pickle.dumps(task)).score([task.train[0]], ["ok"]).rewards == [1.0]


def test_mismatched_lengths_are_still_a_caller_error():
    task = _Scripted()
    with pytest.raises(ValueError, match="1 problems but 2 completions"):
        task.score([task.train[0]], ["ok", "ok"])


def test_a_real_task_with_a_broken_checker(monkeypatch):
    task = ArithmeticTask(task_config(max_operand=3), seed=0)
    probs = task.next_batch(4)
    good = [p.answer for p in probs]
    assert task.score(probs, good).rewards == [1.0] * 4

    def checker(completion, answer):
        if completion == "boom":
            raise RuntimeError("checker bug")
        return completion == answer

    monkeypatch.setattr(ArithmeticTask, "_correct", staticmethod(checker))
    res = task.score(probs, [good[0], "boom", good[2], "nope"])
    assert res.rewards == [1.0, 0.0, 1.0, 0.0] and res.grader_errors == 1


def test_math_task_errors_outside_its_grader_are_caught(tmp_path, monkeypatch):
    data = tmp_path / "m.jsonl"
    data.write_text("".join(f'{{"problem": "p{i}", "answer": "{i}"}}\n' for i in range(10)))
    task = math_task.MathTask(task_config(name="math", dataset=str(data)), seed=0)
    assert task.score_time_limit_s is None  # its grader process enforces grader_timeout_s
    probs = task.next_batch(2)

    def extract(text, fallback):
        if "crash" in text:
            raise RecursionError("pathological completion")
        return text

    monkeypatch.setattr(math_task, "extract_answer", extract)
    try:
        res = task.score(probs, [probs[0].answer, "crash"])
        assert res.rewards == [1.0, 0.0] and res.grader_errors == 1
    finally:
        task.close()
