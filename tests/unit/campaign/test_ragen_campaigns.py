"""Seed 004's four sweeps ship as campaigns that expand and validate as the seed states them: trained in full as
the seed ran them (`<name>.yaml`, their learner fitting its GPUs by the pre-launch estimate), and as LoRA
variants for one learner GPU (`<name>_lora.yaml`)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from orchestrator.campaign.expand import load_campaign

RAGEN = Path(__file__).resolve().parents[3] / "campaigns" / "ragen"
PER_SEED = {"sokoban_entropy": 6, "sokoban_kl": 6, "sokoban_rv_filter": 8, "frozenlake_rv_filter": 16}
SIX = [0.0, 0.001, 0.003, 0.01, 0.03, 0.1]
RV = {1.0, 0.98, 0.95, 0.9, 0.8, 0.6, 0.4}


@pytest.mark.parametrize("variant", ["", "_lora"])
@pytest.mark.parametrize("name", sorted(PER_SEED))
def test_sweep_campaign_expands_as_the_seed_states(name, variant):
    campaign = load_campaign(RAGEN / f"{name}{variant}.yaml")
    assert campaign.config.name == name + variant
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
        assert (name.startswith("sokoban") or c.task.frozen_prob == 0.9) and c.model.max_model_len >= 3600  # RAGEN p
        assert c.model.name == ("Qwen/Qwen2.5-3B-Instruct" if name.startswith("frozen") else "Qwen/Qwen2.5-3B")
        lrn = c.learner
        if variant:  # LoRA on one learner GPU, its lr scaled for the adapter; sized for an H100 like the full ones
            assert (lrn.mode, lrn.critic.model, lrn.optim.lr, c.resources.learner_ranks) == ("lora", "lora", 1e-5, 1)
            assert lrn.gradient_checkpointing and lrn.optim.max_tokens_per_micro_batch == 8192
            assert c.resources.accelerator_type == "H100"
        else:  # as the seed ran it: every weight, verl's actor and critic learning rates, a full critic
            assert (lrn.mode, lrn.critic.model, lrn.optim.lr, lrn.critic.lr) == ("full", "full", 1e-6, 1e-5)
            assert lrn.gradient_checkpointing and c.resources.learner_gpus == 1
    if name == "sokoban_entropy":
        assert sorted({t.trial.interventions.entropy_bonus.coeff for t in campaign.trials}) == SIX
    if name == "sokoban_kl":
        assert sorted({t.trial.interventions.kl.coef for t in campaign.trials}) == SIX
    if name.endswith("rv_filter"):
        assert {t.trial.interventions.rv_filter.value for t in campaign.trials} == RV
    if name == "frozenlake_rv_filter":
        assert {t.trial.task.success_rate for t in campaign.trials} == {0.8, 0.98}


@pytest.mark.parametrize("variant", ["", "_lora"])
@pytest.mark.parametrize("name", sorted(PER_SEED))
def test_each_learner_fits_its_gpus(name, variant, tmp_path):
    """The pre-launch memory check passes for every trial, with Qwen2.5-3B's published config standing in for the
    hub model (both seeds' models share it; the Instruct model has the same shape)."""
    import json

    from orchestrator.preflight.learner_memory import check_learner_memory
    from tests.unit.preflight.test_learner_memory import QWEN25_3B

    (tmp_path / "config.json").write_text(json.dumps(QWEN25_3B))
    campaign = load_campaign(RAGEN / f"{name}{variant}.yaml")
    seen = set()
    for t in campaign.trials:
        key = (t.trial.interventions.kl.is_active, t.trial.interventions.kl.measure)
        if key not in seen:
            seen.add(key)
            line = check_learner_memory(t.trial, str(tmp_path), "c.yaml", t.name)
            assert line is not None and "of 80 GiB" in line
