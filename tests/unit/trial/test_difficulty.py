"""`rollout.difficulty_samples` (orchestrator/trial/collect/sources.py, step/staleness.py): a single-turn source also
samples each offered problem with the starting policy (a base-model request, seeded apart from training) and the
composition's difficulty bins follow that pass rate, not the group's own; the training samples are untouched. On
scripted engines whose base model and adapter answer differently; the real engine's base-model request:
tests/integration/rollout/test_weight_sync.py."""

from __future__ import annotations

import pytest

from orchestrator.config.trial import TrialConfig
from orchestrator.trial.actors.context import TrialContext
from orchestrator.trial.collect import sampling, sources
from orchestrator.trial.collect.sampling import difficulty_seed, step_seed
from orchestrator.trial.collect.sources import SingleTurnSource
from orchestrator.trial.step.staleness import composition
from workers.rollout.output import Completion, Generation
from workers.tasks.base import Problem, ScoreResult

RIGHT, WRONG = 7, 8  # the token a completion answers with
# problem p: the adapter's answers (training samples) and the base model's (the starting policy)
ADAPTER = {"p0": [RIGHT, RIGHT, RIGHT, WRONG], "p1": [WRONG, WRONG, WRONG, RIGHT], "p2": [RIGHT, WRONG, RIGHT, WRONG]}
BASE = {"p0": [WRONG, WRONG, WRONG], "p1": [RIGHT, RIGHT, RIGHT], "p2": [RIGHT, RIGHT, WRONG]}


class Engines:
    count = 1

    def __init__(self):
        self.requests = []

    def generate(self, prompt_ids, request, seeds, phase):
        self.requests.append((request, list(seeds)))
        table = BASE if request.base else ADAPTER
        groups = [[Completion([t], [-0.1], "stop") for t in table[f"p{ids[0]}"]][:request.n] for ids in prompt_ids]
        return [Generation(None if request.base else 3, groups, sum(len(g) for g in groups))]


class Task:
    def __init__(self):
        self.cursor = 0

    def next_batch(self, k):
        out = [Problem(f"p{i}", f"q{i}", "A") for i in range(self.cursor, self.cursor + k)]
        self.cursor += k
        return out

    def score(self, problems, texts):
        return ScoreResult([1.0 if t == "A" else 0.0 for t in texts])


class Tokenizer:
    def decode(self, ids, skip_special_tokens=True):
        return "A" if ids == [RIGHT] else "B"


def _collect(monkeypatch, **rollout):
    monkeypatch.setattr(sources, "first_prompt_ids", lambda tok, prompt, system=None: [int(prompt[1:])])
    monkeypatch.setattr(sampling, "stop_token_ids", lambda tok: [2])
    cfg = TrialConfig(seed=4, model={"name": "tiny"}, task={"name": "arithmetic"},
                      rollout={"prompts_per_step": 3, "n": 4, **rollout})
    engines = Engines()
    ctx = TrialContext(cfg, [], None, Tokenizer(), Task(), None, engines=engines)
    return SingleTurnSource(ctx).collect(step=5), engines.requests


def test_the_bins_follow_the_starting_policys_pass_rate(monkeypatch):
    roll, requests = _collect(monkeypatch, mode="async", difficulty_samples=3)
    plain, _ = _collect(monkeypatch, mode="async")
    # the training samples are the adapter's, as without the difficulty samples
    assert roll.rewards == plain.rewards and roll.response_ids == plain.response_ids
    assert [g.get("start_pass_rate") for g in roll.groups_info] == [0.0, 1.0, pytest.approx(2 / 3)]
    assert all("start_pass_rate" not in g for g in plain.groups_info)
    # one training request, then one base-model request of difficulty_samples per problem on its own seeds
    (train, train_seeds), (base, base_seeds) = requests
    assert not train.base and train.n == 4 and train_seeds == [step_seed(4, 5, 0)]
    assert base.base and base.n == 3 and base_seeds == [difficulty_seed(4, 5, 0)] != train_seeds
    # own pass rates 3/4, 1/4, 2/4: p1 hard by its own samples, p0 by the starting policy's
    kept = [0, 1, 2]
    assert composition(plain, kept, []) == {"async/offered_by_difficulty/hard": 1, "async/trained_by_difficulty/hard": 1,
                                            "async/offered_by_difficulty/easy": 2, "async/trained_by_difficulty/easy": 2}
    by_start = composition(roll, [1, 2], [])
    assert by_start == {"async/offered_by_difficulty/hard": 1, "async/trained_by_difficulty/hard": 0,
                        "async/offered_by_difficulty/easy": 2, "async/trained_by_difficulty/easy": 2}


@pytest.mark.parametrize(("extra", "says"), [
    ({"rollout": {"mode": "sync", "difficulty_samples": 2}}, "needs"),
    ({"learner": {"mode": "full"}}, "learner.mode 'full'"),
    ({"task": {"name": "frozen_lake"}, "model": {"name": "tiny-agent"}}, "multi-turn"),
])
def test_a_trial_that_cannot_sample_its_starting_policy_is_refused(extra, says):
    base = {"model": {"name": "tiny"}, "task": {"name": "arithmetic"},
            "rollout": {"mode": "async", "difficulty_samples": 2}}
    with pytest.raises(ValueError, match="difficulty_samples") as err:
        TrialConfig(**{**base, **{k: {**base.get(k, {}), **v} for k, v in extra.items()}})
    assert says in str(err.value) or "mode 'sync'" in str(err.value)
