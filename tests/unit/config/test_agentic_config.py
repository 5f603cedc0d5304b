"""Agentic trial configs: bad values and impossible combinations are one-line errors (exit 2 from the CLI)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from orchestrator.config.trial import TrialConfig
from tests.unit.config.cli_errors import trial_error

AGENT = {"name": "tiny-agent", "max_model_len": 320}


def test_agentic_defaults_validate():
    cfg = TrialConfig(model=AGENT, task={"name": "sokoban"})
    assert cfg.task.agentic and cfg.rollout.max_turns == 5 and cfg.rollout.max_actions_per_turn == 2
    assert cfg.rollout.max_actions_per_episode == 10 and not TrialConfig().task.agentic
    assert (cfg.task.levels, cfg.task.protocol, cfg.task.dynamics) == ("ragen", "ragen", "shared")
    minimal = TrialConfig(model={"name": "tiny-agent"}, task={"name": "frozen_lake"})
    assert minimal.model.max_model_len == 2048 and TrialConfig().model.max_model_len == 128
    assert TrialConfig().model.max_model_len == 128  # resolving one config leaves the shared default alone


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
    ({"task": {"name": "sokoban", "levels": "gymnasium"}}, "sokoban has levels 'ragen' only"),
    ({"task": {"name": "frozen_lake", "levels": "corner"}}, "task.levels"),
    ({"task": {"name": "frozen_lake", "protocol": "ragen2"}}, "task.protocol"),
    ({"task": {"name": "frozen_lake", "dynamics": "same"}}, "task.dynamics"),
    ({"task": {"name": "frozen_lake", "protocol": "plain", "training_context": "ragen"}}, "needs protocol 'ragen'"),
    ({"task": {"name": "frozen_lake", "training_context": "rebuilt"}}, "task.training_context"),
    ({"task": {"name": "frozen_lake", "training_context": "ragen"}, "learner": {"old_logprobs": "rollout"}},
     "training_context 'ragen' trains in a context other"),
    ({"learner": {"loss_mask": "assistant_segments"}, "rollout": {"tis_cap": 2.0}}, "vLLM never sampled"),
    ({"learner": {"loss_mask": "assistant_segments", "old_logprobs": "rollout"}}, "vLLM never sampled"),
    ({"learner": {"loss_mask": "segments"}}, "learner.loss_mask"),
])
def test_bad_agentic_configs(over, needle):
    data = {"model": AGENT, "task": {"name": "frozen_lake"}}
    for k, v in over.items():
        data[k] = {**data.get(k, {}), **v}
    with pytest.raises(ValidationError, match=needle):
        TrialConfig.model_validate(data)


def test_cli_reports_one_line_exit_2(tmp_path):
    path, lines = trial_error(tmp_path, "model: {name: tiny}\ntask: {name: sokoban, boxes: 9}\n")
    assert len(lines) == 1 and "task.boxes" in lines[0] and str(path) in lines[0]


def test_ragen_training_sequence_settings_validate_and_are_for_agentic_tasks():
    cfg = TrialConfig(model=AGENT, task={"name": "sokoban", "training_context": "ragen"},
                      learner={"loss_mask": "assistant_segments"})
    assert (cfg.task.training_context, cfg.learner.loss_mask) == ("ragen", "assistant_segments")
    default = TrialConfig(model=AGENT, task={"name": "frozen_lake"})
    assert (default.task.training_context, default.learner.loss_mask) == ("sampled", "sampled")
    with pytest.raises(ValidationError, match="unknown key for task 'chain'"):  # a grid task's key only
        TrialConfig(task={"name": "chain", "training_context": "ragen"})
    with pytest.raises(ValidationError, match="is for agentic tasks"):
        TrialConfig(learner={"loss_mask": "assistant_segments"})
