"""A shared campaign's lockstep budget charges what `plan` charges (orchestrator/config/pool_key.py:shared_gpu_hours):
its pool's GPUs over the wall the pool is up, not each running trial the GPUs a separate trial would hold. The
scheduler driven as Tune drives it (fake trials, no Ray) on a fake clock: two trials step side by side on a
two-slot pool, round after round."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from types import SimpleNamespace

import pytest
from ray.tune.experiment import Trial
from ray.tune.schedulers import TrialScheduler

import orchestrator.tune.lockstep as lockstep
from orchestrator.campaign.expand import expand
from orchestrator.campaign.schema import Campaign, CampaignConfig
from orchestrator.preflight.plan import Cluster, make_plan
from orchestrator.preflight.shared_plan import plan_shared, with_shared_base
from orchestrator.storage import campaign_events
from orchestrator.tune.scheduling import scheduling
from tests.unit.tune.fake_steps import report_step

STEP_S = 600.0  # every step takes 10 minutes of wall; the trials running at once step together


def _campaign(directory: str) -> Campaign:
    cfg = CampaignConfig.model_validate({
        "name": "c", "seeds": [0, 1], "conditions": {"A": {}, "B": {"credit": {"advantage_mode": "maxrl"}}},
        "base": {"steps": 4, "model": {"name": "Qwen/Qwen3-4B-Instruct-2507"}},
        "schedule": {"mode": "lockstep", "round_steps": 2},
        "resources": {"rollout_workers": 1, "worker_gpus": 1, "learner_gpus": 1, "shared_base": {"slots": 2}}})
    return Campaign(cfg, "c.yaml", directory, "/tmp", expand(cfg, "c.yaml"))


def _run(sched, names: list[str], clock: list[float]) -> None:
    """Tune's loop on the clock: start what the scheduler lets run, then every running trial reports one step."""
    trials = [SimpleNamespace(config={"trial": n}, status=Trial.PENDING, last_result={}, step=0) for n in names]
    ctl = SimpleNamespace(get_trials=lambda: trials, stop_trial=lambda t: setattr(t, "status", Trial.TERMINATED))
    for t in trials:
        sched.on_trial_add(ctl, t)
    while any(t.status != Trial.TERMINATED for t in trials):
        while len([t for t in trials if t.status == Trial.RUNNING]) < 2 and (t := sched.choose_trial_to_run(ctl)):
            t.status = Trial.RUNNING
        clock[0] += STEP_S
        for t in [t for t in trials if t.status == Trial.RUNNING]:
            decision = report_step(sched, ctl, t, {"step": t.step, "time_this_iter_s": STEP_S}, 4)
            if decision == TrialScheduler.PAUSE and t.status == Trial.RUNNING:
                t.status = Trial.PAUSED


def test_a_shared_lockstep_campaign_is_charged_what_plan_charges(tmp_path, monkeypatch):
    campaign = _campaign(str(tmp_path))
    clock = [1_000_000.0]
    monkeypatch.setattr(lockstep, "time", SimpleNamespace(time=lambda: clock[0]))
    start = clock[0]
    sched = scheduling(campaign).scheduler
    _run(sched, [t.name for t in sorted(campaign.trials, key=lambda t: t.seed)], clock)
    wall_s = clock[0] - start
    # the plan of the same campaign (its trials as separate ones, one pool of 2 GPUs) over the same wall
    plan = plan_shared(make_plan(with_shared_base(campaign, None), cluster=Cluster(8, 64, "test")), 2, "H100")
    assert plan.gpus == 2.0
    assert sched.spent == pytest.approx(dataclasses.replace(plan, makespan_h=wall_s / 3600).gpu_hours)
    assert sched.spent == pytest.approx(2.0 * wall_s / 3600)  # the pool's GPUs, not two trials' x 2 each
    # and at every round boundary: the GPU-hours recorded are the plan's up to that moment
    rounds = [e for e in campaign_events(str(tmp_path)) if e["event"] == "round"]
    assert rounds and all(e["gpu_hours"] == pytest.approx(
        dataclasses.replace(plan, makespan_h=(e["time"] - start) / 3600).gpu_hours) for e in rounds)


def test_plan_judges_a_shared_campaigns_budget_by_the_shared_gpu_hours(tmp_path, capsys):
    """`plan` of a shared lockstep campaign: the budget line weighs the budget against the shared side's GPU-hours
    (what the run charges), not the separate trials' table above it."""
    import yaml

    from orchestrator import cli
    from orchestrator.campaign.expand import load_campaign

    lean = Path(__file__).resolve().parents[3] / "campaigns/sepa_lean.yaml"
    data = yaml.safe_load(lean.read_text())
    data.update(storage=str(tmp_path / "s"), schedule={"mode": "lockstep", "round_steps": 10})
    data["resources"]["shared_base"] = {"slots": 5}
    campaign = load_campaign(_dump(tmp_path, data))
    separate = make_plan(with_shared_base(campaign, None), cluster=Cluster(8, 64, "test"))
    shared = plan_shared(separate, 5, "H100")
    assert shared.gpu_hours < separate.gpu_hours
    data["budget"] = {"gpu_hours": round((shared.gpu_hours + separate.gpu_hours) / 2, 1)}
    assert cli.main(["plan", str(_dump(tmp_path, data)), "--gpus", "8", "--cpus", "64"]) == 0
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("budget:")]
    assert len(lines) == 1 and "(covers the plan: " in lines[0] and "on the shared base" in lines[0], lines


def _dump(tmp_path, data: dict) -> Path:
    import yaml

    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(data))
    return path
