"""One-step-off-policy rollouts on the real stack (local Ray, Tune, a vLLM-CPU worker, the PEFT learner).

- With a policy that does not move (lr 1e-20) and C large, one_step_off trains on exactly the sync trial's data
  and logs the same rows (only the sampling adapter's version lags by one).
- Both trials run vLLM inside the rollout actor (one_step_off's CPU default, vLLM's own processes, costs ~18 CPU-s
  more a start; that both kinds sample the same tokens with the same log-probs is held by the suite's smoke run of
  benchmarks/engine_start.py, tests/integration/test_benchmarks.py).
- (A restored one_step_off trial trains on the batch prefetched before the interruption: test_agentic.py's
  Sokoban PPO resume test, which runs one step off.)
- Structure of the overlap: with a learner that sleeps a known time per step, the next step's generation runs
  inside the learner's training interval (an event-order check with a generous bound, not a timing benchmark).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import cloudpickle
import pytest
import ray

from orchestrator.config.trial import TrialConfig
from orchestrator.tune.launch import run_single_trial
from workers.learner.inputs import LearnerBatch, RunSettings, StepResult
from workers.learner.learner import Learner

pytestmark = pytest.mark.integration

BASE = dict(model={"name": "tiny"}, task={"name": "arithmetic", "max_operand": 4}, eval={"every": 0},
            rollout={"num_workers": 1, "prompts_per_step": 8, "n": 8, "max_tokens": 6})
VOLATILE = ("time/", "rollout/tokens_per_s")
ASYNC_ONLY = ("rollout/staleness", "tis/")


def _cfg(name: str, out: Path, mode: str, **over) -> TrialConfig:
    data = json.loads(json.dumps(BASE))
    data["rollout"]["mode"] = mode
    for k, v in over.items():
        data[k] = {**data[k], **v} if isinstance(v, dict) and k in data else v
    return TrialConfig(name=name, output_dir=str(out / name), **data)


def _rows(cfg: TrialConfig) -> list[dict]:
    return [json.loads(ln) for ln in (Path(cfg.output_dir) / "metrics.jsonl").read_text().splitlines()]


def _stable(row: dict) -> dict:
    return {k: v for k, v in row.items() if not k.startswith(VOLATILE)}


def test_one_step_off_equals_sync_when_the_policy_does_not_move(ray_local, tmp_path):
    still = {"optim": {"lr": 1e-20}}
    sync = _cfg("sync", tmp_path, "sync", steps=4, learner=still)
    off = _cfg("off", tmp_path, "one_step_off", steps=4, learner=still,
               rollout={**BASE["rollout"], "mode": "one_step_off", "tis_cap": 1e9, "engine": {"in_process": True}})
    assert run_single_trial(sync, tmp_path) is not None and run_single_trial(off, tmp_path) is not None
    a, b = _rows(sync), _rows(off)
    assert [r["step"] for r in b] == list(range(4))
    assert [r["rollout/staleness"] for r in b] == [0, 1, 1, 1]
    assert sum(r["train/groups_kept"] > 0 for r in a) >= 3  # the learner really stepped
    for ra, rb in zip(a, b, strict=True):
        assert set(_stable(rb)) - set(_stable(ra)) == {k for k in _stable(rb) if k.startswith(ASYNC_ONLY)}
        if "tis/weight_mean" in rb:
            assert rb["tis/weight_mean"] == pytest.approx(1.0, abs=1e-5)
        for k, v in _stable(ra).items():
            if k == "rollout/adapter_version":  # one_step_off samples with the previous step's adapter
                continue
            assert rb[k] == pytest.approx(v, rel=1e-4, abs=1e-6), (ra["step"], k)
    assert [r["rollout/adapter_version"] for r in b][1:] == [r["rollout/adapter_version"] for r in a][:-1]


class _SleepyLearner(Learner):
    """Test hook: a learner whose step takes `sleep_s` longer, reporting its own wall-clock interval."""

    def __init__(self, *args, sleep_s: float, **kw):
        super().__init__(*args, **kw)
        self.sleep_s = sleep_s

    def train_step(self, batch: LearnerBatch) -> StepResult:
        t0 = time.time()
        time.sleep(self.sleep_s)
        out = super().train_step(batch)
        out.metrics["test/train_interval"] = (t0, time.time())
        return out


def test_generation_overlaps_training(ray_local, tiny_model_dir, tmp_path):
    from orchestrator.config.trial import sepa_settings
    from orchestrator.trial.actors.context import TrialContext
    from orchestrator.trial.actors.learner_group import LearnerGroup
    from orchestrator.trial.actors.start import shutdown_actors
    from orchestrator.trial.step.sequence import TrainingStep
    from orchestrator.trial.step.trial_source import trial_source
    from workers.credit import SepaController
    from workers.models.loading import load_tokenizer
    from workers.rollout.worker import RolloutActor, RolloutWorkerSettings
    from workers.tasks import make_task

    cfg = _cfg("overlap", tmp_path, "one_step_off", steps=3)
    sleep_s = 3.0
    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    worker = RolloutActor.options(num_cpus=1).remote(
        tiny_model_dir, RolloutWorkerSettings(seed=0, max_model_len=cfg.model.max_model_len))
    learner = ray.remote(_SleepyLearner).options(num_cpus=1).remote(
        tiny_model_dir, learner=cfg.learner, credit=cfg.credit, run=RunSettings(seed=0, total_steps=cfg.steps),
        sleep_s=sleep_s)
    group = LearnerGroup([learner], full=False, started=True)
    try:
        ray.get([worker.ready.remote(), learner.ready.remote()])
        task = make_task(cfg.task, cfg.seed)
        ctx = TrialContext(cfg, [worker], group, load_tokenizer(tiny_model_dir), task, None)
        pipe = TrainingStep(ctx, trial_source(ctx), overlap=True)
        sepa, version, checked = SepaController(sepa_settings(cfg)), 0, 0
        for step in range(cfg.steps):
            outcome = pipe.run(step, sepa, version)
            row, version = outcome.row, outcome.version
            if step + 1 < cfg.steps and "test/train_interval" in row:
                s0, s1 = row["test/train_interval"]
                p0, p1 = pipe.timeline[-1]["prefetch"]
                overlap = max(0.0, min(p1, s1) - max(p0, s0))
                # the next step's generation started after the learner did and ran inside its step
                assert p0 < s1 and s0 < p1, (s0, s1, p0, p1)
                assert overlap / (p1 - p0) > 0.5, (s0, s1, p0, p1)
                # so the driver waited for the learner less than the learner's step took
                assert row["time/learner_wait_s"] < row["time/train_s"] - 0.5 * (p1 - p0)
                checked += 1
        assert checked >= 1
    finally:
        shutdown_actors([worker], group)
