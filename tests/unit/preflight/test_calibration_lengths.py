"""A calibration's measured lengths and per-step overhead (orchestrator/config/calibration.py, written by
`benchmarks/calibrate.py --campaign`): the plan takes a trial's prompt and completion lengths from it only for the
model and task it measured, adds the step's other work to every step (separate trials: after generation and
training; a pool: to the trial's own part of the cycle), and says which it used. Worked by hand."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from orchestrator import cli
from orchestrator.campaign.expand import load_campaign
from orchestrator.config.calibration import Calibration
from orchestrator.preflight.cost_model import step_seconds, step_tokens, step_wall
from orchestrator.preflight.pool_shape import Step, cycle

ROOT = Path(__file__).resolve().parents[3]
CAL = {"device": "cpu, 2 cores", "model": "tiny-reasoner", "learner_tokens_per_s": 5000.0, "adapter_export_s": 0.05,
       "adapter_load_s": 0.1, "startup_s": 30.0, "decode": [{"sequences": 1, "tokens_per_s": 100},
                                                           {"sequences": 1000, "tokens_per_s": 100_000}],
       "step_overhead_s": 0.7, "task": "chain", "prompt_tokens": 40.0, "completion_tokens": 20.0}


@pytest.fixture(scope="module")
def demo():
    return load_campaign(ROOT / "campaigns/demo.yaml").trials[0].trial  # tiny-reasoner on chain


def test_the_measured_lengths_apply_to_the_model_and_task_they_were_measured_on(demo):
    cal = Calibration.model_validate(CAL)
    assert cal.lengths("tiny-reasoner", "chain") == {"prompt_tokens": 40.0, "completion_tokens": 20.0}
    assert cal.lengths("tiny", "chain") == {} and cal.lengths("tiny-reasoner", "arithmetic") == {}
    assert Calibration.model_validate({k: v for k, v in CAL.items() if k != "task"}).lengths("tiny-reasoner",
                                                                                              "chain") == {}
    r = demo.rollout
    gens = r.prompts_per_step * r.n
    tok = step_tokens(demo, 40.0, 20.0)
    assert (tok.generated, tok.trained) == (gens * 20.0, gens * 60.0 * demo.learner.optim.ppo_epochs)
    assert step_tokens(demo, 40.0, 10_000.0).generated == gens * r.max_tokens  # never past max_tokens
    assert step_tokens(demo).generated == gens * r.max_tokens  # no lengths: the upper bound


def test_a_calibrated_step_by_hand(demo):
    """The demo's step with the calibration's lengths: rate 100 a sequence in flight, so an engine holding the
    step's `gens` sequences decodes 100 x gens tokens/s; every learner token at 5,000/s; the sync 0.15 s; 0.7 s of
    other work."""
    cal = Calibration.model_validate(CAL)
    r = demo.rollout
    gens = r.prompts_per_step * r.n
    tok = step_tokens(demo, 40.0, 20.0)
    parts = step_seconds(demo, "cpu", cal)
    assert parts["generate"] == pytest.approx((tok.generated + tok.eval_generated) / (100.0 * gens))
    assert parts["train"] == pytest.approx(tok.trained / 5000.0) and parts["other"] == 0.7
    assert step_wall(demo, "cpu", cal) == pytest.approx(sum(parts.values()))
    ahead = demo.model_copy(update={"rollout": r.model_copy(update={"mode": "one_step_off"})})
    ahead_parts = step_seconds(ahead, "cpu", cal)
    evaluate = ahead_parts["generate"] * tok.eval_generated / (tok.generated + tok.eval_generated)
    learn = ahead_parts["score"] + ahead_parts["train"] + ahead_parts["sync"]
    assert step_wall(ahead, "cpu", cal) == pytest.approx(evaluate + max(ahead_parts["generate"] - evaluate, learn)
                                                         + 0.7)


def test_a_pool_adds_the_other_work_to_the_trials_own_part_only():
    """g 10, l 3, 4 slots on 1 engine and 2 learners, rate flat: the engines' 40 s and the busiest learner's 6 s are
    as without it; the trial's own step (10 + 3) gains the 0.7 s."""
    plain = cycle(Step(10.0, 3.0), 1, 2, 4)
    more = cycle(Step(10.0, 3.0, other_s=0.7), 1, 2, 4)
    assert (more.generate_s, more.learn_s) == (plain.generate_s, plain.learn_s)
    assert more.own_s == pytest.approx(plain.own_s + 0.7)
    alone = cycle(Step(10.0, 3.0, other_s=0.7), 8, 8, 1)  # one trial: its own step is the cycle
    assert alone.seconds == pytest.approx(10.0 + 3.0 + 0.7)


def test_plan_says_which_trials_take_the_measured_lengths(tmp_path, capsys):
    path = tmp_path / "cal.yaml"
    path.write_text(yaml.safe_dump(CAL))
    assert cli.main(["plan", str(ROOT / "campaigns/demo.yaml"), "--calibration", str(path)]) == 0
    out = capsys.readouterr().out
    assert ("0.70 s a step's other work; 10 of 10 trial(s) at its measured lengths, 40-token prompts and "
            "20-token completions (tiny-reasoner on chain)") in out, out
    path.write_text(yaml.safe_dump({**CAL, "task": "arithmetic"}))
    assert cli.main(["plan", str(ROOT / "campaigns/demo.yaml"), "--calibration", str(path)]) == 0
    out = capsys.readouterr().out
    assert "its lengths (tiny-reasoner on arithmetic) fit no trial here: token counts are the upper bounds" in out


def test_a_gpu_free_pool_shares_the_cores_between_its_engines_and_learners():
    """g 2, l 1, 4 slots on 1 engine and 2 learners, one thread each (the rate flat: the engine's 4 trials take
    4 x 2 = 8 s): apart the cycle is max(8, 2 x 1, 2 + 1) = 8 s; on 2 cores the engine's 8 thread-seconds and the
    learners' 4 x 1 take at least 6 s, on 1 core 12 s; 2-thread learners on 2 cores (8 + 8) / 2 = 8 s."""
    from orchestrator.preflight.pool_shape import PoolWork

    flat = {"batch": 1, "rate": lambda sequences: 100.0}  # tokens/s whatever the sequences in flight
    assert cycle(Step(2.0, 1.0, **flat), 1, 2, 4).seconds == 8.0
    assert cycle(Step(2.0, 1.0, **flat, cores=2), 1, 2, 4).seconds == 8.0
    assert cycle(Step(2.0, 1.0, **flat, cores=1), 1, 2, 4).seconds == 12.0
    assert cycle(Step(2.0, 1.0, **flat, cores=2, learner_threads=2), 1, 2, 4).seconds == 8.0
    two = cycle(Step(2.0, 1.0, **flat, cores=1.5), 2, 2, 4)  # 2 engines of 2 trials each: 4 s apiece
    assert two.generate_s == 4.0 and two.seconds == pytest.approx((2 * 4.0 + 4 * 1.0) / 1.5)
    # the cores bind only a pool without GPUs; an actor's threads are its whole CPUs, at least 1
    cpu = PoolWork("p", 2.0, 1.0, 1, (3,), (0.0,), 0.0, 0.0, 0.0, 0.4, 2.5, 0.2)
    gpu = PoolWork("p", 2.0, 1.0, 1, (3,), (0.0,), 0.0, 1.0, 1.0, 0.4, 2.5, 0.2)
    assert (cpu.step(1.0, 2.0).cores, cpu.step(1.0, 2.0).engine_threads, cpu.step(1.0, 2.0).learner_threads) == (
        2.0, 1, 2)
    assert gpu.step(1.0, 2.0).cores == float("inf")


@pytest.mark.parametrize("argv", [["--quick"], ["--campaign", str(ROOT / "campaigns/demo.yaml")],
                                  ["--campaign", str(ROOT / "campaigns/demo.yaml"), "--prompts", "3"]])
def test_calibrate_measures_the_trial_it_is_given(monkeypatch, argv):
    """benchmarks/calibrate.py's measured trial (the suite's smoke run takes the --campaign path): the campaign's
    first trial on actors of its own (no shared base), no evaluation, its batch unless --prompts / --n /
    --max-tokens (or --quick) say otherwise; without --campaign a LoRA trial of --model on arithmetic."""
    import sys

    sys.path.insert(0, str(ROOT))
    from benchmarks import calibrate

    monkeypatch.setattr(sys, "argv", ["calibrate.py", *argv])
    args = calibrate._args()
    cfg = calibrate._trial(args)
    r = cfg.rollout
    assert (r.prompts_per_step, r.n, r.max_tokens) == (args.prompts, args.n, args.max_tokens)
    assert cfg.eval.every == 0 and cfg.resources.shared_base is None and cfg.learner.mode == "lora"
    if "--campaign" not in argv:
        assert (cfg.model.name, cfg.task.name, args.prompts, args.n, args.max_tokens) == ("tiny", "arithmetic", 2, 2, 4)
        return
    demo = load_campaign(ROOT / "campaigns/demo.yaml").trials[0].trial
    assert (cfg.model.name, cfg.task.name, cfg.resources.worker_cpus) == ("tiny-reasoner", "chain",
                                                                          demo.resources.worker_cpus)
    want = (3 if "--prompts" in argv else demo.rollout.prompts_per_step, demo.rollout.n, demo.rollout.max_tokens)
    assert (args.prompts, args.n, args.max_tokens) == want
    assert cfg.credit == demo.credit and cfg.learner == demo.learner
