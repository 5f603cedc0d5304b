"""A colocated trial on logical GPUs (vLLM-CPU, so sleep and wake are recorded no-ops): it asks for one GPU where
the separate trial asks for two, each engine sits on its learner rank's GPU, its metrics equal the separate
trial's step for step, and its events show every step's phases in order. The same run offloads the learner's
optimizer state between steps (learner.offload_between_steps: on CPU the same code path with no-op copies), and
its learner rank is SIGKILLed mid-run (pid from placement.json) once the first checkpoint is sealed: Tune's retry
resumes from that checkpoint and the metrics still equal the separate, uninterrupted, non-offloading trial's."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

from orchestrator.config.placement import trial_gpus
from orchestrator.config.trial import TrialConfig
from orchestrator.tune.launch import run_single_trial

VOLATILE = ("time/", "rollout/tokens_per_s")
PHASES = ["generated", "asleep", "trained", "weights_awake", "synced", "awake"]
OFFLOADED = "memory/offloaded_bytes"  # only the colocated trial offloads


def _rows(out: str) -> list[dict]:
    return [{k: v for k, v in json.loads(ln).items() if not k.startswith(VOLATILE)}
            for ln in (Path(out) / "metrics.jsonl").read_text().splitlines()]


def _jsonl(path: Path) -> list[dict]:
    try:
        return [json.loads(ln) for ln in path.read_text().splitlines() if ln.strip()]
    except (FileNotFoundError, json.JSONDecodeError):
        return []


def _kill_learner_after_first_checkpoint(out: Path, storage: Path, done: list, errors: list) -> None:
    """SIGKILL the learner rank of the first attempt (its pid in placement.json) as soon as a checkpoint is
    sealed under `storage` (the driver is then in the next step)."""
    try:
        deadline = time.time() + 600
        while not list(storage.glob("**/checkpoint_*/manifest.json")):
            if time.time() > deadline:
                raise TimeoutError("no checkpoint was sealed")
            time.sleep(0.05)
        pid = json.loads((out / "placement.json").read_text())["learner"]["pid"]
        os.kill(pid, signal.SIGKILL)
        done.append(pid)
    except BaseException as exc:  # surfaced by the test thread
        errors.append(exc)


def test_colocated_trial_matches_separate(ray_local, reasoner_dir, tmp_path):
    base = dict(steps=2, seed=5, model={"name": "tiny-reasoner"}, task={"name": "chain"},
                rollout={"num_workers": 1, "prompts_per_step": 4, "n": 4, "max_tokens": 48},
                eval={"every": 1, "problems": 2, "n": 2, "k": 1}, checkpoint={"every": 1})
    res = {"worker_cpus": 0.5, "learner_cpus": 0.5, "learner_gpus": 1}
    separate = TrialConfig(name="separate", output_dir=str(tmp_path / "separate"),
                           resources={**res, "worker_gpus": 1}, **base)
    colocated = TrialConfig(name="colocated", output_dir=str(tmp_path / "colocated" / "out"),
                            resources={**res, "placement": "colocated"}, learner={"offload_between_steps": True},
                            **base)
    assert (trial_gpus(separate), trial_gpus(colocated)) == (2, 1)  # N + 1 against N, N = 1 learner rank
    assert run_single_trial(separate, tmp_path) is not None
    done, errors = [], []
    injector = threading.Thread(target=_kill_learner_after_first_checkpoint, daemon=True,
                                args=(Path(colocated.output_dir), tmp_path / "colocated", done, errors))
    injector.start()
    assert run_single_trial(colocated, tmp_path, max_failures=1) is not None
    injector.join(timeout=5)
    assert not errors and len(done) == 1, (errors, done)

    out = Path(colocated.output_dir)
    events = _jsonl(out / "events.jsonl")
    assert [e["from_step"] for e in events if e["event"] == "start"] == [0, 1]  # resumed from step 0's checkpoint

    where = json.loads((out / "placement.json").read_text())
    assert where["learner"]["pid"] != done[0]  # the retry's learner rank
    assert where["placement"] == "colocated"
    assert [w["gpu_ids"] for w in where["workers"]] == [r["gpu_ids"] for r in where["learner_ranks"]]
    assert len(where["workers"][0]["gpu_ids"]) == 1
    apart = json.loads((tmp_path / "separate" / "placement.json").read_text())
    assert apart["workers"][0]["gpu_ids"] != apart["learner"]["gpu_ids"]

    a, b = _rows(separate.output_dir), _rows(colocated.output_dir)
    assert [r["step"] for r in b] == [0, 1] and "eval/pass@1" in json.dumps(b)
    trained = [r["step"] for r in b if r["train/groups_kept"] > 0]
    assert trained, "no step trained: the phases and the offload were never exercised"
    assert all(r.pop(OFFLOADED) > 0 for r in b if r["step"] in trained) and not any(OFFLOADED in r for r in b)
    # same seed, same trajectory: only where the engine sits changed, the optimizer state moved, and the
    # learner died once
    assert a == b

    attempts: list[list[dict]] = []  # each attempt's events, from its start on
    for e in events:
        if e["event"] == "start":
            attempts.append([])
        attempts[-1].append(e)
    for step in trained:  # generate ends before training begins; the engines wake before the sync
        runs = [[e for e in att if e["event"] == "phase" and e["step"] == step] for att in attempts]
        runs = [r for r in runs if r]
        assert [e["phase"] for e in runs[-1]] == PHASES  # the attempt that finished the step
        assert all([e["phase"] for e in r] == PHASES[:len(r)] for r in runs[:-1])  # one the kill cut short
        assert [e["time"] for e in runs[-1]] == sorted(e["time"] for e in runs[-1])
    assert not [e for e in events if e["event"] == "phase" and e["step"] not in trained]
    assert not [e for e in (tmp_path / "separate" / "events.jsonl").read_text().splitlines() if '"phase"' in e]
