"""Task and environment plugins: a broken one is one line + exit 2 before launch (the real CLI, plugin modules
written next to the trial file, which is on the plugin path); working ones build and play like built-ins."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

from tests.unit.config.cli_errors import trial_error
from workers.tasks import make_task
from workers.tasks.config import validate_task
from workers.tasks.plugins import add_plugin_paths

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"

TASK = """
from pydantic import BaseModel
from workers.tasks.base import EpochCursor, Problem, ScoreResult, Task

class Conf(BaseModel):
    size: int = 4

class Good(Task):
    name = "good"
    Config = Conf
    def __init__(self, config, seed):
        self.train = [Problem(str(i), f"{i} =", str(i)) for i in range(config.size)]
        self.held = self.train[:1]
        self.cursor = EpochCursor(len(self.train), seed)
    def score(self, problems, completions):
        return ScoreResult([float(c.strip() == p.answer) for p, c in zip(problems, completions)])

class ShortScore(Good):
    def score(self, problems, completions):
        return ScoreResult([1.0])

class NoConfig(Task):
    def score(self, problems, completions):
        return ScoreResult([])

class NotATask:
    Config = Conf
"""

ENV = """
from pydantic import BaseModel
from workers.envs.plugin import TextEnv

class Conf(BaseModel):
    pass

class Raising(TextEnv):
    Config = Conf
    actions = ("go",)
    instruction = "go"
    def reset(self, seed): pass
    def state_text(self): return "here"
    def step(self, action): raise RuntimeError("the env broke")
"""


@pytest.mark.parametrize("task, needle", [
    ("{name: 'broken_mod:Good'}", "task.name: cannot import module 'broken_mod' (ModuleNotFoundError: No module "
                                  "named 'not_installed_anywhere')"),
    ("{name: 'good_tasks:Nope'}", "task.name: module 'good_tasks' has no class 'Nope'"),
    ("{name: 'good_tasks:NoConfig'}", "task.name: NoConfig has no Config class"),
    ("{name: 'good_tasks:NotATask'}", "is neither a workers.tasks.base.Task (single-turn) nor a "
                                      "workers.envs.plugin.TextEnv (multi-turn) subclass"),
    ("{name: 'good_tasks:Good', sise: 3}", "task.sise: unknown key for task 'good_tasks:Good' (did you mean "
                                           "'size'?); task 'good_tasks:Good' has: size"),
    ("{name: 'good_tasks:ShortScore'}", "task: score of 2 completions returned 1 rewards (one per completion)"),
    ("{name: 'bad_envs:Raising'}", "task: env bad_envs:Raising failed a dry run (RuntimeError: the env broke)"),
])
def test_broken_plugins_stop_before_launch(tmp_path, task, needle):
    (tmp_path / "good_tasks.py").write_text(textwrap.dedent(TASK))
    (tmp_path / "broken_mod.py").write_text("import not_installed_anywhere\n")
    (tmp_path / "bad_envs.py").write_text(textwrap.dedent(ENV))
    path, lines = trial_error(tmp_path, f"model: {{name: tiny-qwen2-base}}\ntask: {task}\n")
    assert len(lines) == 1 and lines[0].startswith(f"error: {path}: ") and needle in lines[0], lines


@pytest.fixture
def examples_on_path():
    before = list(sys.path)
    add_plugin_paths([str(EXAMPLES / "countdown"), str(EXAMPLES / "guess_number")])
    yield
    sys.path[:] = before


def test_task_plugin_builds_and_round_trips(examples_on_path):
    from workers.tasks.plugins import dry_check

    cfg = validate_task({"name": "countdown:Countdown", "numbers": 3, "problems": 50})
    assert cfg.model_dump() == {"name": "countdown:Countdown", "numbers": 3, "max_number": 9, "problems": 50,
                                "heldout_fraction": 0.2}
    assert validate_task(cfg.model_dump()) == cfg and not cfg.agentic and cfg.label == "Countdown"
    dry_check(cfg)
    task = make_task(cfg, seed=3)
    assert len(task.train) == 40 and len(task.held) == 10
    batch = task.next_batch(2)
    right = [f"<answer>{p.answer}</answer>" for p in batch]
    assert task.score(batch, right).rewards == [1.0, 1.0]
    assert task.score(batch, ["<answer>1+</answer>", "no answer"]).rewards == [0.0, 0.0]


def test_env_plugin_plays_through_the_ragen_protocol(examples_on_path):
    from orchestrator.config.rollout import RolloutConfig

    cfg = validate_task({"name": "guess_number:GuessNumber", "high": 4})
    assert cfg.agentic
    task = make_task(cfg, seed=0)
    level = task.next_levels(1)[0]
    secret = task.episode(level, 0, RolloutConfig(max_tokens=16)).env.env.secret
    ep = task.episode(level, 0, RolloutConfig(max_tokens=16))
    assert "between 1 and 4" in ep.system() and "Guesses so far: none." in ep.prompt()
    wrong = 1 if secret != 1 else 2
    out = ep.play(f"<think></think><answer>{wrong}</answer>")
    assert out.reward == 0.0 and not out.done and f"{wrong} (" in out.observation
    out = ep.play(f"<think></think><answer>{secret}</answer>")
    assert out.done and ep.stats.success and ep.stats.episode_return == 1.0
