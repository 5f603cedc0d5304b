"""A LoRA campaign on one shared base (`resources.shared_base`, orchestrator/pool/) on the real stack: one pool
(one vLLM engine serving every trial's adapter, one learner holding every trial's slot) for 2 conditions x 2
seeds on the tiny reasoner, 2 slots, so Tune runs two trials at a time and the other two queue and reuse the
slots the first two released."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator.campaign.expand import load_campaign
from orchestrator.tune.launch import run_campaign, run_single_trial
from tests.integration.campaign.test_campaign import _jsonl, _spans_and_placements, _trial_dir, _write
from tests.integration.trial.test_trial import stable

STEPS = 3
RESOURCES = {"rollout_workers": 1, "worker_cpus": 0.5, "learner_cpus": 0.5, "driver_cpus": 0.25,
             "shared_base": {"slots": 2}}
BASE = {"steps": STEPS, "model": {"name": "tiny-reasoner"}, "task": {"name": "chain"},
        "rollout": {"prompts_per_step": 4, "n": 4, "max_tokens": 32, "skip_uninformative": False},
        "eval": {"every": 2, "problems": 4, "n": 2, "k": 2}, "checkpoint": {"every": 1, "keep": 2}}
CONDITIONS = {"grpo": {"credit": {"advantage_mode": "grpo"}}, "maxrl": {"credit": {"advantage_mode": "maxrl"}}}


@pytest.fixture(scope="module")
def shared_campaign(ray_local, reasoner_dir, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("shared")
    campaign = load_campaign(_write(tmp, name="shared", base=BASE, conditions=CONDITIONS, seeds=[0, 1],
                                    resources=RESOURCES, wandb={"mode": "disabled"}))
    assert run_campaign(campaign) == 0
    return campaign, tmp


def test_one_pool_serves_every_trial_and_each_trial_learns_as_alone(shared_campaign, ray_local):
    campaign, tmp = shared_campaign
    spans, placements = _spans_and_placements(campaign)  # also: every trial ran steps 0..STEPS-1

    # one engine process set and one learner for the whole campaign; trials' drivers are their own
    pools = {json.dumps({k: p["pool"][k] for k in ("learner", "workers")}, sort_keys=True)
             for p in placements.values()}
    assert len(pools) == 1, pools
    pool = next(iter(placements.values()))["pool"]
    assert len(pool["workers"]) == 1 and pool["workers"][0]["engine_pids"] is not None
    assert len({p["driver"]["pid"] for p in placements.values()}) == 4
    assert all(p["placement"] == "shared" and p["learner"] == pool["learner"] for p in placements.values())
    # the pool's actors sit in a placement group of their own, not a trial's
    assert all(pool["learner"]["placement_group"] != p["placement_group"] for p in placements.values())
    # 2 slots: at most two trials at once, and the queued two reused the slots the first two released
    moments = [s for s, _ in spans.values()]
    assert max(sum(a <= m < b for a, b in spans.values()) for m in moments) <= 2
    assert sorted(p["pool"]["slot"] for p in placements.values()) == [0, 0, 1, 1]
    # the pool is gone with the campaign
    import ray

    with pytest.raises(ValueError):
        ray.get_actor("shared-base-pool/learner")

    # common random numbers: step 0 identical across the conditions of a seed (the report's check)
    from orchestrator.report import ReportOptions, build_report

    rep = build_report(Path(campaign.directory), ReportOptions(out_dir=tmp / "report", figures=False))
    assert "identical across conditions for 2 of 2" in rep.markdown, rep.markdown

    # the same trial run separately (its own engine and learner) learns as it did in the pool beside the
    # others: the same metrics at every step (the engine is batch-invariant here: workers/rollout/shared.py)
    from orchestrator.config.trial import TrialConfig

    twin = campaign.trials[3]  # a trial that queued and reused a slot
    cfg = TrialConfig.model_validate({**twin.config, "output_dir": None, "name": "alone",
                                      "resources": {**twin.config["resources"], "shared_base": None}})
    assert run_single_trial(cfg, tmp / "alone") is not None
    alone = [stable(r) for r in _jsonl(tmp / "alone" / "alone" / "trial" / "metrics.jsonl")]
    shared = [stable(r) for r in _jsonl(_trial_dir(campaign, twin.name) / "metrics.jsonl")]
    assert [r["step"] for r in alone] == list(range(STEPS))
    assert alone == shared
