"""The shape of a shared-base pool (orchestrator/preflight/pool_shape.py): the pipelined cycle of E engines and L
learners against closed forms worked by hand, the `shape: auto` rule on a table whose pick is known, the
refusals of shapes that cannot run (one line, exit 2), `shape: auto` resolved at launch, the headline of issue 56
(sepa_lean on 16 H100s with Qwen3-4B's published config), and `plan --calibration` (measured rates in place of the
assumed ones)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator import cli
from orchestrator.campaign.expand import load_campaign
from orchestrator.config.errors import UserError
from orchestrator.preflight.plan import Cluster, make_plan
from orchestrator.preflight.pool_shape import (
    Cycle,
    PoolWork,
    Shape,
    ShapePlan,
    Step,
    choose,
    cycle,
    frontier,
    misfit,
    shape_plan,
    slot_choices,
)
from orchestrator.preflight.shape_choice import check_shape, resolve_shape, shape_report, with_shape
from tests.unit.preflight.test_shipped_campaigns_fit import QWEN3_4B_2507

ROOT = Path(__file__).resolve().parents[3]
LEAN = ROOT / "campaigns/sepa_lean.yaml"


# ------------------------------------------------------------------------------------------- the cycle, by hand
def test_one_engine_one_learner_is_the_overlapped_pool():
    """g 10, l 3, 8 trials, no KV limit: 8 batches decode at 4x one's rate (0.20 / 0.05), G = 2 x 10 = 20; the one
    learner trains 8 slots, Lw = 24; one trial's own step 10 + 3 = 13: C = 24."""
    c = cycle(Step(10.0, 3.0), 1, 1, 8)
    assert (c.generate_s, c.learn_s, c.own_s, c.seconds) == (20.0, 24.0, 13.0, 24.0)
    assert c.engine_busy == pytest.approx(20 / 24) and c.learner_busy == pytest.approx(1.0)
    assert c.lockstep_s == 44.0


def test_more_engines_and_learners_by_hand():
    """E 2, L 4, k 8: each engine decodes 4 batches at once, at 4x one's rate: G = 10; each learner 2 slots:
    Lw = 6; one trial alone on 2 engines (half a batch each: the rate of half the sequences) 10 + 3: C = 13."""
    c = cycle(Step(10.0, 3.0), 2, 4, 8)
    assert (c.generate_s, c.learn_s, c.own_s, c.seconds) == (10.0, 6.0, 13.0, 13.0)
    assert c.engine_busy == pytest.approx(10 / 13) and c.learner_busy == pytest.approx(6 / 13)
    assert c.busiest_learner == pytest.approx(6 / 13)
    uneven = cycle(Step(10.0, 3.0), 1, 3, 8)  # 3 + 3 + 2 slots: mean 8 x 3 / 3 = 8 s of a 20 s cycle, busiest 9 s
    assert uneven.seconds == 20.0 and uneven.learner_busy == pytest.approx(0.4) and uneven.busiest_learner == 0.45
    assert cycle(Step(10.0, 3.0), 2, 3, 8).learn_s == 9.0  # ceil(8 / 3) = 3 slots on the busiest


def test_a_kv_cache_full_with_one_batch_splits_generation_over_the_engines():
    """One engine's KV cache holds 128 sequences, a trial's batch is 256: 2 trials on each of 4 engines decode at
    one capped batch's rate, G = 2 x 100; a trial alone over 4 engines holds 64 a engine, half the capped rate:
    0.25 / 0.5 x 100 = 50, + 50 training; 2 learners of 4 slots: Lw = 200."""
    c = cycle(Step(100.0, 50.0, batch=256, kv_sequences=128), 4, 2, 8)
    assert (c.generate_s, c.learn_s, c.own_s, c.seconds) == (200.0, 200.0, 100.0, 200.0)
    assert c.engine_busy == 1.0 and c.learner_busy == 1.0
    assert cycle(Step(100.0, 50.0, batch=256, kv_sequences=128), 8, 8, 8).seconds == 100.0  # own step


def _pool(**kw) -> PoolWork:
    base = dict(name="p", gen_s=10.0, learn_s=3.0, batch=1, steps=(10, 10, 10, 10), own_s=(5.0,) * 4, start_s=100.0,
                engine_gpus=1.0, learner_gpus=1.0, engine_cpus=4.0, learner_cpus=4.0, driver_cpus=1.0)
    return PoolWork(**{**base, **kw})


def test_shape_plan_makespan_and_gpu_hours_by_hand():
    """4 trials of 10 steps, 2 slots, 1 engine + 1 learner: C = max(10 x 2 / 4... ) -> generate_factor(2) = 1:
    G = 10, Lw = 6, own 13: C = 13; 2 waves of 10 x 13 + 5 after the pool's 100 s start: 2 GPUs."""
    p = shape_plan([_pool()], Shape(1, 1, 2))
    assert p.cycle.seconds == 13.0 and p.at_once == 2 and p.gpus == 2.0 and p.cpus == 4 + 4 + 2
    assert p.makespan_h == pytest.approx((100 + 2 * (10 * 13 + 5)) / 3600)
    assert p.gpu_hours == pytest.approx(2 * p.makespan_h)
    two = shape_plan([_pool(), _pool(name="q")], Shape(1, 1, 2))  # a pool per model: GPUs add, span the slowest
    assert two.gpus == 4.0 and two.at_once == 4 and two.makespan_h == pytest.approx(p.makespan_h)


def test_slot_choices_are_the_fewest_slots_per_number_of_waves():
    assert slot_choices(20, 20) == [1, 2, 3, 4, 5, 7, 10, 20]
    assert slot_choices(20, 8) == [1, 2, 3, 4, 5, 7, 8]


# ------------------------------------------------------------------------------------------- the auto rule
def _plan(gpus: float, span: float, e: int = 1, lrn: int = 1, k: int = 1) -> ShapePlan:
    return ShapePlan(Shape(e, lrn, k), gpus, 0.0, k, Cycle(1.0, 1.0, 1.0, 1.0, 1.0, 1.0), span)


def test_auto_takes_the_shortest_makespan_within_ten_percent_of_the_lowest_gpu_hours():
    a = _plan(2, 10.0, e=1)  # 20 GPU-hours: the lowest
    b = _plan(4, 5.4, e=3)  # 21.6: within 10% (22), the fastest of those
    c = _plan(8, 3.0, e=7)  # 24: faster, but out
    d = _plan(3, 7.0, e=2)  # 21
    pick, near = choose([a, b, c, d])
    assert pick is b and set(map(id, near)) == {id(a), id(b), id(d)}
    assert choose([a, c])[0] is a
    # equal makespans: fewer GPUs, then fewer learners
    assert choose([_plan(4, 5.0, lrn=2), _plan(4, 5.0, lrn=1), _plan(4.4, 5.0)])[0].shape.learners == 1
    assert frontier([a, b, c, d]) == [a, d, b, c]
    assert frontier([a, _plan(3, 11.0)]) == [a]


# ------------------------------------------------------------------------------------------- what does not fit
def test_misfit_names_each_limit():
    c = Cluster(16, 128, "test")
    assert misfit([_pool()], Shape(1, 3, 2), c)[0] == "learners"
    assert "hold 17 GPUs, the cluster has 16" in misfit([_pool()], Shape(9, 8, 8), c)[1]
    assert "need 36 CPUs" in misfit([_pool()], Shape(4, 4, 4), Cluster(16, 30, "t"))[1]
    mem = _pool(most_per_learner=3, most_engine_slots=10)
    assert misfit([mem], Shape(1, 1, 4), c)[0] == "learners" and misfit([mem], Shape(1, 2, 4), c) is None
    assert misfit([_pool(steps=(1,) * 12, own_s=(0.0,) * 12, most_engine_slots=10)], Shape(1, 4, 12), c)[0] == "slots"
    assert misfit([_pool(), _pool(name="q")], Shape(4, 4, 4), c) is None
    assert misfit([_pool(), _pool(name="q")], Shape(5, 4, 4), c)[0] == "engines"


# ------------------------------------------------------------------------------------------- properties
works = st.tuples(st.floats(0.1, 1e4), st.floats(0.1, 1e4), st.integers(1, 512), st.floats(1, 1e4))


@settings(max_examples=200, deadline=None)
@given(works, st.integers(1, 64), st.integers(1, 64), st.integers(1, 64))
def test_more_engines_never_slow_generation_and_shares_are_shares(work, engines, learners, k):
    g, lrn, batch, kv = work
    c = cycle(Step(g, lrn, batch, kv), engines, min(learners, k), k)
    more = cycle(Step(g, lrn, batch, kv), engines + 1, min(learners, k), k)
    assert more.generate_s <= c.generate_s * (1 + 1e-12) and more.seconds <= c.seconds * (1 + 1e-12)
    assert 0.0 <= c.engine_busy <= 1.0 + 1e-12 and 0.0 <= c.learner_busy <= 1.0 + 1e-12
    assert c.seconds >= max(c.generate_s, c.learn_s, c.own_s) and c.seconds <= c.lockstep_s + c.own_s
    if learners < k:
        assert cycle(Step(g, lrn, batch, kv), engines, learners + 1, k).learn_s <= c.learn_s


# ------------------------------------------------------------------------------------------- campaigns
@pytest.fixture(scope="module")
def qwen3(tmp_path_factory) -> str:
    d = tmp_path_factory.mktemp("qwen3")
    (d / "config.json").write_text(json.dumps(QWEN3_4B_2507))
    return str(d)


def test_sepa_lean_on_16_gpus_halves_the_makespan_at_under_0_6_of_the_gpu_hours(qwen3):
    """Issue 56's headline, with the cost model's constants as they are and Qwen3-4B's published config (the KV
    cache counted): the auto pick against separate trials (5.3 h, 71.0 GPU-hours)."""
    plan = make_plan(load_campaign(LEAN), cluster=Cluster(16, 128, "--gpus/--cpus"))
    report = shape_report(plan, "H100", 20, resolve=lambda m: qwen3)
    pick = report.pick
    assert all(p.kv_sequences is not None for p in report.pools)
    assert (round(plan.makespan_h, 1), round(plan.gpu_hours, 1)) == (5.3, 71.0)
    assert pick.shape == Shape(9, 7, 20) and pick.gpus == 16
    assert pick.makespan_h <= 0.5 * plan.makespan_h and pick.gpu_hours <= 0.6 * plan.gpu_hours


def _lean(tmp_path, shared: dict) -> Path:
    data = yaml.safe_load(LEAN.read_text())
    data["storage"] = str(tmp_path / "s")
    data["resources"]["shared_base"] = shared
    path = tmp_path / "lean.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_plan_prints_the_shapes_and_why(capsys):
    assert cli.main(["plan", str(LEAN), "--gpus", "16", "--cpus", "128"]) == 0
    out = capsys.readouterr().out.split("pool shapes on 16 GPUs, 128 CPUs (--gpus/--cpus):\n")[1].splitlines()
    assert out[0].split()[:3] == ["trials", "run", "GPUs"] and "learner busy" in out[0] and "engine busy" in out[0]
    assert out[2].split()[:6] == ["separate", "(2", "GPUs", "a", "trial)", "16"]
    assert sum("(auto)" in x for x in out) == 1
    why = [x for x in out if x.strip().startswith("shape: auto would run")]
    assert len(why) == 1 and "within 10% of the lowest GPU-hours" in why[0] and "vs separate trials" in why[0]


def test_plan_of_an_auto_campaign_marks_the_pick_chosen(tmp_path, capsys):
    assert cli.main(["plan", str(_lean(tmp_path, {"slots": 20, "shape": "auto"})), "--gpus", "16"]) == 0
    out = capsys.readouterr().out
    assert "(auto) (chosen)" in out and "shape: auto runs" in out


def test_a_written_shape_that_fits_is_planned_even_outside_the_shapes_tried(tmp_path, capsys):
    """The demo's 10 trials on 4 slots and 2 learners, 2 CPUs: not among the shapes `plan` tries there, but it fits
    (an engine, 2 learners and 4 drivers: 2.0 CPUs) and `make demo` runs it; it gets its own row, where it once got
    'does not fit: not planned'."""
    data = yaml.safe_load((ROOT / "campaigns" / "demo.yaml").read_text())
    data["resources"]["shared_base"] = {"slots": 4, "learners": 2}
    data["storage"] = str(tmp_path / "store")
    path = tmp_path / "demo.yaml"
    path.write_text(yaml.safe_dump(data))
    assert cli.main(["plan", str(path), "--gpus", "0", "--cpus", "2"]) == 0
    out = capsys.readouterr().out
    rows = [x for x in out.splitlines() if "(as written)" in x]
    assert len(rows) == 1 and rows[0].startswith("pool: 1 engine + 2 learners, 4 slots (as written)"), out
    assert "does not fit" not in out


@pytest.mark.parametrize(("shared", "args", "key", "says"), [
    ({"slots": 4, "learners": 6}, ["--gpus", "16"], "resources.shared_base.learners", "at most 4"),
    ({"slots": 4, "learners": 6}, [], "resources.shared_base.learners", "at most 4"),  # whatever the cluster
    ({"slots": 8, "learners": 4, "engines": 14}, ["--gpus", "16"], "resources.shared_base.engines",
     "hold 18 GPUs, the cluster has 16; fits: at most 12 engines with 4 learners, or "),
    ({"slots": 8, "learners": 4, "engines": 4}, ["--gpus", "16", "--cpus", "30"], "resources.shared_base.engines",
     "need 40 CPUs"),
])
def test_a_shape_the_cluster_cannot_hold_is_one_line_exit_2(tmp_path, capsys, shared, args, key, says):
    assert cli.main(["plan", str(_lean(tmp_path, shared)), *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f": {key}: " in err[0] and says in err[0], err
    assert "Traceback" not in err[0] and ("fits:" in err[0] or "at most" in err[0])


def test_slots_a_learner_gpu_cannot_hold_are_refused_naming_the_learners_that_fit(tmp_path, qwen3):
    from orchestrator.preflight.memory_check import check_campaign_learners

    campaign = load_campaign(_lean(tmp_path, {"slots": 60, "learners": 2, "engines": 1}))  # 30 a learner, 29 fit
    with pytest.raises(UserError) as e:
        check_campaign_learners(campaign, resolve=lambda m: qwen3)
    msg = str(e.value)
    assert "\n" not in msg and "resources.shared_base.learners: 60 slots on 2 learners put 30" in msg
    assert "at most 29 slot(s) a learner fit: learners 3 or more" in msg
    ok = load_campaign(_lean(tmp_path, {"slots": 60, "learners": 3, "engines": 1}))
    assert any("(20 a learner, 3 learners)" in x for x in check_campaign_learners(ok, resolve=lambda m: qwen3))
    with pytest.raises(UserError) as e:  # the shape check names the learners too
        check_shape(campaign, Cluster(16, 1000, "test"), resolve=lambda m: qwen3)
    assert ": resources.shared_base.learners: " in str(e.value) and "fits: " in str(e.value)


def test_auto_resolves_to_the_plans_pick_before_the_pool_starts(tmp_path, qwen3):
    campaign = load_campaign(_lean(tmp_path, {"slots": 20, "shape": "auto"}))
    resolved = resolve_shape(campaign, Cluster(16, 128, "test"), "H100", resolve=lambda m: qwen3)
    sbs = {t.trial.resources.shared_base.model_dump_json() for t in resolved.trials}
    assert len(sbs) == 1
    sb = resolved.trials[0].trial.resources.shared_base
    assert (sb.engines, sb.learners, sb.slots, sb.shape) == (9, 7, 20, None)
    assert resolved.trials[0].config["resources"]["shared_base"]["learners"] == 7
    assert resolved.config.resources.shared_base.learners == 7
    check_shape(resolved, Cluster(16, 128, "test"), resolve=lambda m: qwen3)  # the pick fits
    # on 4 GPUs another shape; a resumed campaign keeps the one it started with
    small = resolve_shape(campaign, Cluster(4, 128, "test"), "H100", resolve=lambda m: qwen3)
    assert small.trials[0].trial.resources.shared_base.engines + small.trials[0].trial.resources.shared_base.learners <= 4
    started = {t.name: t.config for t in resolved.trials}
    again = resolve_shape(campaign, Cluster(4, 128, "test"), "H100", resolve=lambda m: qwen3, started=started)
    assert again.trials[0].config == resolved.trials[0].config
    assert resolve_shape(with_shape(campaign, Shape(2, 1, 4)), Cluster(4, 8, "t"), "H100").trials[0].trial \
        .resources.shared_base.engines == 2  # a written shape is left as it is
    with pytest.raises(UserError) as e:
        resolve_shape(campaign, Cluster(1, 128, "test"), "H100")
    assert "\n" not in str(e.value) and "shape: auto: no pool fits 1 GPUs" in str(e.value)


def test_run_resolves_auto_for_the_connected_cluster(tmp_path, monkeypatch, capsys):
    from orchestrator.preflight import cluster
    from orchestrator.tune.launch import shaped

    monkeypatch.setattr(cluster, "capacity", lambda: cluster.Capacity([{"GPU": 16.0, "CPU": 128.0}]))
    campaign = load_campaign(_lean(tmp_path, {"slots": 20, "shape": "auto"}))
    out = shaped(campaign)
    sb = out.trials[0].trial.resources.shared_base
    assert sb.shape is None and sb.learners >= 1 and sb.engines >= 1
    assert capsys.readouterr().out.startswith(f"shape: auto -> {sb.engines} engine(s), {sb.learners} learner(s)")
    bad = load_campaign(_lean(tmp_path, {"slots": 8, "learners": 4, "engines": 14}))
    with pytest.raises(UserError):
        shaped(bad)
    assert math.isfinite(out.trials[0].trial.resources.shared_base.slots)


def test_a_lone_trial_refuses_auto(tmp_path, monkeypatch):
    from orchestrator.tune import launch
    from orchestrator.tune.launch import run_single_trial

    def no_ray(*a, **k):
        raise RuntimeError("the refusal must come before Ray starts")

    monkeypatch.setattr(launch, "ensure_ray", no_ray)

    cfg = load_campaign(_lean(tmp_path, {"slots": 1, "shape": "auto"})).trials[0].trial
    with pytest.raises(UserError, match="set learners and engines instead"):
        run_single_trial(cfg, tmp_path / "t")


def test_run_paragraph_of_a_shaped_pool_is_the_pipelined_plan(tmp_path, monkeypatch):
    from orchestrator.preflight.shape_choice import run_paragraph
    from orchestrator.preflight.shared_plan import run_paragraph as plain

    monkeypatch.setattr("ray.cluster_resources", lambda: {"GPU": 16.0, "CPU": 128.0})
    campaign = load_campaign(_lean(tmp_path, {"slots": 20, "learners": 7, "engines": 9}))
    plan = make_plan(load_campaign(LEAN), cluster=Cluster(16, 128, "test"))
    p = shape_report(plan, "H100", 20).plans
    want = next(x for x in p if x.shape == Shape(9, 7, 20))
    text = run_paragraph(campaign)
    assert text.startswith("plan: 20 trials on a shared base of 9 engines + 7 learners, 20 slots a pool (1 pool(s), "
                           f"16 GPU(s)): cycle about {want.cycle.seconds:.1f} s, about {want.gpu_hours:.1f} "
                           "GPU-hours"), text
    assert "Separate instead: 20 trials, 800 steps, about 71.0 GPU-hours" in text
    one = load_campaign(_lean(tmp_path, {"slots": 5}))  # one learner, num_workers engines: the lock-step paragraph
    assert run_paragraph(one) == plain(one)


# ------------------------------------------------------------------------------------------- a calibration
CAL = {"device": "cpu, 2 cores", "model": "tiny", "learner_tokens_per_s": 5000.0, "adapter_export_s": 0.05,
       "adapter_load_s": 0.1, "startup_s": 30.0,
       "decode": [{"sequences": 64, "tokens_per_s": 3200}, {"sequences": 1, "tokens_per_s": 200},
                  {"sequences": 16, "tokens_per_s": 1600}]}


def test_decode_rate_interpolates_the_measured_points():
    from orchestrator.config.calibration import Calibration

    cal = Calibration.model_validate(CAL)
    assert [p.sequences for p in cal.decode] == [1, 16, 64]  # sorted
    assert cal.decode_rate(0.5) == 100.0  # below the first point: proportional
    assert cal.decode_rate(1) == 200.0 and cal.decode_rate(8.5) == 900.0  # 200 + 7.5 / 15 x 1400
    assert cal.decode_rate(40) == 2400.0 and cal.decode_rate(64) == cal.decode_rate(1000) == 3200.0


def test_a_calibrated_cycle_by_hand():
    """rate 100 a sequence up to 4 sequences, flat after: a trial's batch of 2 decodes at 200 tokens/s, 4 trials'
    8 sequences on one engine at 400: factor 4 x 200 / 400 = 2; each cycle loads 4 adapters (0.5 s each) on the
    engine and each slot's export (1 s) runs on its learner."""
    from orchestrator.config.calibration import Calibration

    cal = Calibration.model_validate({**CAL, "decode": [{"sequences": 4, "tokens_per_s": 400},
                                                        {"sequences": 8, "tokens_per_s": 400}]})
    c = cycle(Step(10.0, 3.0, batch=2, rate=cal.decode_rate, export_s=1.0, load_s=0.5), 1, 2, 4)
    assert c.generate_s == 10 * 2 + 4 * 0.5 and c.learn_s == 2 * (3 + 1)
    assert c.own_s == 10 * 1 + 0.5 + 3 + 1 and c.seconds == 22.0
    assert c.learner_busy == pytest.approx(4 * 4 / 2 / 22)


def test_plan_with_a_calibration_uses_the_measured_rates(tmp_path, capsys):
    from orchestrator.config.calibration import Calibration
    from orchestrator.preflight.cost_model import step_tokens

    path = tmp_path / "cal.yaml"
    path.write_text(yaml.safe_dump(CAL))
    demo = ROOT / "campaigns/demo.yaml"
    campaign = load_campaign(demo)
    cfg = campaign.trials[0].trial
    cal = Calibration.model_validate(CAL)
    tok = step_tokens(cfg)
    per_engine = cfg.rollout.prompts_per_step * cfg.rollout.n / cfg.rollout.num_workers
    want = ((tok.generated + tok.eval_generated) / (cal.decode_rate(per_engine) * cfg.rollout.num_workers)
            + (tok.scored + tok.trained) / 5000.0 + 0.15)
    from orchestrator.preflight.plan import PlanRequest
    from orchestrator.preflight.shared_plan import with_shared_base

    plan = make_plan(with_shared_base(campaign, None), PlanRequest(calibration=str(path)),
                     cluster=Cluster(0, 8, "test"))
    assert plan.trials[0].step_s == pytest.approx(want) and plan.trials[0].source == "calibration"
    assert cli.main(["plan", str(demo), "--calibration", str(path)]) == 0
    out = capsys.readouterr().out
    assert "step time from: calibration (measured on cpu, 2 cores with tiny" in out
    assert f"{want:.1f} s" in out and "rates measured (cpu, 2 cores, tiny: --calibration)" in out


@pytest.mark.parametrize(("text", "says"), [
    (None, "no such file"),
    ("device: cpu\nmodel: tiny\n", "decode: field required"),
    (yaml.safe_dump({**CAL, "learner_tokens_per_s": 0}), "learner_tokens_per_s: input should be greater than 0"),
])
def test_a_bad_calibration_file_is_one_line_exit_2(tmp_path, capsys, text, says):
    path = tmp_path / "cal.yaml"
    if text is not None:
        path.write_text(text)
    assert cli.main(["plan", str(ROOT / "campaigns/demo.yaml"), "--calibration", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and says in err[0].lower(), err
