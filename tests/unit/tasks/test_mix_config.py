"""`task: {mix: [...]}` (workers/tasks/mix.py): members of any kind, groups summed into prompts_per_step, labels;
every mistake one line with its key path (`task.mix[1].task.<key>`), exit 2 from the CLI."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from orchestrator.config.errors import format_validation
from orchestrator.config.members import member_trials
from orchestrator.config.trial import TrialConfig
from orchestrator.tracking.names import logged_metrics, report_metric
from tests.unit.config.cli_errors import trial_error
from workers.tasks import make_task
from workers.tasks.mix import MixConfig, MixedTask, member_seed

AGENT = {"name": "tiny-agent"}
CHAIN, LAKE = {"task": {"name": "chain"}, "groups": 2}, {"task": {"name": "frozen_lake"}, "groups": 3}


def _cfg(mix: list, **extra) -> TrialConfig:
    return TrialConfig.model_validate({"model": AGENT, "task": {"mix": mix}, **extra})


def _message(mix, **extra) -> str:
    with pytest.raises(ValidationError) as info:
        _cfg(mix, **extra)
    return format_validation("t.yaml", info.value)


def test_a_mix_of_single_and_multi_turn_tasks():
    cfg = _cfg([CHAIN, LAKE])
    assert isinstance(cfg.task, MixConfig) and cfg.task.agentic and cfg.task.labels == ["chain", "frozen_lake"]
    assert cfg.rollout.prompts_per_step == 5 and cfg.model.max_model_len == 2048  # agentic context
    again = TrialConfig.model_validate(cfg.model_dump(mode="json"))  # the trial receives the dump
    assert again.task == cfg.task and again.rollout.prompts_per_step == 5
    parts = member_trials(cfg)
    assert [(label, p.task.name, p.rollout.prompts_per_step) for label, p in parts] == [
        ("chain", "chain", 2), ("frozen_lake", "frozen_lake", 3)]
    assert [p.seed for _, p in parts] == [member_seed(0, 0), member_seed(0, 1)] and parts[0][1].seed != parts[1][1].seed


def test_each_member_draws_its_own_seeded_stream_and_resumes():
    cfg = _cfg([CHAIN, {"task": {"name": "chain"}, "groups": 1, "label": "chain_b"}])
    task = make_task(cfg.task, cfg.seed)
    assert isinstance(task, MixedTask)
    a, b = task.tasks
    first = ([p.id for p in a.next_batch(2)], [p.id for p in b.next_batch(2)])
    assert first[0] != first[1]  # same task, different member seeds: different problems
    state = task.state_dict()
    later = ([p.id for p in a.next_batch(3)], [p.id for p in b.next_batch(3)])
    resumed = make_task(cfg.task, cfg.seed)
    resumed.load_state_dict(state)
    assert ([p.id for p in resumed.tasks[0].next_batch(3)], [p.id for p in resumed.tasks[1].next_batch(3)]) == later
    fresh = make_task(cfg.task, cfg.seed)
    assert ([p.id for p in fresh.tasks[0].next_batch(2)], [p.id for p in fresh.tasks[1].next_batch(2)]) == first


def test_metric_names_per_member():
    cfg = _cfg([CHAIN, {**LAKE, "label": "lake"}], eval={"every": 2})
    names = logged_metrics(cfg)
    assert {"train/chain/correct_rate", "train/lake/correct_rate", "env/lake/success", "eval/chain/pass@1",
            "eval/lake/pass@1", "eval/lake/success", "env/success", "train/grader_errors"} <= names
    assert "env/chain/success" not in names and "eval/success" not in names  # totals of a mix: pass@1 only
    assert report_metric(cfg) == "eval/pass@1"


@pytest.mark.parametrize("mix, extra, expected", [
    ([], {}, "t.yaml: task.mix: must list at least one member {task: {...}, groups: N}"),
    ([CHAIN, {"task": {"name": "chain", "xxx": 1}, "groups": 1, "label": "b"}], {},
     "t.yaml: task.mix[1].task.xxx: unknown key for task 'chain'; task 'chain' has: name, heldout_fraction"),
    ([CHAIN, {"task": {"name": "frozen_lake", "frozen_prb": 0.5}, "groups": 1}], {},
     "t.yaml: task.mix[1].task.frozen_prb: unknown key for task 'frozen_lake' (did you mean 'frozen_prob'?)"),
    ([{"task": {"name": "chian"}, "groups": 1}], {}, "t.yaml: task.mix[0].task.name: unknown task 'chian'"),
    ([{"task": {"name": "chain"}, "grups": 1}], {}, "t.yaml: task.mix[0].grups: unknown key for a mix member"),
    ([{"task": {"name": "chain"}, "groups": 0}], {}, "t.yaml: task.mix[0].groups: Input should be greater"),
    ([{"task": {"name": "chain"}}], {}, "t.yaml: task.mix[0].groups: Field required"),
    ([CHAIN, CHAIN], {}, "t.yaml: task.mix[1].label: label 'chain' repeats mix[0]'s"),
    ([{**CHAIN, "label": "a/b"}], {}, "t.yaml: task.mix[0].label: 'a/b' must be letters"),
    ([{"task": {"mix": [CHAIN]}, "groups": 1}], {}, "t.yaml: task.mix[0].task.mix: a mix member cannot be a mix"),
    ([CHAIN, LAKE], {"rollout": {"prompts_per_step": 4}},
     "t.yaml: rollout.prompts_per_step: 4 conflicts with task.mix, whose groups add up to 5"),
    ([CHAIN], {"rollout": {"fill": {"groups": 5, "max_rounds": 2}}},
     "t.yaml: rollout.fill.groups: 5 can never be reached: task.mix samples 2 groups a round"),
    ([CHAIN], {"rollout": {"fill": {"groups": 1, "max_rounds": 2}}},
     "t.yaml: rollout.fill.groups: 1 differs from task.mix's groups (2): a mix refills each member to its own"),
])
def test_errors_name_the_key_path(mix, extra, expected):
    msg = _message(mix, **extra)
    assert msg.startswith(expected) and "\n" not in msg, msg


def test_mix_with_its_own_name_or_keys_is_refused():
    with pytest.raises(ValidationError, match="no name of its own"):
        TrialConfig.model_validate({"model": AGENT, "task": {"name": "chain", "mix": [CHAIN]}})
    with pytest.raises(ValidationError, match="unknown key beside mix"):
        TrialConfig.model_validate({"model": AGENT, "task": {"mix": [CHAIN], "groups": 2}})


def test_a_prompts_per_step_equal_to_the_sum_is_accepted():
    assert _cfg([CHAIN, LAKE], rollout={"prompts_per_step": 5}).rollout.prompts_per_step == 5


def test_cli_one_line_exit_2(tmp_path):
    path, lines = trial_error(tmp_path, "model: {name: tiny-agent}\ntask:\n  mix:\n    - {task: {name: chain}, "
                                        "groups: 1}\n    - {task: {name: frozen_lake, xxx: 1}, groups: 1}\n")
    assert len(lines) == 1 and lines[0].startswith(f"error: {path}: task.mix[1].task.xxx: unknown key for task "
                                                   "'frozen_lake'"), lines
    path, lines = trial_error(tmp_path, "task: {mix: []}\n")
    assert len(lines) == 1 and lines[0].startswith(f"error: {path}: task.mix: must list at least one member"), lines
