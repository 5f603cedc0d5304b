"""`eval.sets` validated like every key: one line naming the file and the key path, exit 2, before launch (a set's
dataset file read, its plugin imported)."""

from __future__ import annotations

import pytest
import yaml

from orchestrator.cli import main
from orchestrator.config.trial import TrialConfig


def _expand(tmp_path, capsys, sets) -> tuple[int, str]:
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({"name": "c", "storage": str(tmp_path / "s"), "seeds": [0],
                                    "base": {"model": {"name": "tiny"}, "task": {"name": "arithmetic"},
                                             "eval": {"sets": sets}}, "conditions": {"A": {}}}))
    code = main(["expand", str(path)])
    return code, capsys.readouterr().err


@pytest.mark.parametrize(("sets", "says"), [
    ([{"name": "default"}], "base.eval.sets.0.name: 'default' names the trial's own held-out set"),
    ([{"name": "a"}, {"name": "a"}], "base.eval.sets: set name 'a' appears twice"),
    ([{"name": "a", "task": {"name": "chain", "dataset": "x"}}], "base.eval.sets.0.task.dataset: unknown key for "
                                                                  "task 'chain'"),
    ([{"name": "a", "problem": 3}], "base.eval.sets.0.problem: unknown key"),
    ([{"name": "a/b"}], "base.eval.sets.0.name: String should match pattern"),
    ([{"name": "a", "task": {"name": "frozen_lake"}}], "set 'a' is a multi-turn environment (frozen_lake) but the "
                                                        "trial's task is single-turn"),
    ([{"name": "gsm", "task": {"name": "dataset", "path": "/nowhere/x.jsonl"}}],
     "eval.sets.0.task: dataset file not found: /nowhere/x.jsonl (trial A_s0)"),
    ([{"name": "p", "task": {"name": "nowhere_such_module:Task"}}], "cannot import module 'nowhere_such_module'"),
])
def test_a_bad_set_is_one_line_and_exit_2(tmp_path, capsys, sets, says):
    code, err = _expand(tmp_path, capsys, sets)
    assert code == 2 and err.startswith("error: ") and err.count("\n") == 1 and says in err, err


def test_sets_round_trip_through_the_trial_config():
    cfg = TrialConfig(eval={"sets": [{"name": "more", "problems": 64},
                                     {"name": "mul", "task": {"name": "arithmetic", "ops": ["*"]}}]})
    again = TrialConfig.model_validate(cfg.model_dump(mode="json"))
    assert again.eval.sets == cfg.eval.sets and again.eval.sets[1].task.ops == ["*"]
