"""Samples on the real stack: a demo-sized trial (tiny reasoner, chain task, 2 steps, a held-out evaluation at
both) writes its training samples every step and every evaluation's generations, with the learner's advantages,
within the cap, and its offline W&B run holds the same rows as tables; `export` of its last checkpoint gives the
learner's policy as a PEFT adapter."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from orchestrator.config.trial import TrialConfig
from orchestrator.trial.artifacts.samples import ROW_KEYS, read_samples
from orchestrator.tune.launch import run_single_trial
from tests.integration.trial.test_trial import rows

pytestmark = pytest.mark.integration

DEMO = dict(steps=2, seed=1, model={"name": "tiny-reasoner"}, task={"name": "chain"}, checkpoint={"every": 1},
            rollout={"num_workers": 1, "prompts_per_step": 4, "n": 4, "max_tokens": 48},
            eval={"every": 1, "problems": 3, "n": 2, "k": 2}, logging={"samples": {"per_step": 2, "max_mb": 1}},
            resources={"worker_cpus": 0.5, "learner_cpus": 0.5, "driver_cpus": 0.25})


@pytest.fixture(scope="module")
def demo(ray_local, reasoner_dir, tmp_path_factory) -> dict:
    storage = tmp_path_factory.mktemp("samples")
    cfg = TrialConfig(name="demo", output_dir=str(storage / "out"), **DEMO,
                      wandb={"mode": "offline", "dir": str(storage / "wandb"), "run_id": "demo-samples"})
    assert run_single_trial(cfg, storage) is not None
    return {"cfg": cfg, "out": Path(cfg.output_dir), "rows": rows(cfg.output_dir), "storage": storage}


def test_every_step_and_every_evaluation_writes_its_samples(demo):
    out, metrics = demo["out"], demo["rows"]
    assert sorted(p.name for p in (out / "samples").iterdir()) == [
        "eval_step_0.jsonl.gz", "eval_step_1.jsonl.gz", "step_0.jsonl.gz", "step_1.jsonl.gz"]
    for step, row in enumerate(metrics):
        train = read_samples(str(out), step)
        assert [tuple(r) for r in train] == [ROW_KEYS] * 8  # 2 groups x 4 completions
        assert {r["group"] for r in train} == {0, 1} and {r["step"] for r in train} == {step}
        assert {r["adapter_version"] for r in train} == {row["rollout/adapter_version"]}
        for r in train:
            assert r["prompt"] and 0 < r["length"] <= 48 and r["completion"]
            assert r["correct"] == (r["reward"] > 0.5)
            assert all(0 <= s < e <= len(r["completion"]) for s, e in r["planning_spans"])
            if r["trained"]:  # the learner's advantages: GRPO's group-relative reward (mean 0 over the group)
                assert r["episode_advantage"] is not None and r["token_advantage"] is not None
            else:
                assert r["episode_advantage"] is None
        for g in (0, 1):
            group = [r for r in train if r["group"] == g]
            if group[0]["trained"]:
                assert abs(sum(r["episode_advantage"] for r in group)) < 1e-5
                better = max(group, key=lambda r: r["reward"])
                worse = min(group, key=lambda r: r["reward"])
                assert better["episode_advantage"] > 0 > worse["episode_advantage"]
        held_out = read_samples(str(out), step, "eval")
        assert len(held_out) == 3 * 2 and {r["split"] for r in held_out} == {"eval"}
        assert sum(r["correct"] for r in held_out) / 6 == pytest.approx(row["eval/pass@1"])
        assert {r["adapter_version"] for r in held_out} == {row["rollout/adapter_version"]}
    # the same held-out problems at both evaluations (what `samples --problem` compares across conditions)
    assert [r["problem"] for r in read_samples(str(out), 0, "eval")] == \
        [r["problem"] for r in read_samples(str(out), 1, "eval")]
    assert sum(p.stat().st_size for p in (out / "samples").iterdir()) <= 2**20


def test_offline_wandb_run_holds_the_samples_tables(demo):
    tables = sorted((demo["storage"] / "wandb").rglob("*.table.json"))
    names = sorted(p.name.split("_")[0] for p in tables)
    assert names == ["eval", "eval", "train", "train"], tables
    train = json.loads(next(p for p in tables if p.name.startswith("train")).read_text())
    assert train["columns"] == list(ROW_KEYS) and len(train["data"]) == 8


def test_lora_export_of_the_trial_equals_the_learner_at_its_last_step(demo, tmp_path, capsys):
    """`export <trial dir>`: the PEFT adapter of the trial's last checkpoint, loaded by PeftModel, gives the
    log-probs of the learner restored from that checkpoint on the trial's held-out prompts."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from orchestrator.actors.models import resolve_model
    from orchestrator.cli import main
    from orchestrator.storage import filesystem
    from orchestrator.trial.artifacts.restore import verified_checkpoint
    from tests.integration.trial.test_full_mode import heldout_logprobs
    from workers.learner.inputs import RunSettings
    from workers.learner.learner import Learner

    cfg, out = demo["cfg"], tmp_path / "adapter"
    assert main(["export", str(demo["storage"] / "demo"), "--out", str(out)]) == 0, capsys.readouterr().err
    manifest = json.loads((out / "export_manifest.json").read_text())
    assert (manifest["step"], manifest["kind"], manifest["base_model"]) == (1, "adapter", "tiny-reasoner")
    _, files, _ = verified_checkpoint(*filesystem(str(demo["storage"] / "demo" / "demo")))
    learner = Learner(resolve_model(cfg.model), learner=cfg.learner, credit=cfg.credit,
                      run=RunSettings(seed=cfg.seed, total_steps=cfg.steps), interventions=cfg.interventions)
    learner.restore({"learner.pt": files["learner.pt"]}, "ck")
    want = heldout_logprobs(learner.model, cfg, learner.tokenizer)
    base = AutoModelForCausalLM.from_pretrained(resolve_model(cfg.model), dtype=torch.float32)
    got = heldout_logprobs(PeftModel.from_pretrained(base, str(out)), cfg, learner.tokenizer)
    assert (got - want).abs().max() < 1e-5


def test_the_exported_model_card_reads_back_the_trial_and_its_held_out_metrics(demo, tmp_path, capsys):
    """`export --step 0`: the card's front matter names the trial and step, and its held-out numbers are those the
    in-training evaluation of step 1 measured (that very policy); the last checkpoint's card has none."""
    from orchestrator.cli import main
    from orchestrator.trial.model_card import CARD_KEY, read_card

    for step, out in ((0, tmp_path / "step0"), (1, tmp_path / "step1")):
        assert main(["export", str(demo["storage"] / "demo"), "--out", str(out), "--step", str(step)]) == 0, \
            capsys.readouterr().err
    facts = read_card(tmp_path / "step0" / "README.md")[CARD_KEY]
    assert (facts["trial"], facts["step"], facts["kind"], facts["base_model"]) == ("demo", 0, "adapter",
                                                                                   "tiny-reasoner")
    row = demo["rows"][1]
    assert facts["heldout"] == {"training (evaluation of step 1)": {
        k: v for k, v in row.items() if k.startswith("eval/") and isinstance(v, int | float)}}
    assert facts["heldout"]["training (evaluation of step 1)"]["eval/pass@1"] == row["eval/pass@1"]
    assert read_card(tmp_path / "step1" / "README.md")[CARD_KEY]["heldout"] == {}
