"""Problems from a dataset file in the formats researchers already have: JSONL, Parquet (verl's schema read as it
is) or a `datasets.save_to_disk` directory.

Fields are dotted paths into a record (`reward_model.ground_truth`). A prompt is text (formatted into
`prompt_template`) or a list of chat messages (verl's `prompt`): an optional system message and one user message,
rendered with the model's chat template like every prompt. `source_field` (verl's `data_source`) labels each
problem; the trial logs per-source metrics under that label. Graders: `math` (math-verify in a killable child
process, as the math task), `exact` (the extracted answer equals the reference as text), `regex` (the last match
of `answer_pattern`'s first group equals the reference) or a plugin `module:function(completion, answer) -> bool`.
Held-out problems come from `heldout_path` or a seeded `heldout_fraction` of the file.
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path
from typing import Any

import numpy as np

from .base import EpochCursor, Problem, ScoreResult, Task, check_lengths
from .config import DatasetConfig
from .math import IsolatedGrader, extract_answer, grade_answer, read_jsonl


def dataset_format(config: DatasetConfig, path: Path) -> str:
    if config.format is not None:
        return config.format
    if path.is_dir():
        return "hf_disk"
    return "parquet" if path.suffix == ".parquet" else "jsonl"


def read_records(path_text: str, config: DatasetConfig) -> list[dict[str, Any]]:
    """The file's rows as dicts; a missing or malformed file raises ValueError naming it."""
    path = Path(path_text).expanduser()
    if not path.exists():
        raise ValueError(f"dataset file not found: {path}")
    fmt = dataset_format(config, path)
    if fmt == "jsonl":
        return read_jsonl(path)
    if fmt == "parquet":
        import pyarrow.parquet as pq

        return pq.read_table(path).to_pylist()
    try:
        import datasets
    except ImportError as e:
        raise ValueError("format hf_disk needs the 'datasets' package") from e
    data = datasets.load_from_disk(str(path))
    if isinstance(data, datasets.DatasetDict):
        if config.split not in data:
            raise ValueError(f"{path}: no split {config.split!r} (has {', '.join(data)})")
        data = data[config.split]
    return [dict(r) for r in data]


def field(row: dict[str, Any], dotted: str, where: str) -> Any:
    value: Any = row
    for part in dotted.split("."):
        if not isinstance(value, dict) or part not in value:
            raise ValueError(f"{where} has no field {dotted!r}")
        value = value[part]
    return value


def prompt_parts(value: Any, template: str, where: str) -> tuple[str, str | None]:
    """(user text, system text or None) of a prompt field: text, or chat messages [system?, user]."""
    if isinstance(value, str):
        return template.format(problem=value), None
    if hasattr(value, "tolist"):
        value = value.tolist()
    if isinstance(value, list) and all(isinstance(m, dict) for m in value):
        roles = [m.get("role") for m in value]
        if roles in (["user"], ["system", "user"]):
            return str(value[-1].get("content", "")), (str(value[0].get("content", "")) if len(value) == 2 else None)
        raise ValueError(f"{where}: chat prompts must be [system?, user] messages, got roles {roles}")
    raise ValueError(f"{where}: prompt must be text or chat messages, got {type(value).__name__}")


def to_problems(rows: list[dict[str, Any]], config: DatasetConfig, prefix: str) -> list[Problem]:
    out = []
    for i, row in enumerate(rows):
        where = f"{prefix} row {i}"
        text, system = prompt_parts(field(row, config.prompt_field, where), config.prompt_template, where)
        source = str(field(row, config.source_field, where)) if config.source_field in _paths(row) else ""
        answer = field(row, config.answer_field, where)
        answer = answer[0] if isinstance(answer, list) and len(answer) == 1 else answer
        out.append(Problem(id=f"{prefix}:{i}", prompt=text, answer=str(answer).strip(), system=system,
                           source=source))
    return out


def _paths(row: dict[str, Any]) -> set[str]:
    """Every dotted path of a record (to tell an absent optional field from a typo'd required one)."""
    out: set[str] = set()
    for k, v in row.items():
        out.add(k)
        if isinstance(v, dict):
            out.update(f"{k}.{p}" for p in _paths(v))
    return out


def load_grader(path: str):
    """The plugin grader `module:function`; ValueError (one line) when it does not import or is no function."""
    module_name, _, attr = path.partition(":")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # noqa: BLE001 - any import-time failure is the plugin's, reported in one line
        raise ValueError(f"grader: cannot import module {module_name!r} ({type(exc).__name__}: {exc})") from None
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise ValueError(f"grader: module {module_name!r} has no function {attr!r}")
    return fn


class DatasetTask(Task):
    """A dataset file's problems; rewards from the configured grader (see the module docstring)."""

    name = "dataset"
    score_time_limit_s = None  # math grades in a killable child process; the other graders are linear-time

    def __init__(self, config: DatasetConfig, seed: int):
        self.config = config
        problems = to_problems(read_records(config.path, config), config, "train")
        if config.heldout_path:
            self.train, self.held = problems, to_problems(read_records(config.heldout_path, config), config, "held")
        else:
            n = len(problems)
            k = min(n - 1, int(round(config.heldout_fraction * n))) if n else 0
            held = set(np.random.default_rng(config.heldout_seed).permutation(n)[: max(k, 0)].tolist())
            self.held = [p for i, p in enumerate(problems) if i in held]
            self.train = [p for i, p in enumerate(problems) if i not in held]
        self.cursor = EpochCursor(len(self.train), seed)
        self.grader = IsolatedGrader(config.grader_timeout_s) if config.grader == "math" else None
        self.custom = load_grader(config.grader) if ":" in config.grader else None
        self.pattern = re.compile(config.answer_pattern)

    def _one(self, problem: Problem, completion: str) -> tuple[float, str]:
        if self.custom is not None:
            return float(self.custom(completion, problem.answer)), "ok"
        if self.config.grader == "regex":
            found = self.pattern.findall(completion[-20_000:])
            last = found[-1] if found else None
            last = last[0] if isinstance(last, tuple) else last
            return float(last is not None and last.strip() == problem.answer), "ok"
        pred = extract_answer(completion, self.config.answer_fallback)
        if not pred:
            return 0.0, "ok"
        if pred == problem.answer or self.config.grader == "exact":
            return float(pred == problem.answer), "ok"
        status, correct = self.grader.grade(grade_answer, problem.answer, pred)
        return float(correct), status

    def score(self, problems: list[Problem], completions: list[str]) -> ScoreResult:
        check_lengths(problems, completions)
        result = ScoreResult()
        for problem, completion in zip(problems, completions, strict=True):
            try:
                reward, status = self._one(problem, completion)
            except Exception:  # noqa: BLE001 - a plugin grader's failure scores 0 and is counted
                reward, status = 0.0, "error"
            result.rewards.append(reward)
            result.grader_errors += status == "error"
            result.grader_timeouts += status == "timeout"
        return result

    def close(self) -> None:
        if self.grader is not None:
            self.grader.close()
