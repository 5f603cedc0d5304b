"""The rollout source of a mixed task (orchestrator/trial/collect/mixed.py) on scripted member sources: a step's groups
are the members' in the mix's order, a single-turn member's groups carry one turn each beside episodes, the
metrics are per member beside the totals, and refill / skip_uninformative still work group by group."""

from __future__ import annotations

from orchestrator.config.members import member_trials
from orchestrator.config.trial import TrialConfig
from orchestrator.trial.actors.context import TrialContext
from orchestrator.trial.collect.fill import Refill, gather
from orchestrator.trial.collect.mixed import MixedSource, as_turns
from orchestrator.trial.collect.rollouts import HeldOut, Rollouts, SampleGroup
from orchestrator.trial.step.sequence import prepare
from workers.credit import SepaController
from workers.credit.config import SepaConfig

G = 2  # samples per group


class Member:
    """`groups` groups per call, rewards from `stream` (cycled by a cursor that moves per call); `episodes`: the
    groups carry turns and env metrics like EpisodeSource's."""

    def __init__(self, name: str, groups: int, stream: list[list[float]], episodes: bool = False):
        self.name, self.groups, self.stream, self.episodes = name, groups, stream, episodes
        self.cursor, self.calls = 0, []

    def collect(self, step: int, round: int = 0) -> Rollouts:
        self.calls.append((step, round))
        ks = list(range(self.cursor, self.cursor + self.groups))
        self.cursor += self.groups
        rewards = [list(self.stream[k % len(self.stream)]) for k in ks]
        extra = {"turn_rewards": [[[r] for r in g] for g in rewards],
                 "reward_positions": [[[2] for _ in g] for g in rewards],
                 "sampled_mask": [[[True] * 3 for _ in g] for g in rewards]} if self.episodes else {}
        metrics = {"env/success": 0.5, "env/turns_max": 3} if self.episodes else {"train/grader_errors": 1}
        return Rollouts(
            prompt_ids=[[[k]] * G for k in ks], response_ids=[[[k, 0, 0]] * G for k in ks],
            loss_mask=[[[True] * 3] * G for _ in ks], logprobs=[[[-0.5] * 3] * G for _ in ks],
            rewards=rewards, correct=[[r > 0.5 for r in g] for g in rewards], num_tokens=3 * G * len(ks),
            versions={None}, metrics={"time/score_s": 0.0, **metrics}, extra=extra,
            truncated=[[False] * G for _ in ks], lengths=[[3] * G for _ in ks],
            groups_info=[{"problem": f"p{k}", "prompt": "x", "truncated": [False] * G} for k in ks])

    def evaluate(self, step: int) -> HeldOut:
        n = 2 if self.episodes else 4
        out = {"eval/pass@1": 0.5 if self.episodes else 0.25, "eval/pass@k": 1.0, "eval/k": 2, "eval/problems": n,
               "time/eval_s": 1.0}
        if self.episodes:
            out.update({"eval/success": 0.5, "eval/return_mean": 0.1})
        return HeldOut(out, [SampleGroup("p0", "x", [[1]], [1.0], [True], [False])])


def _cfg(**rollout) -> TrialConfig:
    mix = [{"task": {"name": "chain"}, "groups": 2}, {"task": {"name": "frozen_lake"}, "groups": 1, "label": "lake"}]
    return TrialConfig(model={"name": "tiny-agent"}, task={"mix": mix}, rollout={"n": G, **rollout})


UNI, INF = [1.0, 1.0], [1.0, 0.0]


def test_groups_in_the_mix_order_with_turns_and_per_member_metrics():
    chain, lake = Member("chain", 2, [INF, UNI]), Member("lake", 1, [[0.0, 0.0]], episodes=True)
    roll = MixedSource([("chain", chain), ("lake", lake)]).collect(step=3)
    assert len(roll) == 3 and chain.calls == lake.calls == [(3, 0)]
    assert [g["problem"] for g in roll.groups_info] == ["chain/p0", "chain/p1", "lake/p0"]
    assert roll.rewards == [INF, UNI, [0.0, 0.0]]
    # the single-turn groups got one turn each (reward on the last sampled id), the episode's are its own
    assert roll.extra["turn_rewards"] == [[[1.0], [0.0]], [[1.0], [1.0]], [[0.0], [0.0]]]
    assert roll.extra["reward_positions"][0] == [[2], [2]] and roll.extra["sampled_mask"][0] == [[True] * 3] * G
    m = roll.metrics
    assert m["train/chain/correct_rate"] == 0.75 and m["train/lake/correct_rate"] == 0.0
    assert m["env/lake/success"] == 0.5 and m["env/success"] == 0.5 and "env/chain/success" not in m
    assert m["train/grader_errors"] == 1 and m["env/turns_max"] == 3


def test_a_mix_of_single_turn_members_carries_no_turns():
    roll = MixedSource([("a", Member("a", 1, [INF])), ("b", Member("b", 2, [UNI]))]).collect(0)
    assert roll.extra == {} and len(roll) == 3


def test_as_turns_of_an_empty_completion_has_no_turn():
    roll = Member("a", 1, [INF]).collect(0)
    roll.loss_mask = [[[], [True]]]
    turns = as_turns(roll)
    assert turns.extra["reward_positions"] == [[[], [0]]] and turns.extra["turn_rewards"] == [[[], [0.0]]]


def test_prepare_builds_one_batch_with_turns_for_every_group():
    cfg = _cfg()
    roll = gather(cfg, MixedSource([("chain", Member("chain", 2, [INF, UNI])),
                                    ("lake", Member("lake", 1, [INF], episodes=True))]), step=0)
    prep = prepare(TrialContext(cfg, [], None, None, None), 0, roll, SepaController(SepaConfig(steps=0)), 0)
    row, batch = prep.row, prep.batch
    assert row["train/groups_sampled"] == 3 and row["train/groups_kept"] == 2  # the uniform chain group skipped
    assert row["train/chain/correct_rate"] == 0.75 and row["train/correct_rate"] == 4 / 6
    assert batch.turn_rewards == [[1.0], [0.0], [1.0], [0.0]] and batch.reward_positions == [[2]] * 4


def _filled(cfg: TrialConfig, members: dict[str, Member]) -> MixedSource:
    """The mix as the trial builds it (mixed.py: task_source): each member refilled under its own config."""
    cfgs = dict(member_trials(cfg))
    return MixedSource([(label, Refill(cfgs[label], members[label])) for label in cfgs],
                       {label: c.rollout.fill.groups for label, c in cfgs.items()})


def _trained(roll: Rollouts) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for g, t in zip(roll.groups_info, roll.train, strict=True):
        if t:
            label, problem = g["problem"].split("/")
            out.setdefault(label, []).append(problem)
    return out


def test_refill_fills_each_member_to_its_own_groups():
    cfg = _cfg(fill={"groups": 3, "max_rounds": 3})
    chain, lake = Member("chain", 2, [UNI, UNI, INF, INF]), Member("lake", 1, [INF], episodes=True)
    roll = _filled(cfg, {"chain": chain, "lake": lake}).collect(1)
    # chain: round 0 UNI UNI -> none usable, round 1 INF INF -> its 2; lake: round 0 INF -> its 1, asked no more
    assert chain.calls == [(1, 0), (1, 1)] and lake.calls == [(1, 0)]
    assert roll.train == [False, False, True, True, True] and roll.metrics["train/fill_rounds"] == 2
    assert roll.metrics["train/chain/correct_rate"] == (1.0 + 0.5) / 2  # its groups over both rounds
    assert roll.metrics["train/chain/fill_short"] == roll.metrics["train/lake/fill_short"] == 0


def _reversed(cfg: TrialConfig) -> TrialConfig:
    mix = [m.model_dump() for m in cfg.task.mix]
    return TrialConfig(model={"name": "tiny-agent"}, task={"mix": mix[::-1]}, rollout=cfg.rollout.model_dump())


def test_a_mix_with_fill_trains_each_members_asked_groups_in_either_order():
    """chain asks 2 groups, lake 1; whichever member comes first, each trains exactly its share, the same
    groups (with one refill over the whole batch, the first member's usable groups crowded the other out)."""
    cfg = _cfg(fill={"groups": 3, "max_rounds": 3})
    got = []
    for c in (cfg, _reversed(cfg)):
        members = {"chain": Member("chain", 2, [INF, INF, INF]), "lake": Member("lake", 1, [UNI, UNI, INF])}
        roll = _filled(c, members).collect(0)
        got.append(_trained(roll))
        assert {k: len(v) for k, v in got[-1].items()} == {"chain": 2, "lake": 1}
        assert members["chain"].calls == [(0, 0)] and members["lake"].calls == [(0, 0), (0, 1), (0, 2)]
        assert roll.metrics["train/fill_rounds"] == 3
    assert got[0] == got[1] == {"chain": ["p0", "p1"], "lake": ["p2"]}


def test_a_member_that_cannot_fill_is_reported_short():
    cfg = _cfg(fill={"groups": 3, "max_rounds": 2})
    roll = _filled(cfg, {"chain": Member("chain", 2, [INF]), "lake": Member("lake", 1, [UNI], episodes=True)}
                   ).collect(0)
    assert _trained(roll) == {"chain": ["p0", "p1"]} and roll.metrics["train/fill_rounds"] == 2
    assert roll.metrics["train/chain/fill_short"] == 0 and roll.metrics["train/lake/fill_short"] == 1


def test_evaluate_totals_over_every_member_and_each_members_own():
    out = MixedSource([("chain", Member("chain", 2, [INF])), ("lake", Member("lake", 1, [INF], episodes=True))]
                      ).evaluate(0)
    samples, out = out.samples, out.metrics
    assert [s.problem for s in samples] == ["chain/p0", "lake/p0"]
    assert out == {"eval/chain/pass@1": 0.25, "eval/lake/pass@1": 0.5, "eval/lake/success": 0.5,
                   "eval/lake/return_mean": 0.1, "eval/pass@1": (0.25 * 4 + 0.5 * 2) / 6, "eval/pass@k": 1.0,
                   "eval/k": 2, "eval/problems": 6, "time/eval_s": 2.0}
