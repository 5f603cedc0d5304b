"""Agentic trial configs: bad values and impossible combinations are one-line errors (exit 2 from the CLI)."""

from __future__ import annotations

import subprocess
import sys

import pytest
from pydantic import ValidationError

from orchestrator.config import TrialConfig

AGENT = {"name": "tiny-agent", "max_model_len": 320}


def test_agentic_defaults_validate():
    cfg = TrialConfig(model=AGENT, task={"name": "sokoban"})
    assert cfg.task.agentic and cfg.rollout.max_turns == 5 and cfg.rollout.max_actions_per_turn == 2
    assert cfg.rollout.max_actions_per_episode == 10 and not TrialConfig().task.agentic


@pytest.mark.parametrize("over, needle", [
    ({"task": {"name": "frozen_lake", "frozen_prob": 1.5}}, "frozen_prob"),
    ({"task": {"name": "frozen_lake", "success_rate": 0}}, "success_rate"),
    ({"task": {"name": "sokoban", "size": 2}}, "size"),
    ({"task": {"name": "sokoban", "boxs": 2}}, "boxs"),
    ({"rollout": {"max_actions_per_turn": 4, "max_actions_per_episode": 3}}, "max_actions_per_turn"),
    ({"model": {"name": "tiny"}}, "tiny-agent"),
    ({"interventions": {"probability_floor": {"min_prob": 0.2}}}, "one-token action set"),
    ({"credit": {"advantage_mode": "gae", "transform_mode": "my.plugin.fn"}}, "gae composes"),
    ({"learner": {"optim": {"mini_batch_size": 0}}}, "mini_batch_size"),
])
def test_bad_agentic_configs(over, needle):
    data = {"model": AGENT, "task": {"name": "frozen_lake"}}
    for k, v in over.items():
        data[k] = {**data.get(k, {}), **v}
    with pytest.raises(ValidationError, match=needle):
        TrialConfig.model_validate(data)


def test_cli_reports_one_line_exit_2(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("model: {name: tiny}\ntask: {name: sokoban, boxes: 9}\n")
    proc = subprocess.run([sys.executable, "-m", "orchestrator", "trial", str(path)], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "task.boxes" in lines[0] and str(path) in lines[0]
