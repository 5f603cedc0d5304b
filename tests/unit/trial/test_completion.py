"""Groups admitted as they complete (`rollout.decode_per_step`, orchestrator/trial/step/completion.py), driven
through the real `TrainingStep` with fakes for the engines, the learner and the members of a mix (the real
`MixedSource` labels them); the real stack: tests/integration/trial/test_async.py's clock condition.

The bias test: a mix built for it, `short` problems (completions of 1-8 tokens, 70% correct) and `long` ones
(8-24 tokens, 30% correct: harder problems take longer completions), 4 groups of each per step. Under `discard`
the long groups complete later, land past the bound more often and are dropped: the trained batch holds fewer long
(and fewer hard) groups than the offered one. `paced` waits for the oldest batch and trains what was offered."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from orchestrator.config.trial import TrialConfig
from orchestrator.trial.actors.context import TrialContext
from orchestrator.trial.collect.mixed import MixedSource
from orchestrator.trial.collect.rollouts import Rollouts
from orchestrator.trial.step.completion import CompletionQueue, load_inflight, ready_steps
from orchestrator.trial.step.sequence import TrainingStep
from tests.unit.trial.test_staleness import FakeEngines, FakeLearner
from workers.credit import SepaController
from workers.credit.config import SepaConfig

N = 4  # samples per group


class _Member:
    """`groups` groups a step of completions `lengths` tokens long (uniform, inclusive), each sample correct with
    probability `p`; a pure function of (seed, salt, step), so every arm is offered the same groups."""

    def __init__(self, engines: FakeEngines, groups: int, lengths: tuple[int, int], p: float, salt: int, seed: int,
                 calls: list):
        self.engines, self.groups, self.lengths, self.p, self.salt, self.seed = engines, groups, lengths, p, salt, seed
        self.calls = calls

    def collect(self, step: int, round: int = 0) -> Rollouts:
        self.calls.append((self.salt, step, self.engines.version))
        rng = np.random.default_rng([self.seed, self.salt, step])
        lens = rng.integers(self.lengths[0], self.lengths[1] + 1, size=(self.groups, N)).tolist()
        correct = (rng.random((self.groups, N)) < self.p).tolist()
        v = self.engines.version
        return Rollouts(
            prompt_ids=[[[1]] * N for _ in range(self.groups)],
            response_ids=[[[2] * ln for ln in g] for g in lens], loss_mask=[[[True] * ln for ln in g] for g in lens],
            logprobs=[[[-0.5] * ln for ln in g] for g in lens],
            rewards=[[1.0 if c else 0.0 for c in g] for g in correct], correct=correct,
            num_tokens=sum(map(sum, lens)), versions={v or None} if v == 0 else {v}, metrics={"time/generate_s": 0.0},
            groups_info=[{"problem": f"{step}-{i}", "prompt": "", "truncated": [False] * N}
                         for i in range(self.groups)])


MIX = {"mix": [{"task": {"name": "arithmetic"}, "groups": 4, "label": "short"},
               {"task": {"name": "arithmetic"}, "groups": 4, "label": "long"}]}


def _run(rollout: dict, steps: int = 40, seed: int = 0, stop_at: int | None = None, inflight=None, start: int = 0,
         version: int = 0):
    cfg = TrialConfig(steps=steps, seed=seed, model={"name": "tiny"}, task=MIX, rollout={"n": N, **rollout})
    engines, learner, calls = FakeEngines(), FakeLearner(), []
    engines.version = version
    source = MixedSource([("short", _Member(engines, 4, (1, 8), 0.7, 1, seed, calls)),
                          ("long", _Member(engines, 4, (8, 24), 0.3, 2, seed, calls))])
    ctx = TrialContext(cfg, [], learner, None, None, None, engines=engines)
    pipe = TrainingStep.for_trial(ctx, source, inflight=inflight)
    sepa, rows = SepaController(SepaConfig(steps=0)), []
    for step in range(start, steps if stop_at is None else stop_at):
        out = pipe.run(step, sepa, version)
        rows.append(out.row)
        version = out.version
    return rows, calls, learner.batches, pipe


DISCARD = {"mode": "async", "max_staleness": 1, "admission": "discard", "decode_per_step": 8}
PACED = {"mode": "async", "max_staleness": 1, "decode_per_step": 8}
SYNC = {"mode": "async", "max_staleness": 0}


def _roll(lengths: list[int]) -> Rollouts:
    return Rollouts(prompt_ids=[[[1]] for _ in lengths], response_ids=[[[2] * ln] for ln in lengths],
                    loss_mask=[[[True] * ln] for ln in lengths], logprobs=[[[-0.5] * ln] for ln in lengths],
                    rewards=[[1.0] for _ in lengths], correct=[[True] for _ in lengths], num_tokens=sum(lengths),
                    versions={None}, metrics={"time/generate_s": float(len(lengths))},
                    policy_versions=[[0, 0] for _ in lengths])


def test_the_clock_against_hand_arithmetic():
    """4 tokens a step, k = 1. Batch 0 (in line at step 0): lengths 3, 9 -> ready at 0, 2; batches 1 and 2
    (sampled during step 0): 4, 5 -> 1, 2 and 1, 1. Step 0 trains the short group of batch 0 only; step 1 (version
    1) the ready group of batch 1 (batch 2's, ready too, is sampled for a later step); step 2 (version 2) finds
    every remaining group ready and two versions old: all dropped, the long group of batch 0 among them."""
    assert ready_steps(_roll([3, 9]), 0, 4, inline=True) == [0, 2]
    assert ready_steps(_roll([4, 5, 0]), 0, 4) == [1, 2, 1]
    q = CompletionQueue(4, 1)
    q.add(_roll([3, 9]), 0, 0, 0, inline=True)
    q.add(_roll([4, 5]), 0, 1, 0)
    q.add(_roll([1, 1]), 0, 2, 0)
    assert q.next_index(0) == 3
    t0 = q.take(0, 0)
    assert [len(r[0]) for r in t0.roll.response_ids] == [3] and t0.dropped == [] and t0.delayed == set()
    assert t0.roll.metrics == {"time/generate_s": 2.0}  # batch 0's own
    t1 = q.take(1, 1)
    assert [len(r[0]) for r in t1.roll.response_ids] == [4] and t1.dropped == [] and t1.delayed == {0}
    t2 = q.take(2, 2)
    assert [len(r[0]) for r in t2.roll.response_ids] == [9, 5, 1, 1] and t2.dropped == [0, 1, 2, 3]
    assert q.batches == []
    # nothing ready: the learner waits for the next completion (the earliest ready step among its groups)
    q.add(_roll([20, 30]), 5, 3, 2)
    t3 = q.take(3, 5)
    assert [len(r[0]) for r in t3.roll.response_ids] == [20] and t3.dropped == []


def _stable(rows):
    return [{k: v for k, v in r.items() if not k.startswith("time/")} for r in rows]


def test_every_trained_group_is_within_the_bound_and_every_group_is_offered_once():
    rows, _, batches, _ = _run(DISCARD, steps=30)
    for r in rows:
        if r["train/groups_kept"]:
            assert r["async/staleness_max"] <= 1
            assert sum(r[f"async/staleness_tokens_{j}"] for j in range(2)) == r["train/tokens_trained"]
        assert r["async/groups_dropped"] + r["train/groups_kept"] <= r["async/groups_offered"]
    offered = sum(r["async/groups_offered"] for r in rows)
    assert offered <= 30 * 8 and offered >= 28 * 8  # the last batches' long groups may still be in flight
    assert sum(r["async/groups_dropped"] for r in rows) > 0
    assert len(batches) == sum(r["train/groups_kept"] > 0 for r in rows)
    # the groups' versions make the row's staleness: the learner's version minus the oldest offered
    trained = 0
    for r in rows:
        assert r["rollout/staleness"] == trained - r["async/version_oldest"]
        trained += r["train/groups_kept"] > 0


def test_paced_ignores_the_clock_and_trains_what_was_offered():
    with_clock, calls_a, _, _ = _run(PACED, steps=12)
    without, calls_b, _, _ = _run({k: v for k, v in PACED.items() if k != "decode_per_step"}, steps=12)
    assert _stable(with_clock) == _stable(without) and calls_a == calls_b
    assert all(r["async/groups_dropped"] == 0 for r in with_clock)


def test_the_groups_in_flight_survive_a_checkpoint(tmp_path):
    """Stop after step 5, save, load into a new step, continue: the rows and the generator's calls are the
    uninterrupted trial's, bit for bit."""
    full, full_calls, _, _ = _run(DISCARD, steps=14)
    part, _, _, pipe = _run(DISCARD, steps=14, stop_at=6)
    pipe.save(tmp_path)
    assert not (tmp_path / "prefetch.json").exists()
    restored = load_inflight(tmp_path)
    assert restored is not None and len(restored.batches) >= 2
    assert json.loads(restored.to_json()) == json.loads(pipe.clock.to_json())
    version = sum(r["train/groups_kept"] > 0 for r in part)
    rest, rest_calls, _, _ = _run(DISCARD, steps=14, inflight=restored, start=6, version=version)
    assert _stable(part + rest) == _stable(full)
    assert rest_calls == [c for c in full_calls if c[1] >= 6 + 2]  # batches 6 and 7 came from the checkpoint


def _share(rows, key: str, name: str, names: tuple[str, ...]) -> tuple[float, float]:
    """(share of `name` among the run's offered groups, among its trained groups) for `async/<key>_by_*`."""
    off = {n: sum(r[f"async/offered_by_{key}/{n}"] for r in rows) for n in names}
    tr = {n: sum(r[f"async/trained_by_{key}/{n}"] for r in rows) for n in names}
    return off[name] / sum(off.values()), tr[name] / sum(tr.values())


SEEDS = range(4)
STEPS = 60


def test_discard_over_represents_the_short_problems_and_paced_does_not():
    """The bias test (issue 57). Per seed, the long problems' share of the trained groups minus their share of the
    offered groups, paired against the synchronous arm (paced k = 0, the same offered groups; its own difference
    comes from the uninformative groups every arm leaves out). Noise: the binomial standard error of a trained
    share, sqrt(p (1 - p) / trained groups) with p = 0.5 the offered share: discard trains 127-134 groups of 476
    offered a seed, so SE <= 0.044.

    Measured (4 seeds x 60 steps x 8 groups, k = 1, decode_per_step 8): discard trains 3-7% long groups of the
    50% offered (the sync arm 46-49%): a long-share delta against the sync arm of -0.42, -0.45, -0.43, -0.46
    (9.5-10 SE each), and a hard-share delta (pass rate < 0.5) of -0.18, -0.19, -0.19, -0.23 (3.9-5.3 SE).
    paced k = 1 trains every offered group, as the sync arm does: its deltas are exactly 0."""
    deltas = {"discard": [], "paced": []}
    hard = {"discard": [], "paced": []}
    ses = []
    for seed in SEEDS:
        runs = {name: _run(rollout, steps=STEPS, seed=seed)[0]
                for name, rollout in (("sync", SYNC), ("discard", DISCARD), ("paced", PACED))}
        gap = {n: (lambda o, t: t - o)(*_share(rows, "source", "long", ("short", "long"))) for n, rows in runs.items()}
        hgap = {n: (lambda o, t: t - o)(*_share(rows, "difficulty", "hard", ("hard", "easy")))
                for n, rows in runs.items()}
        trained = sum(sum(r["async/trained_by_source/long"] + r["async/trained_by_source/short"] for r in rows)
                      for rows in [runs["discard"]])
        ses.append(math.sqrt(0.25 / trained))
        for arm in deltas:
            deltas[arm].append(gap[arm] - gap["sync"])
            hard[arm].append(hgap[arm] - hgap["sync"])
    se = max(ses)
    print(f"long-share delta vs sync: discard {np.round(deltas['discard'], 3)}, paced {deltas['paced']}; "
          f"hard: discard {np.round(hard['discard'], 3)}; SE per seed <= {se:.4f}")
    assert all(d < -5 * se for d in deltas["discard"])  # far beyond noise, in every seed
    assert all(d < -3 * se for d in hard["discard"])
    assert all(abs(d) <= 2 * se for d in deltas["paced"] + hard["paced"])  # paced: not beyond noise


def test_the_metric_list_names_the_composition_keys():
    """orchestrator/tracking/names.py lists the composition counts a mixed async trial writes."""
    from orchestrator.tracking.names import logged_metrics

    rows, _, _, _ = _run(DISCARD, steps=6)
    cfg = TrialConfig(steps=6, model={"name": "tiny"}, task=MIX, rollout={"n": N, **DISCARD})
    produced = {k for r in rows for k in r if k not in ("loss/policy", "step")}
    assert {"async/offered_by_source/long", "async/trained_by_source/short", "async/trained_by_difficulty/hard",
            "async/offered_by_difficulty/easy"} <= produced
    assert produced <= logged_metrics(cfg), produced - logged_metrics(cfg)


def test_the_report_composition_table_shows_both(tmp_path):
    """The bias runs' rows as a campaign (3 seeds, 40 steps): the report's staleness section puts discard's long
    and hard ratios below the synchronous arm's beyond their 95% interval, and paced's at a difference of 0."""
    from orchestrator.report import ReportOptions, build_report
    from tests.unit.report.test_staleness_section import _write

    arms = {"sync": SYNC, "discard": DISCARD, "paced": PACED}
    camp = _write(tmp_path / "c", {name: ({"n": N, "admission": "paced", **ro},
                                          [_run(ro, steps=40, seed=s)[0] for s in range(3)])
                                   for name, ro in arms.items()})
    rep = build_report(camp, ReportOptions(out_dir=tmp_path / "out"))
    tab = rep.tables["staleness"].set_index("group")
    for col in ("long_ratio", "hard_ratio"):
        assert tab.loc["discard", f"{col}_hi"] < 0, tab.loc["discard"]
        assert tab.loc["paced", f"{col}_delta"] == pytest.approx(0.0)
    assert tab.loc["discard", "short_ratio_lo"] > 0
    assert "| group | seeds | len ratio | hard ratio | long ratio | short ratio |" in rep.markdown


def test_a_rewind_takes_the_groups_in_flight_from_the_checkpoint(tmp_path, monkeypatch):
    """The trial loop's restore (orchestrator/trial/loop.py: `_resume`, as `_rewind` and a Tune retry take it) hands
    the checkpoint's groups in flight to the step."""
    from types import SimpleNamespace

    from orchestrator.trial import loop
    from orchestrator.trial.actors.ports import LearnerRestarted
    from tests.unit.trial.test_staleness import _Dir

    part, _, _, pipe = _run(DISCARD, steps=14, stop_at=6)
    ck = tmp_path / "checkpoint"
    ck.mkdir()
    pipe.save(ck)
    restored = SimpleNamespace(state={"step": 5, "adapter_version": 0}, learner=b"", rows=part,
                               checkpoint=SimpleNamespace(as_directory=lambda: _Dir(ck)))
    storage = SimpleNamespace(storage_filesystem=None, trial_fs_path=str(tmp_path))
    monkeypatch.setattr(loop.tune, "get_context", lambda: SimpleNamespace(get_storage=lambda: storage))
    monkeypatch.setattr(loop.tune, "get_checkpoint", lambda: object())
    monkeypatch.setattr(loop, "restore_checkpoint", lambda *a, **k: restored)
    cfg = TrialConfig(steps=14, model={"name": "tiny"}, task=MIX, rollout={"n": N, **DISCARD},
                      output_dir=str(tmp_path / "out"))
    resume = loop._rewind(cfg, cfg.output_dir, LearnerRestarted("the pool's learner restarted"))
    assert resume.start == 6 and resume.pending == []
    assert json.loads(resume.inflight.to_json()) == json.loads(pipe.clock.to_json())
