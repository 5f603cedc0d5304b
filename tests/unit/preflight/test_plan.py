"""`python -m orchestrator plan`: the compute plan of the shipped campaigns, step times from a pilot's measured
wall times, seeds for an effect of interest from the pilot's paired sd (against statsmodels), the makespan."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from statsmodels.stats.power import TTestPower

from orchestrator import cli
from orchestrator.campaign.expand import load_campaign
from orchestrator.preflight.plan import Cluster, PlanRequest, make_plan, makespan, paragraph

ROOT = Path(__file__).resolve().parents[3]


def _plan_cli(*args: str) -> str:
    proc = subprocess.run([sys.executable, "-m", "orchestrator", "plan", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_plan_of_the_lean_campaign():
    out = _plan_cli("campaigns/sepa_lean.yaml", "--gpus", "16", "--cpus", "128")
    assert out.startswith("plan for campaign sepa_lean: 20 trials")
    assert "C4_s3  40     256" in out  # 40 steps x 16 prompts x 16 samples
    # 20 trials x 40 steps x 256 generations x 2048 tokens at most
    assert "800 steps, 204,800 generations, <= 419,430,400 generated tokens" in out
    assert "step time from: cost model" in out
    assert "cluster: 16 GPUs, 128 CPUs (--gpus/--cpus): 8 trial(s) at once" in out  # 2 GPUs a trial


# full: colocated, 2 GPUs a trial (2 ranks, each beside an engine); LoRA: separate, 2 GPUs (1 engine + 1 rank)
@pytest.mark.parametrize("variant, at_once", [("", 4), ("_lora", 4)])
def test_plan_of_the_sokoban_sweep(variant, at_once):
    out = _plan_cli(f"campaigns/ragen/sokoban_entropy{variant}.yaml", "--gpus", "8")
    assert out.startswith(f"plan for campaign sokoban_entropy{variant}: 18 trials")
    assert "ppo_gae_s2_coeff0.1" in out and f"{at_once} trial(s) at once" in out
    # 18 trials x 400 steps x 128 episodes x 5 turns x 256 tokens at most
    assert "7,200 steps, 921,600 generations, <= 1,179,648,000 generated tokens" in out


@pytest.mark.parametrize("learner, credit, kl, score, train", [
    ({}, "grpo", {}, 2, 4),  # LoRA: no weight gradients for the frozen base
    ({"mode": "full"}, "grpo", {"measure": True}, 4, 6),  # + the frozen reference's forward
    ({"mode": "full", "gradient_checkpointing": True}, "gae", {"coef": 0.01}, 6, 16),  # full critic, recomputes
    ({"mode": "full", "critic": {"model": "lora"}}, "gae", {}, 4, 10),  # the LoRA critic's base is frozen
])
def test_learner_flops_count_the_passes(learner, credit, kl, score, train):
    """The step time's learner part from its passes (FLOPs per token in units of P, counted by hand from what
    workers/learner/learner.py runs): scoring = policy + reference + critic forwards; training = per trained model 6P
    (weights train) or 4P (frozen base), plus 2P per model under gradient checkpointing."""
    from orchestrator.config.trial import TrialConfig
    from orchestrator.preflight.cost_model import EFFICIENCY, PEAK, learner_flops, step_seconds, step_tokens

    cfg = TrialConfig.model_validate({"model": {"name": "Qwen/Qwen2.5-3B"}, "task": {"name": "arithmetic"},
                                      "learner": learner, "credit": {"advantage_mode": credit},
                                      "interventions": {"kl": kl}, "resources": {"learner_ranks": 2}})
    assert learner_flops(cfg) == (score, train)
    tok, parts = step_tokens(cfg), step_seconds(cfg, "H100")
    devices = 2 * max(cfg.resources.learner_gpus, 1.0)
    assert parts["train"] == pytest.approx(tok.trained * train * 3e9 / (PEAK["H100"] * EFFICIENCY["train"] * devices))
    assert parts["score"] == pytest.approx(tok.scored * score * 3e9 / (PEAK["H100"] * EFFICIENCY["score"] * devices))


def test_makespan_is_longest_first_list_scheduling():
    assert makespan([3, 3, 2, 2, 2], 2) == 7  # {3, 2, 2} and {3, 2}
    assert makespan([1.0] * 6, 3) == 2
    assert makespan([1.0], 0) == math.inf


def _pilot(tmp_path: Path, sd: float, rng) -> Path:
    """A pilot campaign directory as `run` leaves it: campaign.json, metrics rows, Tune's result.json."""
    d = tmp_path / "pilot"
    trials = []
    level = rng.normal(0.3, 0.05, 6)
    for cond, shift in (("C1", 0.0), ("C4", 0.02)):
        for seed in range(6):
            name = f"{cond}_s{seed}"
            trials.append({"name": name, "condition": cond, "seed": seed})
            (d / "trials" / name).mkdir(parents=True)
            final = level[seed] + shift + rng.normal(0, sd / math.sqrt(2))
            rows = [{"step": s, "train/correct_rate": final, "time/generate_s": 1.0} for s in range(20)]
            (d / "trials" / name / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
            (d / name).mkdir()
            wall = [30.0] + [4.0 + (0.5 if cond == "C4" else 0.0)] * 19  # first step: actor start-up
            (d / name / "result.json").write_text("".join(json.dumps({"time_this_iter_s": w}) + "\n"
                                                          for w in wall))
    (d / "campaign.json").write_text(json.dumps({"trials": trials}))
    return d


def test_pilot_gives_step_times_and_seeds_for_the_effect(tmp_path):
    rng = np.random.default_rng(1)
    pilot = _pilot(tmp_path, 0.03, rng)
    path = tmp_path / "main.yaml"
    path.write_text(json.dumps({
        "name": "main", "seeds": [0, 1, 2], "storage": str(tmp_path / "store"),
        "base": {"steps": 20, "model": {"name": "tiny"}, "task": {"name": "arithmetic"}},
        "conditions": {"C1": {}, "C4": {"credit": {"advantage_mode": "maxrl"}}}}))
    campaign = load_campaign(path)
    plan = make_plan(campaign, PlanRequest(pilot=str(pilot), effect=0.02, measure="final"),
                     cluster=Cluster(0, 8, "test"))
    by = {t.trial.name: t for t in plan.trials}
    assert by["C1_s0"].step_s == 4.0 and by["C4_s0"].step_s == 4.5 and by["C1_s0"].source == "pilot"
    # reference: the paired sd of the pilot's final values, statsmodels' paired t power at alpha 0.05 / 1
    vals = {(r["condition"], r["seed"]): json.loads((pilot / "trials" / f"{r['name']}" / "metrics.jsonl")
                                                    .read_text().splitlines()[-1])["train/correct_rate"]
            for r in json.loads((pilot / "campaign.json").read_text())["trials"]}
    sd = float(np.std([vals["C4", s] - vals["C1", s] for s in range(6)], ddof=1))
    n = math.ceil(TTestPower().solve_power(effect_size=0.02 / sd, alpha=0.05, power=0.8))
    assert any(f"pilot paired sd {sd:.4g} over 6 pairs -> {n} seeds" in line for line in plan.power), plan.power
    assert "from pilot" in paragraph(plan)


def test_plan_without_pilot_says_the_effect_needs_one(capsys):
    assert cli.main(["plan", str(ROOT / "campaigns/sepa_lean.yaml"), "--gpus", "4", "--effect", "0.05"]) == 0
    assert "needs --pilot DIR" in capsys.readouterr().out


def test_plan_with_a_missing_pilot_is_one_line_exit_2(tmp_path, capsys):
    assert cli.main(["plan", str(ROOT / "campaigns/sepa_lean.yaml"), "--pilot", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--pilot" in err[0] and "campaign.json" in err[0]


@pytest.mark.parametrize("holm", [2, 4])
def test_multiplicity_lowers_the_planned_alpha(tmp_path, holm):
    rng = np.random.default_rng(3)
    pilot = _pilot(tmp_path, 0.03, rng)
    conds = {"C1": {}, **{f"C{i}": {} for i in range(4, 4 + holm)}}
    path = tmp_path / "m.yaml"
    path.write_text(json.dumps({"name": "m", "seeds": [0], "storage": str(tmp_path / "s"), "conditions": conds,
                                "base": {"steps": 20, "model": {"name": "tiny"}, "task": {"name": "arithmetic"}}}))
    plan = make_plan(load_campaign(path), PlanRequest(pilot=str(pilot), effect=0.02, measure="final"),
                     cluster=Cluster(0, 8, "t"))
    assert f"Holm over {holm} comparisons" in plan.power[0] and f"alpha 0.05/{holm}" in plan.power[0]


def test_run_prints_the_paragraph_before_launching(monkeypatch):
    from orchestrator.preflight.shared_plan import run_paragraph

    monkeypatch.setattr("ray.cluster_resources", lambda: {"GPU": 8.0, "CPU": 64.0})
    text = run_paragraph(load_campaign(ROOT / "campaigns/sepa_lean.yaml"))
    assert text.startswith("plan: 20 trials, 800 steps, about 71.0 GPU-hours (step times from cost model); "
                           "4 trial(s) at once on 8 GPUs, 64 CPUs, makespan about"), text
    launch = (ROOT / "orchestrator/tune/launch.py").read_text()
    assert launch.index("print(run_paragraph(campaign)") < launch.index("tuner.fit()")


def test_pilot_walls_from_events_give_the_makespan(tmp_path):
    """Each pilot trial ran 20 steps of 4 s (Tune's step walls) but 80 + 40 = 120 s in all (events.jsonl: start
    to end, a resume in between): the plan counts the 40 s outside the steps, so 4 trials run one at a time take
    2 x 120 s + 2 x 130 s, not 2 x 80 s + 2 x 90 s."""
    rng = np.random.default_rng(0)
    pilot = _pilot(tmp_path, 0.03, rng)
    for t in json.loads((pilot / "campaign.json").read_text())["trials"]:
        step = 4.5 if t["condition"] == "C4" else 4.0
        events = [{"event": "start", "from_step": 0, "time": 1000.0}, {"event": "phase", "time": 1001.0},
                  {"event": "start", "from_step": 10, "time": 1050.0},
                  {"event": "end", "step": 19, "time": 1000.0 + 20 * step + 40.0}]
        (pilot / "trials" / t["name"] / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    path = tmp_path / "main.yaml"
    path.write_text(json.dumps({
        "name": "main", "seeds": [0, 1], "storage": str(tmp_path / "store"),
        "base": {"steps": 20, "model": {"name": "tiny"}, "task": {"name": "arithmetic"}},
        "conditions": {"C1": {}, "C4": {}}}))
    plan = make_plan(load_campaign(path), PlanRequest(pilot=str(pilot)), cluster=Cluster(0, 4, "test"))
    by = {t.trial.name: t for t in plan.trials}
    assert by["C1_s0"].overhead_s == pytest.approx(40.0) and by["C1_s0"].overhead_source == "pilot"
    assert by["C4_s1"].hours * 3600 == pytest.approx(20 * 4.5 + 40.0)
    # one at a time: each trial's bundles take 3.5 of the 4 CPUs (driver 0.5 + 2 workers + learner)
    assert plan.at_once == 1
    assert plan.makespan_h * 3600 == pytest.approx(2 * 120.0 + 2 * 130.0)
    from orchestrator.preflight.plan import render

    assert "from each trial's measured wall (events.jsonl) less its steps" in render(plan)


def test_without_a_pilot_the_time_outside_the_steps_is_modelled():
    from orchestrator.preflight.cost_model import STARTUP_S, overhead_seconds

    campaign = load_campaign(ROOT / "campaigns/demo.yaml")
    plan = make_plan(campaign, cluster=Cluster(0, 2, "test"))
    t = plan.trials[0]
    assert t.overhead_source == "modelled" and t.overhead_s >= STARTUP_S["cpu"]
    assert t.overhead_s == pytest.approx(sum(overhead_seconds(t.trial.trial, "cpu").values()))
    assert t.hours * 3600 == pytest.approx(t.trial.trial.steps * t.step_s + t.overhead_s)


def test_offload_between_steps_is_modelled_on_a_gpu_only():
    from orchestrator.config.trial import TrialConfig
    from orchestrator.preflight.cost_model import HOST_COPY_BYTES_PER_S, model_params, overhead_seconds

    cfg = TrialConfig(model={"name": "Qwen/Qwen2.5-3B-Instruct"}, steps=10, resources={"learner_ranks": 4},
                      learner={"mode": "full", "offload_between_steps": True})
    p = model_params(cfg.model.name)
    # Adam's two fp32 moments and the fp32 policy, each rank's quarter, out and back every step
    assert overhead_seconds(cfg, "H100")["offload"] == pytest.approx(10 * 2 * 12 * p / 4 / HOST_COPY_BYTES_PER_S)
    assert "offload" not in overhead_seconds(cfg, "cpu")  # the copies are no-ops there
    plain = cfg.model_copy(update={"learner": cfg.learner.model_copy(update={"offload_between_steps": False})})
    assert "offload" not in overhead_seconds(plain, "H100")


def test_compare_placement_side_by_side():
    out = _plan_cli("campaigns/ragen/sokoban_entropy.yaml", "--gpus", "12", "--compare-placement")
    table = out.split("compare placement:\n")[1].splitlines()
    rows = {r.split()[0]: r.split() for r in table[2:4]}
    chosen = next(k for k, r in rows.items() if "(chosen)" in r)
    other = next(k for k in rows if k != chosen)
    gpus = {k: int(rows[k][2 if k == chosen else 1]) for k in rows}
    at_once = {k: int(rows[k][3 if k == chosen else 2]) for k in rows}
    assert gpus["separate"] == gpus["colocated"] + 1  # the engine's own GPU: 2 ranks + 1 engine vs 2 shared
    assert at_once == {"separate": 12 // gpus["separate"], "colocated": 12 // gpus["colocated"]}
    assert other != chosen


def test_status_shows_plan_vs_actual(tmp_path):
    from orchestrator.jobs.status import plan_vs_actual

    path = tmp_path / "c.yaml"
    path.write_text(json.dumps({"name": "c", "seeds": [0, 1], "storage": str(tmp_path / "store"),
                                "base": {"steps": 3, "model": {"name": "tiny"}, "task": {"name": "arithmetic"}},
                                "conditions": {"A": {}}}))
    campaign = load_campaign(path)
    assert plan_vs_actual(campaign) == []  # nothing finished yet
    trial = Path(campaign.directory) / "trials" / "A_s0"
    trial.mkdir(parents=True)
    trial.joinpath("events.jsonl").write_text(json.dumps({"event": "start", "time": 100.0}) + "\n"
                                              + json.dumps({"event": "end", "time": 280.0}) + "\n")
    plan = make_plan(campaign, cluster=Cluster(0, math.inf, "t"))
    line = plan_vs_actual(campaign)[0]
    assert line.startswith("plan vs actual: 1 finished trial(s) ran 3.0 min each")
    assert f"the plan said {plan.trials[0].hours * 60:.1f} min" in line and line.endswith("campaign wall so far 3.0 min")


@pytest.mark.parametrize("rollout, overlapped", [({"mode": "sync"}, False), ({"mode": "async", "max_staleness": 0}, False),
                                                 ({"mode": "one_step_off"}, True),
                                                 ({"mode": "async", "max_staleness": 2}, True)])
def test_step_wall_overlaps_generation_with_the_learner_when_sampling_ahead(rollout, overlapped):
    """k > 0: the next step's generation runs while the learner scores and trains, so a step takes the longer of
    the two plus the evaluation's generation (before the step); k = 0: the parts one after the other."""
    from orchestrator.config.trial import TrialConfig
    from orchestrator.preflight.cost_model import step_seconds, step_tokens, step_wall

    cfg = TrialConfig.model_validate({"model": {"name": "Qwen/Qwen2.5-3B"}, "task": {"name": "arithmetic"},
                                      "eval": {"every": 1}, "rollout": rollout})
    parts, tok = step_seconds(cfg, "H100"), step_tokens(cfg)
    assert tok.eval_generated > 0
    if not overlapped:
        assert step_wall(cfg, "H100") == pytest.approx(sum(parts.values()))
        return
    ev = parts["generate"] * tok.eval_generated / (tok.generated + tok.eval_generated)
    expected = ev + max(parts["generate"] - ev, parts["score"] + parts["train"])
    assert step_wall(cfg, "H100") == pytest.approx(expected) and expected < sum(parts.values())
