"""`eval.sets` validated like every key: one line naming the file and the key path, exit 2, before launch (a set's
dataset file read, its plugin imported)."""

from __future__ import annotations

import json

import pytest
import yaml

from orchestrator.cli import main
from orchestrator.config.trial import TrialConfig


def _expand(tmp_path, capsys, sets, task=None) -> tuple[int, str]:
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({"name": "c", "storage": str(tmp_path / "s"), "seeds": [0],
                                    "base": {"model": {"name": "tiny"}, "task": task or {"name": "arithmetic"},
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


def test_a_set_named_like_a_data_source_or_a_mix_member_is_refused(tmp_path, capsys):
    """`eval/<name>/pass@1` is also a dataset source's (`data_source`, '/' read as '_') or a mix member's metric:
    a set of that name would write the same key twice."""
    rows = [{"prompt": f"{i}+1?", "reward_model": {"ground_truth": str(i + 1)},
             "data_source": "gsm8k" if i % 2 else "math/easy"} for i in range(20)]
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    task = {"name": "dataset", "path": str(data), "grader": "exact", "heldout_fraction": 0.5}
    for name in ("gsm8k", "math_easy"):
        code, err = _expand(tmp_path, capsys, [{"name": name}], task)
        assert code == 2 and err.count("\n") == 1 and err.startswith("error: "), err
        assert (f"c.yaml: eval.sets.0.name: '{name}' is a data_source label of the trial's held-out problems "
                "(eval/" + name + "/pass@1 is theirs); a set's name must not be one of: gsm8k, math_easy (trial A_s0)"
                ) in err
    assert _expand(tmp_path, capsys, [{"name": "gsm"}], task)[0] == 0
    mix = {"mix": [{"task": {"name": "arithmetic"}, "groups": 1}, {"task": task, "groups": 1, "label": "ds"}]}
    code, err = _expand(tmp_path, capsys, [{"name": "ds"}], mix)
    assert code == 2 and "set 'ds' has the label of a mix member (eval/ds/pass@1 is the member's); a set's name " \
                         "must not be one of: arithmetic, ds" in err, err
    code, err = _expand(tmp_path, capsys, [{"name": "ok"}, {"name": "math_easy"}], mix)
    assert code == 2 and "eval.sets.1.name: 'math_easy' is a data_source label" in err, err


def test_the_trial_command_refuses_a_set_named_like_a_data_source(tmp_path, capsys):
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"{i}?", "reward_model": {"ground_truth": "1"},
                                        "data_source": "gsm8k"}) + "\n" for i in range(10)))
    path = tmp_path / "t.yaml"
    path.write_text(yaml.safe_dump({"model": {"name": "tiny"}, "eval": {"sets": [{"name": "gsm8k"}]},
                                    "task": {"name": "dataset", "path": str(data), "grader": "exact"}}))
    assert main(["trial", str(path), "--storage", str(tmp_path / "s")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{path}: eval.sets.0.name: 'gsm8k' is a data_source label" in err, err
