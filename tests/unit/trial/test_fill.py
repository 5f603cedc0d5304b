"""The refill loop (orchestrator/trial/collect/fill.py) on scripted reward streams: a fake source hands out groups whose
rewards come from a fixed stream, one group per prompt of a task cursor, so every expected count and choice below
is read off the stream by hand."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np
import pytest

from orchestrator.config.trial import TrialConfig
from orchestrator.trial.actors.context import TrialContext
from orchestrator.trial.collect.fill import gather
from orchestrator.trial.collect.rollouts import Rollouts, merge_metrics
from orchestrator.trial.collect.sampling import step_seed
from orchestrator.trial.step.sequence import prepare
from workers.credit import SepaController
from workers.credit.config import SepaConfig
from workers.rollout.output import Completion, Generation

P, G = 4, 2  # prompts per round, samples per group
UNI, INF = [1.0, 1.0], [1.0, 0.0]  # a uniform and an informative group's rewards


class ScriptedSource:
    """Group k of the stream (k = the task cursor) has rewards `stream[k]`; the cursor moves P per round, like
    `task.next_batch`; `calls` records (step, round); `fail_at` raises on that call (a kill mid-refill)."""

    def __init__(self, stream, fail_at=None):
        self.stream, self.cursor, self.calls, self.fail_at = stream, 0, [], fail_at

    def state_dict(self):
        return {"cursor": self.cursor}

    def load_state_dict(self, state):
        self.cursor = state["cursor"]

    def collect(self, step: int, round: int = 0) -> Rollouts:
        if (step, round) == self.fail_at:
            raise RuntimeError("killed")
        self.calls.append((step, round))
        ks = list(range(self.cursor, self.cursor + P))
        self.cursor += P
        groups = [self.stream[k % len(self.stream)] for k in ks]
        return Rollouts(
            prompt_ids=[[[k]] * G for k in ks], response_ids=[[[k, step, round]] * G for k in ks],
            loss_mask=[[[True] * 3] * G for _ in ks], logprobs=[[[-0.5] * 3] * G for _ in ks],
            rewards=[list(g) for g in groups], correct=[[r > 0.5 for r in g] for g in groups],
            num_tokens=3 * G * P, versions={None}, metrics={"time/score_s": 0.0, "train/grader_errors": 1},
            truncated=[[False] * G for _ in ks], lengths=[[3] * G for _ in ks])


def _cfg(groups=None, max_rounds=3, **rollout) -> TrialConfig:
    fill = {"groups": groups, "max_rounds": max_rounds} if groups else None
    return TrialConfig(model={"name": "tiny"}, task={"name": "arithmetic"},
                       rollout={"prompts_per_step": P, "n": G, "fill": fill, **rollout})


def _trained(roll: Rollouts) -> list[int]:
    """The prompt ids (stream positions) of the groups marked for training."""
    return [roll.prompt_ids[i][0][0] for i, t in enumerate(roll.train) if t]


def _prepare(cfg, roll, step=0):
    ctx = TrialContext(cfg, [], None, None, None)
    prep = prepare(ctx, step, roll, SepaController(SepaConfig(steps=0)), 0)
    return prep.row, prep.batch, prep.correct_rate


def test_all_uniform_for_every_round_runs_max_rounds_and_trains_nothing():
    cfg = _cfg(groups=3, max_rounds=3)
    src = ScriptedSource([UNI])
    roll = gather(cfg, src, step=0)
    assert src.calls == [(0, 0), (0, 1), (0, 2)]
    assert len(roll) == 12 and roll.train == [False] * 12 and roll.metrics["train/fill_rounds"] == 3
    assert roll.metrics["train/grader_errors"] == 3  # counts summed over rounds
    row, batch, _ = _prepare(cfg, roll)
    assert batch is None
    assert (row["train/groups_sampled"], row["train/groups_informative"], row["train/groups_kept"]) == (12, 0, 0)
    assert row["train/fill_rounds"] == 3 and row["train/tokens_trained"] == 0


def test_exactly_n_on_round_two():
    # round 0: positions 0-3 -> 1 informative (2); round 1: positions 4-7 -> 2 informative (5, 7): 3 in all
    stream = [UNI, UNI, INF, UNI, UNI, INF, UNI, INF, INF, INF, INF, INF]
    cfg = _cfg(groups=3, max_rounds=4)
    src = ScriptedSource(stream)
    roll = gather(cfg, src, step=5)
    assert src.calls == [(5, 0), (5, 1)] and src.cursor == 8
    assert _trained(roll) == [2, 5, 7]
    row, batch, _ = _prepare(cfg, roll, step=5)
    assert row["train/fill_rounds"] == 2 and row["train/groups_kept"] == 3
    assert (row["train/groups_sampled"], row["train/groups_informative"]) == (8, 3)
    assert row["train/tokens_trained"] == 3 * 3 * G
    assert batch.rewards == [INF, INF, INF] and [ids[0] for ids in batch.prompt_ids] == [2, 2, 5, 5, 7, 7]


def test_surplus_of_the_last_round_is_cut_in_sampling_order():
    # round 0 gives 1 (position 1); round 1 gives 4 (4, 5, 6, 7) where 2 are needed: 4 and 5 train, 6 and 7 not
    stream = [UNI, INF, UNI, UNI, INF, INF, INF, INF]
    cfg = _cfg(groups=3, max_rounds=3)
    first, again = gather(cfg, ScriptedSource(stream), 0), gather(cfg, ScriptedSource(stream), 0)
    assert _trained(first) == _trained(again) == [1, 4, 5]
    assert first.train == [False, True, False, False, True, True, False, False]
    row, batch, _ = _prepare(cfg, first)
    assert row["train/groups_kept"] == 3 and row["train/groups_informative"] == 5
    assert len(batch.rewards) == 3


def test_without_fill_one_round_as_before():
    cfg = _cfg()
    src = ScriptedSource([UNI, INF, INF, UNI])
    roll = gather(cfg, src, 0)
    assert src.calls == [(0, 0)] and roll.train == []
    row, batch, _ = _prepare(cfg, roll)
    assert row["train/groups_kept"] == 2 and row["train/fill_rounds"] == 1 and row["train/groups_sampled"] == 4


def test_gae_counts_uniform_groups_as_usable_by_default():
    cfg = TrialConfig(model={"name": "tiny"}, task={"name": "arithmetic"}, credit={"advantage_mode": "gae"},
                      rollout={"prompts_per_step": P, "n": G, "fill": {"groups": 3}})
    assert cfg.rollout.skip_uninformative is False
    src = ScriptedSource([UNI])
    roll = gather(cfg, src, 0)
    assert src.calls == [(0, 0)] and _trained(roll) == [0, 1, 2]


def test_resume_in_the_middle_of_a_refill_gives_the_same_batch():
    stream = [UNI, UNI, UNI, INF, UNI, UNI, UNI, UNI, INF, UNI, INF, INF]
    cfg = _cfg(groups=3, max_rounds=4)
    ref = ScriptedSource(stream)
    assert _trained(gather(cfg, ref, 0)) == [3, 8, 10]  # three rounds: positions 0-11
    saved = ref.state_dict()  # the checkpoint after step 0
    want = gather(cfg, ref, 1)

    killed = ScriptedSource(stream, fail_at=(1, 1))
    killed.load_state_dict(saved)
    with pytest.raises(RuntimeError):
        gather(cfg, killed, 1)  # dies after round 0 of step 1 moved the cursor
    restored = ScriptedSource(stream)
    restored.load_state_dict(saved)  # the restore rewinds the cursor to the checkpoint
    got = gather(cfg, restored, 1)
    strip = {"metrics": {}}  # time/generate_s is a wall time
    assert dataclasses.replace(got, **strip) == dataclasses.replace(want, **strip)
    assert restored.cursor == ref.cursor == 24
    assert restored.calls == [(1, 0), (1, 1), (1, 2)] and _trained(got) == [15, 20, 22]


def test_round_zero_keeps_todays_seeds_and_later_rounds_differ():
    for seed, step, shard in [(0, 0, 0), (7, 3, 1), (123, 40, 2)]:
        assert step_seed(seed, step, shard) == step_seed(seed, step, shard, round=0) == \
            (seed * 1_000_003 + step * 9_973 + shard * 101) % (2**31 - 1)
        rounds = {step_seed(seed, step, shard, round=r) for r in range(4)}
        assert len(rounds) == 4
    assert step_seed(1, 2, 0, turn=3) == step_seed(1, 2, 0, turn=3, round=0)


@dataclass
class _WithInfo(Rollouts):
    """A per-group field another branch might add: select / concat must carry it without being told."""

    groups_info: list[dict] = field(default_factory=list)


def _info_roll(base: int, n: int = 3) -> _WithInfo:
    ks = list(range(base, base + n))
    return _WithInfo(
        prompt_ids=[[[k]] for k in ks], response_ids=[[[k, k]] for k in ks], loss_mask=[[[True, k % 2 == 0]] for k in ks],
        logprobs=[[[-1.0, -2.0]] for _ in ks], rewards=[[float(k)] for k in ks], correct=[[False] for _ in ks],
        num_tokens=2 * n, versions={base}, metrics={"env/success": float(base), "time/score_s": 1.0},
        extra={"turn_rewards": [[[float(k)]] for k in ks]}, groups_info=[{"k": k} for k in ks],
        truncated=[[k == base] for k in ks], lengths=[[k] for k in ks])


def test_select_and_concat_carry_every_per_group_field():
    a, b = _info_roll(0), _info_roll(10, n=1)
    both = Rollouts.concat([a, b])
    assert isinstance(both, _WithInfo) and len(both) == 4
    assert both.groups_info == [{"k": 0}, {"k": 1}, {"k": 2}, {"k": 10}]
    assert both.extra["turn_rewards"] == [[[0.0]], [[1.0]], [[2.0]], [[10.0]]]
    assert both.truncated == [[True], [False], [False], [True]] and both.lengths == [[0], [1], [2], [10]]
    assert both.num_tokens == 8 and both.versions == {0, 10}
    assert both.metrics == {"env/success": (0.0 * 3 + 10.0 * 1) / 4, "time/score_s": 2.0}
    sub = both.select([3, 1])
    assert sub.groups_info == [{"k": 10}, {"k": 1}] and sub.rewards == [[10.0], [1.0]]
    assert sub.extra["turn_rewards"] == [[[10.0]], [[1.0]]] and sub.prompt_ids == [[[10]], [[1]]]
    assert sub.num_tokens == 2 + 1  # loss-mask tokens: group 10 has both, group 1 one
    with pytest.raises(ValueError, match="groups_info"):
        Rollouts.concat([a, dataclasses.replace(b, groups_info=[])])


def test_merge_metrics_table():
    rows = [{"time/x_s": 1.0, "train/grader_timeouts": 2, "floor/sampler_min_valid_prob": 0.3, "env/turns_max": 4,
             "env/success": 0.5},
            {"time/x_s": 2.5, "train/grader_timeouts": 1, "floor/sampler_min_valid_prob": 0.1, "env/turns_max": 2,
             "env/success": 1.0}]
    assert merge_metrics(rows, [1, 3]) == {"time/x_s": 3.5, "train/grader_timeouts": 3,
                                            "floor/sampler_min_valid_prob": 0.1, "env/turns_max": 4,
                                            "env/success": 0.875}


@pytest.mark.parametrize("rollout, needle", [
    ({"prompts_per_step": 4, "fill": {"groups": 9, "max_rounds": 2}}, "fill.groups \\(9\\) can never be reached"),
    ({"max_tokens": 8, "overlong": {"mode": "penalty", "buffer": 9}}, "overlong.buffer \\(9\\) must be <= max_tokens"),
    ({"fill": {"max_rounds": 2}}, "groups"),
])
def test_bad_fill_and_overlong_settings(rollout, needle):
    with pytest.raises(ValueError, match=needle):
        TrialConfig(model={"name": "tiny"}, task={"name": "arithmetic"}, rollout=rollout)


def test_single_turn_source_rounds_seeds_cursor_and_length_flags(tmp_path, monkeypatch):
    """The real SingleTurnSource and task cursor, a fake sampler: round r samples the next prompts_per_step
    problems with the seeds of (seed, step, r) (round 0: today's), the completions' finish_reason "length" marks
    them truncated; a restored cursor replays the refilled step exactly."""
    from types import SimpleNamespace

    import orchestrator.trial.collect.sources as sources
    from workers.models.loading import build_tiny_model, load_tokenizer
    from workers.tasks import make_task

    seen = []

    def fake_sample(ctx, prompt_ids, *, n, temperature, seeds, floor=True, phase="generate"):
        seen.append((tuple(map(tuple, prompt_ids)), tuple(seeds)))
        rng = np.random.default_rng(seeds[0])
        comps = []
        for _ in prompt_ids:
            ids = [[int(t) for t in rng.integers(5, 9, size=int(rng.integers(1, 5)))] for _ in range(n)]
            comps.append([Completion(c, [-0.5] * len(c), "length" if len(c) == 4 else "stop") for c in ids])
        return [Generation(None, comps, sum(len(c.token_ids) for g in comps for c in g))]

    def fake_score(self, prob, group):  # reward: the first token is even
        return SimpleNamespace(rewards=[float(c.token_ids[0] % 2 == 0) for c in group], grader_errors=0,
                               grader_timeouts=0)

    monkeypatch.setattr(sources, "sample", fake_sample)
    monkeypatch.setattr(sources.SingleTurnSource, "_score", fake_score)
    cfg = TrialConfig(model={"name": "tiny"}, task={"name": "arithmetic"}, seed=3,
                      rollout={"prompts_per_step": 2, "n": 3, "max_tokens": 4, "fill": {"groups": 3, "max_rounds": 6},
                               "overlong": {"mode": "mask"}})
    tok = load_tokenizer(str(build_tiny_model(tmp_path / "tiny", seed=0)))

    def run(state=None):
        task = make_task(cfg.task, cfg.seed)
        if state is not None:
            task.load_state_dict(state)
        seen.clear()
        src = sources.SingleTurnSource(TrialContext(cfg, [None], None, tok, task))
        return task, gather(cfg, src, step=7), list(seen)

    task, roll, calls = run()
    rounds = roll.metrics["train/fill_rounds"]
    assert rounds >= 2  # 2 prompts a round, 3 groups wanted
    assert len(calls) == rounds and sum(roll.train) == 3 and len(roll) == 2 * rounds
    assert [s for _, s in calls] == [(step_seed(3, 7, 0, round=r),) for r in range(rounds)]
    assert calls[0][1] == ((3 * 1_000_003 + 7 * 9_973) % (2**31 - 1),)
    assert len({p for ps, _ in calls for p in ps}) == 2 * rounds  # fresh prompts every round
    assert task.state_dict()["position"] == 2 * rounds
    assert roll.truncated == [[len(r) == 4 for r in g] for g in roll.response_ids]
    assert roll.metrics["train/overlong_masked"] == sum(c for t in roll.truncated for c in t)
    assert all(not any(m) for g, t in zip(roll.loss_mask, roll.truncated, strict=True)
               for m, c in zip(g, t, strict=True) if c)

    _, again, _ = run(make_task(cfg.task, cfg.seed).state_dict())  # restored from the step's start
    strip = {"metrics": {}}
    assert dataclasses.replace(again, **strip) == dataclasses.replace(roll, **strip)
