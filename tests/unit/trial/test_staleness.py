"""The staleness schedule of `TrainingStep` (orchestrator/trial/step/sequence.py, staleness.py) with fakes for the
engines, the learner and the source (the real stack: tests/integration/trial/test_async.py): which steps' batches
are sampled with which policy, what is trained, dropped and logged, and the queue through a checkpoint."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.config.trial import TrialConfig
from orchestrator.trial.actors.context import TrialContext
from orchestrator.trial.collect.rollouts import Rollouts
from orchestrator.trial.step.prefetch import load_queue
from orchestrator.trial.step.sequence import TrainingStep
from workers.credit import SepaController
from workers.credit.config import SepaConfig
from workers.learner.inputs import StepResult


class FakeEngines:
    """The engines a TrainingStep drives: one worker, the version it holds (shared with test_completion.py)."""

    count, initial_versions = 1, (None, 0)

    def __init__(self):
        self.version = 0

    def load_policy(self, version: int) -> int:
        self.version = version
        return version


class FakeLearner:
    """A learner that keeps the batches it was given and trains nothing."""

    def __init__(self):
        self.batches = []

    def submit_train_step(self, batch):
        self.batches.append(batch)
        return batch

    def result(self, future) -> StepResult:
        return StepResult(metrics={"loss/policy": 0.0}, exec_values=None)

    def export_policy(self, version: int) -> int:
        return version


class _Source:
    """Two informative groups per step, sampled with the engines' version; records (step, version) per collect."""

    def __init__(self, engines: FakeEngines, groups: int = 2, uniform: frozenset[int] = frozenset()):
        self.engines, self.groups, self.calls, self.uniform = engines, groups, [], uniform

    def collect(self, step: int) -> Rollouts:
        self.calls.append((step, self.engines.version))
        n = self.groups
        return Rollouts(prompt_ids=[[[1]] * 2] * n, response_ids=[[[2, 3]] * 2] * n,
                        loss_mask=[[[True, True]] * 2] * n, logprobs=[[[-0.5, -0.5]] * 2] * n,
                        rewards=[[1.0, 1.0 if step in self.uniform else 0.0]] * n,  # uniform: nothing trains
                        correct=[[True, step in self.uniform]] * n, num_tokens=4 * n,
                        versions={self.engines.version or None} if self.engines.version == 0 else
                        {self.engines.version}, metrics={"time/generate_s": 0.0})


def _run(rollout: dict, steps: int = 7, stop_at: int | None = None, pending=None, uniform=frozenset()):
    cfg = TrialConfig(steps=steps, model={"name": "tiny"}, task={"name": "arithmetic"}, rollout=rollout)
    engines, learner = FakeEngines(), FakeLearner()
    source = _Source(engines, uniform=uniform)
    ctx = TrialContext(cfg, [], learner, None, None, None, engines=engines)
    pipe = TrainingStep.for_trial(ctx, source, pending)
    sepa, version, rows = SepaController(SepaConfig(steps=0)), engines.version, []
    for step in range(steps if stop_at is None else stop_at):
        out = pipe.run(step, sepa, version)
        rows.append(out.row)
        version = out.version
    return rows, source.calls, learner.batches, pipe


def _trained_staleness(rows):
    """Each step's staleness derived from the rows alone: the learner's version when it trains step s is the
    number of earlier steps that trained; minus the oldest version its batch was sampled with."""
    out, trained = [], 0
    for r in rows:
        out.append(trained - r["async/version_oldest"])
        trained += r["train/groups_kept"] > 0
    return out


def test_paced_k2_samples_two_steps_ahead_and_drops_nothing():
    rows, calls, batches, _ = _run({"mode": "async", "max_staleness": 2})
    assert calls == [(0, 0), (1, 0), (2, 0), (3, 1), (4, 2), (5, 3), (6, 4)]
    assert [r["rollout/staleness"] for r in rows] == [0, 1, 2, 2, 2, 2, 2] == _trained_staleness(rows)
    assert all(r["async/groups_dropped"] == 0 and r["train/groups_kept"] == 2 for r in rows)
    assert [r["async/groups_delayed"] for r in rows] == [0, 2, 2, 2, 2, 2, 2]
    assert rows[3]["async/staleness_tokens_2"] == 8 and rows[3]["async/staleness_tokens_0"] == 0
    assert rows[3]["async/staleness_mean"] == 2 and rows[3]["async/staleness_max"] == 2
    assert batches[3].offpolicy.correction == "tis" and batches[3].offpolicy.log_mismatch


def test_discard_k1_samples_one_further_and_drops_past_the_bound():
    rows, calls, batches, _ = _run({"mode": "async", "max_staleness": 1, "admission": "discard"})
    stale = _trained_staleness(rows)
    assert stale == [r["rollout/staleness"] for r in rows]
    for r, s in zip(rows, stale, strict=True):
        assert r["async/groups_dropped"] == (r["async/groups_offered"] if s > 1 else 0), (r, s)
        assert r["train/groups_kept"] == (0 if s > 1 else 2)
    assert sum(r["async/groups_dropped"] for r in rows) > 0
    assert len(batches) == sum(r["train/groups_kept"] > 0 for r in rows)  # a step with nothing left skips
    assert calls[:3] == [(0, 0), (1, 0), (2, 0)]  # the generator ran two ahead without waiting


def test_k0_is_sync_and_k1_is_one_step_off():
    sync, sync_calls, sync_batches, _ = _run({"mode": "sync"})
    k0, k0_calls, k0_batches, _ = _run({"mode": "async", "max_staleness": 0})
    assert sync_calls == k0_calls == [(s, s) for s in range(7)]
    extra = {"rollout/staleness"} | {k for k in k0[0] if k.startswith("async/")}
    for a, b in zip(sync, k0, strict=True):
        assert set(b) - set(a) <= extra and {k: v for k, v in b.items() if not k.startswith("time/")
                                             and k in a} == {k: v for k, v in a.items() if not k.startswith("time/")}
    off, off_calls, off_batches, _ = _run({"mode": "one_step_off"})
    k1, k1_calls, k1_batches, _ = _run({"mode": "async", "max_staleness": 1, "correction": "tis"})
    assert off_calls == k1_calls == [(0, 0)] + [(s, s - 1) for s in range(1, 7)]
    assert [b.offpolicy.correction for b in off_batches + k1_batches] == ["tis"] * 14
    assert all(not k.startswith("async/") for r in off + sync for k in r)  # their rows are as before


@pytest.mark.parametrize("k", [1, 3])
def test_the_queue_survives_a_checkpoint(tmp_path, k):
    full, full_calls, _, _ = _run({"mode": "async", "max_staleness": k})
    _, _, _, pipe = _run({"mode": "async", "max_staleness": k}, stop_at=3)
    pipe.save(tmp_path)
    queue = load_queue(tmp_path)
    assert len(queue) == k and [v for _, v in queue] == [v for s, v in full_calls[3:3 + k]]
    assert all(r.policy_versions == [[v, v]] * 2 for r, v in queue)


def test_the_metric_list_names_every_async_key():
    """orchestrator/tracking/names.py lists what the step and the off-policy math write under async."""
    import torch

    from orchestrator.tracking.names import logged_metrics
    from orchestrator.trial.step.staleness import offpolicy_settings
    from workers.objectives.offpolicy import offpolicy_weights

    rollout = {"mode": "async", "max_staleness": 1, "admission": "discard", "correction": "decoupled",
               "rejection": {"measure": "k2", "threshold": 0.5}}
    rows, _, _, _ = _run(rollout)
    cfg = TrialConfig(steps=7, model={"name": "tiny"}, task={"name": "arithmetic"}, rollout=rollout)
    lp = torch.zeros(2, 3)
    _, learner = offpolicy_weights(lp, lp - 0.1, torch.ones(2, 3, dtype=torch.bool), offpolicy_settings(cfg.rollout))
    produced = {k for r in rows for k in r if k != "loss/policy"} | set(learner) - {"step"}
    assert {"async/groups_dropped", "decoupled/masked_frac", "mismatch/rejected_frac", "mismatch/k3"} <= produced
    assert produced - {"step"} <= logged_metrics(cfg), produced - logged_metrics(cfg)


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 3), st.booleans(), st.sets(st.integers(0, 8)))
def test_no_trained_group_is_ever_past_the_bound(k, discard, uniform):
    """Any k, either admission, any steps whose groups are all uninformative (no update, no new version): every
    trained step's staleness (derived from the rows alone) is in [0, k]; paced drops nothing; discard drops exactly
    the offered groups past k; the histogram counts every trained token."""
    rollout = {"mode": "async", "max_staleness": k, "admission": "discard" if discard else "paced"}
    rows, _, batches, _ = _run(rollout, steps=9, uniform=frozenset(uniform))
    stale = _trained_staleness(rows)
    assert stale == [r["rollout/staleness"] for r in rows]
    for r, s in zip(rows, stale, strict=True):
        assert s >= 0
        assert r["async/groups_dropped"] == (r["async/groups_offered"] if discard and s > k else 0)
        if r["train/groups_kept"]:
            assert s <= k and sum(r[f"async/staleness_tokens_{j}"] for j in range(k + 1)) == r["train/tokens_trained"]
    assert len(batches) == sum(r["train/groups_kept"] > 0 for r in rows)


@pytest.mark.parametrize("k", [0, 1, 2, 4])
def test_discard_drops_one_batch_in_k_plus_two_at_steady_state(k):
    """docs/guides/staleness.md's claim: the batch sampled k + 1 ahead lands past k and is dropped; the step that
    trains nothing lets the next k + 1 batches through."""
    rows, _, _, _ = _run({"mode": "async", "max_staleness": k, "admission": "discard"}, steps=3 * (k + 2) + 1)
    dropped = [s for s, r in enumerate(rows) if r["async/groups_dropped"]]
    assert dropped == [k + 1 + j * (k + 2) for j in range(3)]


@pytest.mark.parametrize("admission", ["paced", "discard"])
def test_an_in_process_rewind_restores_the_queue_as_a_retry_would(tmp_path, monkeypatch, admission):
    """A pool learner's restart (orchestrator/trial/loop.py: `_rewind` on `LearnerRestarted`) takes the newest
    checkpoint in process, the batches sampled ahead of it included: the steps after it sample and train exactly
    what the uninterrupted trial did (the checkpoint's queue, not batches regenerated with a later policy)."""
    from types import SimpleNamespace

    from orchestrator.trial import loop
    from orchestrator.trial.actors.ports import LearnerRestarted

    rollout = {"mode": "async", "max_staleness": 2, "admission": admission}
    full, full_calls, full_batches, _ = _run(rollout)
    _, _, _, pipe = _run(rollout, stop_at=3)  # the checkpoint after step 2
    ck = tmp_path / "checkpoint"
    ck.mkdir()
    pipe.save(ck)
    restored = SimpleNamespace(state={"step": 2, "adapter_version": sum(r["train/groups_kept"] > 0 for r in full[:3])},
                               learner=b"", rows=full[:3], checkpoint=SimpleNamespace(as_directory=lambda: _Dir(ck)))
    storage = SimpleNamespace(storage_filesystem=None, trial_fs_path=str(tmp_path))
    monkeypatch.setattr(loop.tune, "get_context", lambda: SimpleNamespace(get_storage=lambda: storage))
    monkeypatch.setattr(loop.tune, "get_checkpoint", lambda: object())
    monkeypatch.setattr(loop, "restore_checkpoint", lambda *a, **k: restored)
    cfg = TrialConfig(steps=7, model={"name": "tiny"}, task={"name": "arithmetic"}, rollout=rollout,
                      output_dir=str(tmp_path / "out"))
    resume = loop._rewind(cfg, cfg.output_dir, LearnerRestarted("the pool's learner restarted"))
    assert resume.rewound and resume.start == 3
    assert [v for _, v in resume.pending] == [v for _, v in load_queue(ck)] and len(resume.pending) >= 2

    engines, learner = FakeEngines(), FakeLearner()
    engines.version = resume.version  # the checkpoint's policy back on the engines (`_restore_actors`)
    source = _Source(engines)
    ctx = TrialContext(cfg, [], learner, None, None, None, engines=engines)
    step_ = TrainingStep.for_trial(ctx, source, resume.pending)
    sepa, version, rows = SepaController(SepaConfig(steps=0)), resume.version, []
    for step in range(resume.start, 7):
        out = step_.run(step, sepa, version)
        rows.append(out.row)
        version = out.version
    stable = [{k: v for k, v in r.items() if not k.startswith("time/")} for r in full[3:]]
    assert [{k: v for k, v in r.items() if not k.startswith("time/")} for r in rows] == stable
    assert source.calls == [c for c in full_calls if c[0] >= 3 + len(resume.pending)]
    assert [b.step for b in learner.batches] == [b.step for b in full_batches if b.step >= 3]


class _Dir:
    def __init__(self, path):
        self.path = path

    def __enter__(self):
        return str(self.path)

    def __exit__(self, *exc):
        return False
