"""Math word-problem task graded by math-verify in an isolated, killable worker process.

Why a process: math-verify's own timeouts use SIGALRM, which only works on the main thread, and a scoring call
may run on a Ray Tune trainable thread. We disable those timeouts and run each comparison in a child process
that is killed and restarted when it exceeds `grader_timeout_s`. Model text is only parsed as LaTeX (never
sympy `parse_expr`, which evaluates Python), and never executed.
"""

from __future__ import annotations

import json
import logging
import os
import pickle
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from .base import EpochCursor, Problem, ScoreResult, Task, check_lengths, held_out_indices
from .config import MathConfig

_BOXED = re.compile(r"\\boxed\s*\{")
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
_READY_TIMEOUT_S = 120.0  # child start-up (imports) is not charged to the per-answer limit


def last_boxed(text: str) -> str | None:
    """Content of the last complete `\\boxed{...}` (braces balanced, nesting allowed); None if there is none."""
    for m in reversed(list(_BOXED.finditer(text))):
        depth, start = 1, m.end()
        for i in range(start, len(text)):
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            if depth == 0:
                return text[start:i].strip()
    return None


def extract_answer(text: str, fallback: str = "last_number") -> str | None:
    """The last boxed content, else (fallback == "last_number") the last number in the text, else None."""
    boxed = last_boxed(text)
    if boxed is not None:
        return boxed
    if fallback == "last_number":
        nums = _NUMBER.findall(text)
        return nums[-1] if nums else None
    return None


def grade_answer(gold: str, pred: str) -> bool:
    """math-verify equivalence of two answer strings, parsed as LaTeX only, with its signal timeouts off.

    Runs in the grader process; tests replace this module attribute with another module-level function.
    """
    from math_verify import LatexExtractionConfig, parse, verify

    cfg = [LatexExtractionConfig()]
    g = parse("\\boxed{" + gold.strip().strip("$") + "}", extraction_config=cfg, parsing_timeout=None)
    p = parse("\\boxed{" + pred + "}", extraction_config=cfg, parsing_timeout=None)
    return bool(g and p and verify(g, p, timeout_seconds=None))


def _grader_main(conn: Any, parent_pid: int) -> None:
    """Child loop: receive pickled (fn, gold, pred), reply ("ok", bool) or ("error", message); exit on EOF."""
    logging.getLogger("math_verify").setLevel(logging.ERROR)  # "timeout disabled" warnings: we enforce it
    # pay math-verify's imports and its parsers' lazy set-up before reporting ready: the first answer graded in a
    # fresh child would otherwise spend part of its time limit on them (seconds on a loaded machine)
    grade_answer("1", "1")

    def orphan_watch() -> None:  # a parent killed hard cannot kill us; exit once it is gone
        while os.getppid() == parent_pid:
            time.sleep(1.0)
        os._exit(0)

    threading.Thread(target=orphan_watch, daemon=True).start()
    conn.send("ready")
    while True:
        try:
            payload = conn.recv_bytes()
        except (EOFError, OSError):
            return
        try:
            fn, gold, pred = pickle.loads(payload)
            reply: tuple[str, Any] = ("ok", bool(fn(gold, pred)))
        except Exception as e:  # any grader failure is reported, never fatal to the loop
            reply = ("error", f"{type(e).__name__}: {e}"[:500])
        conn.send(reply)


class IsolatedGrader:
    """One child process (`python -m workers.tasks.math`) grading one answer at a time under a wall-clock limit.

    A plain subprocess over a socketpair rather than multiprocessing: no re-import of the caller's __main__,
    and it works from any thread. Thread-safe; the child is started lazily and restarted after a kill.
    """

    def __init__(self, timeout_s: float):
        self.timeout_s = timeout_s
        self._proc: subprocess.Popen[bytes] | None = None
        self._conn: Any = None
        self._lock = threading.Lock()

    def _start(self) -> None:
        ours, theirs = socket.socketpair()
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([p for p in sys.path if p] + [env.get("PYTHONPATH", "")])
        cmd = [sys.executable, "-m", "workers.tasks.math", str(theirs.fileno()), str(os.getpid())]
        proc = subprocess.Popen(cmd, pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL, env=env)
        theirs.close()
        conn = Connection(ours.detach())
        try:
            ready = conn.poll(_READY_TIMEOUT_S) and conn.recv() == "ready"
        except (EOFError, OSError):  # the child died during start-up (its stderr says why)
            ready = False
        if not ready:
            proc.kill()
            conn.close()
            raise RuntimeError("math grader process did not start")
        self._proc, self._conn = proc, conn

    def _stop(self) -> None:
        if self._proc is not None:
            self._proc.kill()
            self._proc.wait(5)
            self._conn.close()
        self._proc = self._conn = None

    def grade(self, fn: Callable[[str, str], bool], gold: str, pred: str) -> tuple[str, bool]:
        """Returns (status, correct) with status in {"ok", "error", "timeout"}; correct is False unless ok."""
        with self._lock:
            if self._proc is None or self._proc.poll() is not None:
                self._stop()
                self._start()
            try:
                self._conn.send_bytes(pickle.dumps((fn, gold, pred)))
            except Exception:  # unpicklable grader, or a broken pipe
                self._stop()
                return "error", False
            if not self._conn.poll(self.timeout_s):
                self._stop()  # the child may be stuck in sympy: kill it, a fresh one starts on demand
                return "timeout", False
            try:
                status, value = self._conn.recv()
            except (EOFError, OSError):  # child died mid-answer
                self._stop()
                return "error", False
            return (status, bool(value)) if status == "ok" else ("error", False)

    def close(self) -> None:
        with self._lock:
            self._stop()


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """A JSONL file's rows (blank lines skipped); a bad line is a ValueError naming the file and line."""
    rows = []
    for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{lineno}: invalid JSON ({e.msg})") from None
    return rows


def load_records(config: MathConfig, split: str) -> list[dict[str, Any]]:
    """Rows of a local JSONL file (when `dataset` is an existing file) or of a Hugging Face split."""
    assert config.dataset is not None
    path = Path(config.dataset).expanduser()
    if path.is_file():
        return read_jsonl(path)
    if config.dataset.endswith((".jsonl", ".json")):
        raise FileNotFoundError(f"dataset file not found: {path}")
    try:
        import datasets
    except ImportError as e:
        raise ImportError("Hugging Face datasets need the 'datasets' package (pip install datasets)") from e
    return [dict(r) for r in datasets.load_dataset(config.dataset, split=split)]


def to_problems(rows: list[dict[str, Any]], config: MathConfig, prefix: str) -> list[Problem]:
    """Rows -> Problems with ids `prefix:index`; a row missing a field raises ValueError."""
    out = []
    for i, row in enumerate(rows):
        if not isinstance(row, dict) or config.problem_field not in row or config.answer_field not in row:
            raise ValueError(f"row {i} lacks '{config.problem_field}' or '{config.answer_field}'")
        prompt = config.prompt_template.format(problem=row[config.problem_field])
        out.append(Problem(id=f"{prefix}:{i}", prompt=prompt, answer=str(row[config.answer_field]).strip()))
    return out


class MathTask(Task):
    """Problems from a dataset; reward 1.0 when the extracted answer is math-verify-equivalent to the reference."""

    name = "math"
    score_time_limit_s = None  # the isolated grader enforces `grader_timeout_s` per answer in a killable process

    def __init__(self, config: MathConfig, seed: int):
        self.config = config
        problems = to_problems(load_records(config, config.split), config, config.split)
        if config.eval_split is not None:
            if Path(config.dataset or "").expanduser().is_file():
                raise ValueError("eval_split applies to Hugging Face datasets, not a local JSONL file")
            self.train = problems
            held_rows = load_records(config, config.eval_split)
            self.held = to_problems(held_rows, config, config.eval_split)
        else:
            held = set(held_out_indices(len(problems), config.heldout_fraction).tolist())
            self.held = [p for i, p in enumerate(problems) if i in held]
            self.train = [p for i, p in enumerate(problems) if i not in held]
        self.cursor = EpochCursor(len(self.train), seed)
        self.grader = IsolatedGrader(config.grader_timeout_s)

    def score(self, problems: list[Problem], completions: list[str]) -> ScoreResult:
        check_lengths(problems, completions)
        result = ScoreResult()
        for problem, completion in zip(problems, completions, strict=True):
            pred = extract_answer(completion, self.config.answer_fallback)
            if pred is None or not pred:
                result.rewards.append(0.0)
                continue
            if pred == problem.answer:  # exact text match: skip the grader round trip
                result.rewards.append(1.0)
                continue
            # looked up at call time so tests can monkeypatch `grade_answer` with a module-level function
            status, correct = self.grader.grade(grade_answer, problem.answer, pred)
            result.grader_errors += status == "error"
            result.grader_timeouts += status == "timeout"
            result.rewards.append(1.0 if correct else 0.0)
        return result

    def close(self) -> None:
        self.grader.close()


if __name__ == "__main__":  # the grader child: python -m workers.tasks.math <socket fd> <parent pid>
    _grader_main(Connection(int(sys.argv[1])), int(sys.argv[2]))
