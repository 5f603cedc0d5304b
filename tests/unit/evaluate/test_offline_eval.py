"""`python -m orchestrator eval` before any engine starts (no Ray): the step and the sets it resolves from a
campaign's sealed checkpoints, and each mistake (a missing step, a damaged checkpoint, an unknown or broken set,
settings that do not fit) as one line with exit code 2; the CSV rows it writes and replaces."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import yaml

from orchestrator import storage as store
from orchestrator.campaign.expand import load_campaign
from orchestrator.cli import main
from orchestrator.evaluate.offline import (
    EvalRequest,
    parse_set,
    parse_step,
    plan_eval,
    read_rows,
    write_row,
)
from workers.checkpoint.blob import dump_blob

BASE = {"steps": 2, "model": {"name": "tiny"}, "task": {"name": "arithmetic"},
        "eval": {"every": 1, "problems": 4, "n": 4, "k": 2,
                 "sets": [{"name": "small", "task": {"name": "arithmetic", "max_operand": 2}}]}}


def _checkpoint(tune_dir: Path, index: int, step: int, config: dict) -> Path:
    """A sealed checkpoint of `step` whose learner blob loads weights-only (what `verified_checkpoint` checks)."""
    ck = tune_dir / f"checkpoint_{index:06d}"
    ck.mkdir(parents=True)
    (ck / "learner.pt").write_bytes(dump_blob({"steps_done": step + 1}))
    (ck / store.METRICS_FILE).write_text("".join(json.dumps({"step": s}) + "\n" for s in range(step + 1)))
    (ck / store.STATE_FILE).write_text(json.dumps({"step": step, "adapter_version": step + 1, "config": config}))
    store.seal_checkpoint(ck)
    return ck


@pytest.fixture
def campaign(tmp_path) -> dict:
    """A 2-condition campaign that ran: A checkpointed steps 0 and 1, B step 0 only."""
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({"name": "c", "storage": str(tmp_path / "store"), "seeds": [0], "base": BASE,
                                    "conditions": {"A": {}, "B": {"credit": {"advantage_mode": "maxrl"}}}}))
    c = load_campaign(path)
    Path(c.directory).mkdir(parents=True)
    (Path(c.directory) / store.CAMPAIGN_FILE).write_text("{}")
    cks = {}
    for t, steps in zip(c.trials, ([0, 1], [0]), strict=True):
        for i, s in enumerate(steps):
            cks[(t.name, s)] = _checkpoint(Path(c.directory) / t.name, i, s, t.trial.model_dump(mode="json"))
    return {"path": str(path), "campaign": c, "checkpoints": cks}


def refused(capsys, *argv) -> str:
    assert main(["eval", *map(str, argv)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    return err


def test_last_is_the_newest_step_every_trial_has_and_sets_default_to_the_task_and_eval_sets(campaign):
    plans = plan_eval(campaign["campaign"], campaign["campaign"].directory, EvalRequest())
    assert [(p.trial, p.step) for p in plans] == [("A_s0", 0), ("B_s0", 0)]
    assert [[None if s is None else s.name for s in p.sets] for p in plans] == [[None, "small"]] * 2
    assert (plans[0].ev.n, plans[0].ev.k, plans[1].cfg.credit.advantage_mode) == (4, 2, "maxrl")
    plans = plan_eval(campaign["campaign"], campaign["campaign"].directory,
                      EvalRequest(sets=("small", "default"), n=8, k=8, temperature=0.5))
    assert [s.name if s else None for s in plans[0].sets] == ["small", None]
    assert (plans[0].ev.n, plans[0].ev.k, plans[0].ev.temperature) == (8, 8, 0.5)


def test_a_set_spec_is_a_dataset_file_a_plugin_or_a_task_table(tmp_path):
    name, s = parse_set(f"gsm={tmp_path / 'test.parquet'}")
    assert (name, s.task.name, s.task.path, s.task.heldout_path) == ("gsm", "dataset", str(tmp_path / "test.parquet"),
                                                                     str(tmp_path / "test.parquet"))
    _, s = parse_set("ar={name: arithmetic, max_operand: 3}")
    assert (s.task.name, s.task.max_operand) == ("arithmetic", 3)
    assert parse_set("small") == ("small", None)
    assert parse_step("last") is None and parse_step("3") == 3
    with pytest.raises(ValueError, match="no module named|cannot import|not found|No module"):
        parse_set("p=nowhere_such_module:Task")


@pytest.mark.parametrize(("argv", "says"), [
    (["--step", "5"], "no checkpoint of step 5; checkpoints kept: step 0"),
    (["--set", "nope"], "--set nope: trial A_s0 has no such set (its sets: default, small)"),
    (["--set", "x={name: chain, dataset: y}"], "--set x: dataset: unknown key for task 'chain'"),
    (["--set", "default=x.jsonl"], "--set default: name: 'default' names the trial's own held-out set"),
    (["--set", "missing=/nowhere/test.jsonl"], "--set missing: "),
    (["--set", "bad={name: [unclosed"], "--set bad: not a YAML table"),
    (["--k", "9"], "--n/--k/--temperature for trial A_s0 (eval n 4, k 2): k (9) must be <= n (4)"),
    (["--temperature", "0"], "--n/--k/--temperature for trial A_s0"),
    (["--engines", "0"], "--engines 0: at least 1"),
])
def test_mistakes_are_one_line_and_exit_2_before_anything_starts(campaign, capsys, argv, says):
    assert says in refused(capsys, campaign["path"], "--step", "0", *argv)


def test_last_without_a_common_step_and_a_damaged_checkpoint_are_refused(campaign, capsys):
    import shutil

    shutil.rmtree(campaign["checkpoints"][("A_s0", 0)])
    assert "--step last: no step has a checkpoint in every trial; checkpoints: A_s0: 1; B_s0: 0" in \
        refused(capsys, campaign["path"])
    ck = campaign["checkpoints"][("A_s0", 1)]
    (ck / "learner.pt").write_bytes((ck / "learner.pt").read_bytes()[:-3])
    shutil.rmtree(campaign["checkpoints"][("B_s0", 0)])
    err = refused(capsys, campaign["path"], "--step", "1")
    assert "learner.pt" in err and ("checksum" in err or "damaged" in err or "truncated" in err), err


def test_a_trial_without_any_checkpoint_is_left_out(campaign):
    import shutil

    shutil.rmtree(campaign["checkpoints"][("B_s0", 0)])
    plans = plan_eval(campaign["campaign"], campaign["campaign"].directory, EvalRequest())
    assert [(p.trial, p.step) for p in plans] == [("A_s0", 1)]


def test_a_bad_step_is_an_argument_error(campaign, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["eval", campaign["path"], "--step", "soon"])
    assert exc.value.code == 2 and "a checkpoint's step (0, 1, ...) or 'last'" in capsys.readouterr().err


def test_a_campaign_that_has_not_run_is_refused(tmp_path, capsys):
    path = tmp_path / "never.yaml"
    path.write_text(yaml.safe_dump({"name": "never", "storage": str(tmp_path / "s"), "seeds": [0], "base": BASE,
                                    "conditions": {"A": {}}}))
    assert "has not run yet" in refused(capsys, path)


def test_rows_of_a_step_and_settings_are_replaced_others_kept(tmp_path):
    row = {"checkpoint_step": 1, "eval_step": 2, "policy_version": 2, "set": "default", "n": 4, "k": 2,
           "temperature": 1.0, "seed": 104_729, "problems": 4, "pass@1": 0.25, "pass@k": 0.5, "time_s": 1.5}
    write_row(str(tmp_path), row)
    write_row(str(tmp_path), {**row, "checkpoint_step": 0, "eval_step": 1, "pass@1": 0.0})
    write_row(str(tmp_path), {**row, "pass@1": 0.75, "src/pass@1": 1.0})  # a re-run of step 1: replaced
    rows = read_rows(store.eval_file(str(tmp_path), "default"))
    assert [(r["checkpoint_step"], r["pass@1"], r["src/pass@1"]) for r in rows] == [("0", "0.0", ""),
                                                                                      ("1", "0.75", "1.0")]
    assert list(rows[0])[:11] == ["checkpoint_step", "eval_step", "policy_version", "set", "n", "k", "temperature",
                                  "seed", "problems", "pass@1", "pass@k"]


def test_the_generations_are_kept_under_the_samples_own_cap(campaign, capsys):
    """Each set's generations go to the trial's eval/ folder until the next would take it past the trial's
    `logging.samples.max_mb`: that file is left out, said on the console and once in events.jsonl."""
    from orchestrator.evaluate.offline import generations_writer, write_generations

    (plan, _) = plan_eval(campaign["campaign"], campaign["campaign"].directory, EvalRequest())
    rows = [{"step": 1, "split": "eval", "problem": str(i), "completion": f"{i * 7919 % 1000}" * 50}
            for i in range(40)]
    size = len(store.gzip_jsonl(rows))
    plan = dataclasses.replace(plan, cfg=plan.cfg.model_copy(update={"logging": plan.cfg.logging.model_copy(
        update={"samples": plan.cfg.logging.samples.model_copy(update={"max_mb": 1.5 * size / 2**20})})}))
    writer = generations_writer(plan)
    assert write_generations(writer, plan, "default", rows) == f"{plan.trial_dir}/eval/default_checkpoint_0.jsonl.gz"
    assert write_generations(writer, plan, "default", rows)  # a re-run replaces its own file
    assert write_generations(writer, plan, "small", rows) is None and write_generations(writer, plan, "x", rows) is None
    assert capsys.readouterr().out.splitlines() == [
        f"A_s0: eval/{s}_checkpoint_0.jsonl.gz not written: it would take the folder past the trial's "
        f"logging.samples.max_mb ({plan.cfg.logging.samples.max_mb:g} MB)" for s in ("small", "x")]
    assert sorted(p.name for p in (Path(plan.trial_dir) / "eval").iterdir()) == ["default_checkpoint_0.jsonl.gz"]
    events = [json.loads(ln) for ln in (Path(plan.trial_dir) / store.EVENTS_FILE).read_text().splitlines()]
    assert [(e["event"], e["file"], e["cap_bytes"]) for e in events] == [
        ("samples_capped", "small_checkpoint_0.jsonl.gz", int(1.5 * size))]
