"""One campaign run through `python -m orchestrator run` on the session's local Ray (joined through `RAY_ADDRESS`,
as a user's `run` joins a running cluster; its worker processes never had the plugin directories on their path),
three trials of 2 steps:
- the two plugin examples, each from its own directory outside the package: the single-turn countdown task and
  the multi-turn guess_number environment reach the trial's processes through the campaign's `plugins.paths`;
  guess_number plays in a mixed task (`task: {mix: ...}`) beside the built-in single-turn chain task: every
  step's batch holds the asked groups of each (read back from the samples files) and logs per-task metrics;
- a verl-format Parquet file written here (chat prompts, reward_model.ground_truth, two data sources), graded by
  math-verify, logging per-source train and eval metrics."""

from __future__ import annotations

import gzip
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

from tests.unit.tasks.test_dataset_task import VERL_ROWS, write_verl_parquet

ROOT = Path(__file__).resolve().parents[3]


def test_plugin_examples_train_from_their_own_directories(ray_local, tmp_path):
    for name in ("countdown", "guess_number"):
        shutil.copytree(ROOT / "examples" / name, tmp_path / name)
    conditions = {}
    for name in ("countdown", "guess_number"):
        base = yaml.safe_load((tmp_path / name / "campaign.yaml").read_text())["base"]
        base.update(steps=2, eval={"every": 1, "problems": 2, "n": 2, "k": 2})
        base["rollout"].update(prompts_per_step=2, n=2, max_tokens=8)
        base["model"]["max_model_len"] = 512
        conditions[name] = base
    guess = conditions.pop("guess_number")  # the example's campaign, its task one member of a mix with chain
    guess["task"] = {"mix": [{"task": {"name": "chain"}, "groups": 1}, {"task": guess["task"], "groups": 2}]}
    del guess["rollout"]["prompts_per_step"]  # a mix's is the sum of its groups
    guess["logging"] = {"samples": {"per_step": 3}}
    conditions["mix"] = guess
    write_verl_parquet(tmp_path / "train.parquet")
    write_verl_parquet(tmp_path / "test.parquet", [VERL_ROWS[0], VERL_ROWS[-1]])  # one problem of each source
    conditions["verl"] = {"steps": 2, "model": {"name": "tiny-qwen2-instruct", "max_model_len": 256},
                          "task": {"name": "dataset", "path": str(tmp_path / "train.parquet"),
                                   "heldout_path": str(tmp_path / "test.parquet")},
                          "rollout": {"prompts_per_step": 4, "n": 2, "max_tokens": 8},
                          "eval": {"every": 1, "problems": 2, "n": 2, "k": 2}}
    campaign = {"name": "examples", "seeds": [0], "conditions": conditions,
                "plugins": {"paths": ["countdown", "guess_number"]},
                "resources": {"rollout_workers": 1, "worker_cpus": 1, "learner_cpus": 1, "driver_cpus": 0.5},
                "max_concurrent_trials": 1, "max_failures": 0, "storage": "results", "wandb": {"mode": "disabled"}}
    (tmp_path / "campaign.yaml").write_text(yaml.safe_dump(campaign))
    env = {**os.environ, "RAY_ADDRESS": ray_local.get_runtime_context().gcs_address}
    env["PYTHONPATH"] = str(ROOT)  # the package; the plugins come only from plugins.paths
    proc = subprocess.run([sys.executable, "-m", "orchestrator", "run", "campaign.yaml"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, errors="replace", timeout=1200)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    for name in conditions:
        rows = [json.loads(line) for line in
                (tmp_path / "results" / "examples" / "trials" / f"{name}_s0" / "metrics.jsonl").read_text().split("\n")
                if line]
        assert [r["step"] for r in rows] == [0, 1], name
        assert all(0.0 <= r["train/correct_rate"] <= 1.0 and "eval/pass@1" in r for r in rows), name
    mix_dir = tmp_path / "results" / "examples" / "trials" / "mix_s0"
    mixed = [json.loads(line) for line in (mix_dir / "metrics.jsonl").read_text().split("\n") if line]
    per_task = ("train/chain/correct_rate", "train/GuessNumber/correct_rate", "env/GuessNumber/success",
                "eval/chain/pass@1", "eval/GuessNumber/pass@1", "env/success")
    for r in mixed:
        assert r["train/groups_sampled"] == 3 and all(k in r for k in per_task), sorted(r)
    for step in (0, 1):  # the batch in the mix's order: 1 group of chain, then 2 levels of guess_number
        with gzip.open(mix_dir / "samples" / f"step_{step}.jsonl.gz", "rt") as f:
            problems = {r["group"]: r["problem"] for r in map(json.loads, f)}
        assert [problems[g].split("/")[0] for g in sorted(problems)] == ["chain", "GuessNumber", "GuessNumber"]
    verl = [json.loads(line) for line in (tmp_path / "results" / "examples" / "trials" / "verl_s0" /
                                           "metrics.jsonl").read_text().split("\n") if line]
    sources = ("openai_gsm8k", "lighteval_MATH")
    for r in verl:
        assert all(f"eval/{s}/pass@1" in r for s in sources), sorted(r)
        assert any(f"train/{s}/correct_rate" in r for s in sources), sorted(r)
