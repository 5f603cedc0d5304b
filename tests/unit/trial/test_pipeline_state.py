"""The one_step_off checkpoint state: a prefetched batch survives the JSON round trip exactly (ids, log-probs,
NaN/inf metrics, the base-model version None), so a restored trial trains on the same batch."""

from __future__ import annotations

import math

from orchestrator.trial.collect.rollouts import Rollouts
from orchestrator.trial.step.prefetch import (
    PREFETCH_FILE,
    load_pending,
    rollouts_from_json,
    rollouts_to_json,
)
from orchestrator.trial.step.sequence import TrainingStep


def _roll() -> Rollouts:
    return Rollouts(
        prompt_ids=[[[1, 2, 3]] * 2], response_ids=[[[4, 5], [6]]], loss_mask=[[[True, False], [True]]],
        logprobs=[[[-0.1234567890123, 0.0], [-1e-300]]], rewards=[[1.0, 0.0]], correct=[[True, False]],
        num_tokens=3, versions={None, 2}, metrics={"time/score_s": 0.1, "env/x": float("nan"), "k": 3},
        extra={"turn_rewards": [[[1.0], [0.0]]], "reward_positions": [[[0], [0]]]},
    )


def test_round_trip_is_exact():
    roll = _roll()
    back, version = rollouts_from_json(rollouts_to_json(roll, 7))
    assert version == 7 and back.versions == {None, 2}
    for f in ("prompt_ids", "response_ids", "loss_mask", "logprobs", "rewards", "correct", "num_tokens", "extra"):
        assert getattr(back, f) == getattr(roll, f), f
    assert math.isnan(back.metrics["env/x"]) and back.metrics["k"] == 3


def test_save_and_load_pending(tmp_path):
    from orchestrator.config.trial import TrialConfig
    from orchestrator.trial.actors.context import TrialContext
    from orchestrator.trial.collect.sources import rollout_source

    ctx = TrialContext(TrialConfig(), [], None, None, None, None)
    pipe = TrainingStep(ctx, rollout_source(ctx), overlap=True)
    pipe.save(tmp_path)  # nothing prefetched (the last step): no file
    assert not (tmp_path / PREFETCH_FILE).exists() and load_pending(tmp_path) is None
    pipe.pending = (_roll(), 4)
    pipe.save(tmp_path)
    roll, version = load_pending(tmp_path)
    assert version == 4 and roll.logprobs == _roll().logprobs
