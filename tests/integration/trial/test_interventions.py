"""Learner interventions in short local trials on the real stack (one campaign, four conditions), as LoRA adapters
on one shared base (`resources.shared_base`): one engine and one learner start for the four trials instead of
four of each, and the interventions are shown where a slot's learner and a multi-LoRA engine run them (the
reference pass with the slot's adapter disabled, the probability floor among other adapters' requests)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from orchestrator.campaign.expand import load_campaign
from orchestrator.tune.launch import run_campaign
from tests.tolerance import LOGPROB_GAP

STEPS = 8


@pytest.fixture(scope="module")
def runs(ray_local, tmp_path_factory) -> dict[str, list[dict]]:
    tmp = tmp_path_factory.mktemp("interventions")
    path = tmp / "iv.yaml"
    path.write_text(yaml.safe_dump({
        "name": "iv", "storage": str(tmp / "store"), "seeds": [0], "wandb": {"mode": "disabled"},
        "base": {"steps": STEPS, "model": {"name": "tiny"}, "task": {"name": "arithmetic"},
                 "rollout": {"prompts_per_step": 16, "n": 8, "max_tokens": 6}, "learner": {"optim": {"lr": 1e-2}},
                 "eval": {"every": 0}, "checkpoint": {"every": STEPS}},
        "conditions": {
            "plain": {"interventions": {"kl": {"measure": True}}},
            "kl": {"interventions": {"kl": {"coef": 1.0, "estimator": "low_var_kl", "measure": True}}},
            "entropy": {"interventions": {"entropy_bonus": {"coeff": 0.2}}},
            "floor": {"task": {"name": "arithmetic_mc"}, "interventions": {"probability_floor": {"min_prob": 0.24}}},
        },
        "resources": {"rollout_workers": 1, "worker_cpus": 0.5, "learner_cpus": 0.5, "driver_cpus": 0.25,
                      "shared_base": {"slots": 4}},
    }))
    campaign = load_campaign(path)
    assert run_campaign(campaign) == 0
    out = {}
    for t in campaign.trials:
        text = (Path(campaign.directory) / "trials" / t.name / "metrics.jsonl").read_text()
        out[t.condition] = [json.loads(ln) for ln in text.splitlines()]
        assert [r["step"] for r in out[t.condition]] == list(range(STEPS))
    return out


def _late_mean(rows: list[dict], key: str) -> float:
    late = rows[STEPS // 2:]
    return sum(r[key] for r in late) / len(late)


def test_large_kl_coefficient_keeps_policy_near_reference(runs):
    plain, kl = _late_mean(runs["plain"], "kl/ref"), _late_mean(runs["kl"], "kl/ref")
    assert runs["plain"][0]["kl/ref"] == pytest.approx(0.0, abs=1e-6)  # step 0: the adapter is still zero
    assert kl < 0.5 * plain, (kl, plain)


def test_entropy_bonus_keeps_entropy_higher(runs):
    plain, bonus = _late_mean(runs["plain"], "policy/entropy_mean"), _late_mean(runs["entropy"], "policy/entropy_mean")
    assert bonus > plain, (bonus, plain)
    assert "loss/entropy_bonus" in runs["entropy"][0] and "loss/entropy_bonus" not in runs["plain"][0]


def test_probability_floor_holds_in_sampler_and_learner(runs):
    floor = min(0.24, 0.99 / 4)
    for r in runs["floor"]:
        assert r["floor/sampler_min_valid_prob"] >= floor - 1e-5, r
        if r["train/groups_kept"]:
            assert r["floor/learner_min_valid_prob"] >= floor - 1e-5, r
            assert r["train/logprob_gap_max"] < LOGPROB_GAP, r  # sampler and learner agree on the floored distribution


def test_kl_coefficient_zero_runs_no_reference_pass(runs):
    assert "kl/ref" not in runs["entropy"][0] and "loss/kl" not in runs["plain"][0]
