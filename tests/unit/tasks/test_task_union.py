"""`task:` is one config class per task, chosen by `name`: a key another task has is an error that lists the
chosen task's keys; every message is one line with the key path (exit 2 from the CLI)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from orchestrator.config.errors import format_validation
from orchestrator.config.trial import TrialConfig
from tests.unit.config.cli_errors import trial_error
from workers.tasks.config import ChainConfig, FrozenLakeConfig, MathConfig, SokobanConfig, task_config


def _message(task: dict, model: dict | None = None) -> str:
    data = {"task": task, **({"model": model} if model else {})}
    with pytest.raises(ValidationError) as info:
        TrialConfig.model_validate(data)
    return format_validation("t.yaml", info.value)


def test_each_name_picks_its_class():
    assert isinstance(TrialConfig().task, ChainConfig)
    assert isinstance(task_config(name="math", dataset="x.jsonl"), MathConfig)
    agent = {"name": "tiny-agent"}
    assert isinstance(TrialConfig(model=agent, task={"name": "sokoban"}).task, SokobanConfig)
    cfg = TrialConfig(model=agent, task={"name": "frozen_lake", "success_rate": 0.8})
    assert isinstance(cfg.task, FrozenLakeConfig) and cfg.task.agentic and not TrialConfig().task.agentic


def test_dump_round_trips():
    cfg = TrialConfig(task={"name": "chain", "chain_steps": 4})
    dumped = cfg.model_dump(mode="json")
    assert dumped["task"] == {"name": "chain", "heldout_fraction": 0.2, "chain_steps": 4, "chain_max_value": 19,
                              "chain_problems": 4000}
    assert TrialConfig.model_validate(dumped).task == cfg.task


@pytest.mark.parametrize("task, expected", [
    ({"name": "chain", "dataset": "x.jsonl"},
     "t.yaml: task.dataset: unknown key for task 'chain'; task 'chain' has: name, heldout_fraction, chain_steps, "
     "chain_max_value, chain_problems"),
    ({"name": "chain", "chain_step": 2},
     "t.yaml: task.chain_step: unknown key for task 'chain' (did you mean 'chain_steps'?); task 'chain' has: "
     "name, heldout_fraction, chain_steps, chain_max_value, chain_problems"),
    ({"name": "chian"}, "t.yaml: task.name: unknown task 'chian' (did you mean 'chain'?); built-in: arithmetic, "
                        "arithmetic_mc, chain, math, dataset, frozen_lake, sokoban, or a plugin 'module:Class' (docs/tasks.md)"),
    ({"name": "math"}, "t.yaml: task.dataset: Field required"),
    ({"name": "chain", "chain_steps": 0}, "t.yaml: task.chain_steps: Input should be greater than or equal to 1"),
    ({"name": "arithmetic", "ops": ["/"]}, "t.yaml: task.ops.0: Input should be '+', '-' or '*'"),
    ({"name": "arithmetic", "num_choices": 3}, "t.yaml: task.num_choices: unknown key for task 'arithmetic'"),
])
def test_union_errors_name_the_key_and_the_task(task, expected):
    msg = _message(task)
    assert msg.startswith(expected) and "\n" not in msg


def test_grid_keys_belong_to_their_task():
    msg = _message({"name": "sokoban", "frozen_prob": 0.5}, {"name": "tiny-agent"})
    assert msg.startswith("t.yaml: task.frozen_prob: unknown key for task 'sokoban'") and "boxes" in msg
    assert "levels 'ragen' only" in _message({"name": "sokoban", "levels": "gymnasium"}, {"name": "tiny-agent"})


def test_existing_flat_configs_still_load():
    """Every key a task had in the one flat class is still accepted for that task."""
    task_config(name="arithmetic_mc", max_operand=3, ops=["+", "-"], num_choices=3, heldout_fraction=0.1)
    task_config(name="math", dataset="x.jsonl", split="train", problem_field="q", answer_field="a",
                prompt_template="{problem}", answer_fallback="none", grader_timeout_s=2.0, heldout_fraction=0.1)
    task_config(name="frozen_lake", size=5, levels="gymnasium", protocol="plain", dynamics="independent",
                frozen_prob=0.8, success_rate=0.9, fixed_level=3)
    task_config(name="sokoban", size=7, boxes=2, max_env_steps=50, protocol="ragen", fixed_level=None)


def test_cli_one_line_exit_2(tmp_path):
    path, lines = trial_error(tmp_path, "task: {name: chain, dataset: x.jsonl}\n")
    assert len(lines) == 1 and lines[0].startswith(f"error: {path}: task.dataset: unknown key for task 'chain'")
    assert "chain_steps" in lines[0]
