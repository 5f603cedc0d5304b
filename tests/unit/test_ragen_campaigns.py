"""Seed 004's four sweeps ship as campaigns that expand and validate as the seed states them."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from orchestrator.campaign import load_campaign

RAGEN = Path(__file__).resolve().parents[2] / "campaigns" / "ragen"
PER_SEED = {"sokoban_entropy": 6, "sokoban_kl": 6, "sokoban_rv_filter": 8, "frozenlake_rv_filter": 16}
SIX = [0.0, 0.001, 0.003, 0.01, 0.03, 0.1]
RV = {1.0, 0.98, 0.95, 0.9, 0.8, 0.6, 0.4}


@pytest.mark.parametrize("name", sorted(PER_SEED))
def test_sweep_campaign_expands_as_the_seed_states(name):
    campaign = load_campaign(RAGEN / f"{name}.yaml")
    seeds = Counter(t.seed for t in campaign.trials)
    assert len(seeds) >= 3 and set(seeds.values()) == {PER_SEED[name]}
    for t in campaign.trials:
        c = t.trial
        assert c.steps == 400 and c.rollout.prompts_per_step == 8 and c.rollout.n == 16
        assert c.learner.optim.mini_batch_size == 32 and c.learner.loss.aggregation == "token-mean"
        assert c.credit.advantage_mode == "gae" and c.credit.gae.gamma == c.credit.gae.lam == 1.0
        assert c.interventions.rv_filter.loss_scaling == "none"
        assert (c.eval.problems, c.eval.n, c.eval.every) == (512, 1, 10)
        iv = c.interventions
        if name == "sokoban_entropy":
            assert not iv.kl.is_active and not iv.rv_filter.is_active
        if name == "sokoban_kl":
            assert iv.entropy_bonus.coeff == 0 and not iv.rv_filter.is_active
            assert iv.kl.is_active == (iv.kl.coef > 0) and not iv.kl.measure  # coef 0: no reference pass
        if name.endswith("rv_filter"):
            nofilter = t.condition == "nofilter"
            assert iv.rv_filter.include_zero == nofilter and (iv.rv_filter.value == 1.0 or not nofilter)
            assert iv.entropy_bonus.coeff == 0.001
            assert iv.kl.coef == (0.001 if name.startswith("sokoban") else 0.0)
        assert c.task.name == ("sokoban" if name.startswith("sokoban") else "frozen_lake")
        assert (c.task.levels, c.task.protocol, c.task.dynamics) == ("ragen", "ragen", "shared")
        assert c.task.frozen_prob == 0.9 and c.model.max_model_len >= 3600  # RAGEN's p and context
        assert c.model.name == ("Qwen/Qwen2.5-3B-Instruct" if name.startswith("frozen") else "Qwen/Qwen2.5-3B")
    if name == "sokoban_entropy":
        assert sorted({t.trial.interventions.entropy_bonus.coeff for t in campaign.trials}) == SIX
    if name == "sokoban_kl":
        assert sorted({t.trial.interventions.kl.coef for t in campaign.trials}) == SIX
    if name.endswith("rv_filter"):
        assert {t.trial.interventions.rv_filter.value for t in campaign.trials} == RV
    if name == "frozenlake_rv_filter":
        assert {t.trial.task.success_rate for t in campaign.trials} == {0.8, 0.98}
