"""model.max_model_len is checked against the model's own config before launch: one line, exit 2, nothing
started (vLLM would otherwise refuse it inside the rollout actor)."""

from __future__ import annotations

import pytest

from orchestrator.cli import main
from orchestrator.config.errors import UserError
from orchestrator.config.trial import ModelConfig
from orchestrator.preflight.checks import check_model_limits, position_limit
from workers.tiny.families import SIZE, build_family_model


@pytest.fixture(scope="module")
def qwen3_dir(tmp_path_factory):
    return str(build_family_model("tiny-qwen3", tmp_path_factory.mktemp("fam") / "tiny-qwen3"))


def test_limit_is_read_from_the_models_config(qwen3_dir):
    assert position_limit(qwen3_dir) == ("max_position_embeddings", SIZE["max_position_embeddings"])
    check_model_limits(ModelConfig(name=qwen3_dir, max_model_len=SIZE["max_position_embeddings"]), "t.yaml")
    with pytest.raises(UserError) as err:
        check_model_limits(ModelConfig(name=qwen3_dir, max_model_len=4096), "t.yaml")
    assert str(err.value).startswith("t.yaml: model.max_model_len: 4096 exceeds the model's position limit 2048 "
                                     "(max_position_embeddings in ")


def test_locally_built_names_are_checked_too():
    with pytest.raises(UserError, match="model.max_model_len: 4096 exceeds the model's position limit 512"):
        check_model_limits(ModelConfig(name="tiny", max_model_len=4096), "t.yaml")


def test_trial_cli_refuses_before_launch(qwen3_dir, tmp_path, capsys):
    cfg = tmp_path / "trial.yaml"
    cfg.write_text(f"model: {{name: {qwen3_dir}, max_model_len: 100000}}\ntask: {{name: chain}}\n")
    assert main(["trial", str(cfg), "--storage", str(tmp_path / "results")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and f"{cfg}: model.max_model_len: 100000" in err and "2048" in err
    assert not (tmp_path / "results").exists()  # nothing started
