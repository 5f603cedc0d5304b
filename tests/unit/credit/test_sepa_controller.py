"""SEPA controller: schedules, gate and lag, state round trips."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from workers.credit import SepaConfig, SepaController


def test_linear_schedule():
    c = SepaController(SepaConfig(steps=100, delay_steps=10))
    assert [c.lambda_for(s) for s in (0, 10, 15, 60, 110, 500)] == [0, 0, 0.05, 0.5, 1.0, 1.0]
    assert SepaController(SepaConfig(steps=0)).lambda_for(1000) == 0.0


def test_gate_is_sticky_and_lags_one_step():
    c = SepaController(SepaConfig(steps=10, correct_rate_gate=0.1))
    assert not c.gate_open and c.lambda_for(5) == 0.0
    c.observe(0.05)
    assert c.lambda_for(5) == 0.0
    c.observe(0.1)  # this batch opens the gate; it affects the next lambda
    assert c.gate_open and c.lambda_for(5) == 0.5
    c.observe(0.0)
    assert c.gate_open and c.metrics(5) == {"sepa_lambda": 0.5, "sepa_gate_open": 1.0}
    c.observe(float("nan"))
    assert c.gate_open


def test_auto_schedule_against_hand_computation():
    cfg = SepaConfig(schedule="auto", steps=0, warmup=2, ema_decay=0.5, threshold=0.5)
    c = SepaController(cfg)
    batches = [torch.tensor([1.0, 3.0]), torch.tensor([0.0, 2.0, 4.0]), torch.tensor([1.0, 1.2])]
    v = [b.double().var(unbiased=False).item() for b in batches]  # 1, 8/3, 0.01
    c.observe(None, batches[0])
    assert c.lambda_for(3) == 0.0  # still warming up
    c.observe(None, batches[1])
    ema = 0.5 * v[0] + 0.5 * v[1]
    assert c.var_0 == pytest.approx(ema)
    assert c.lambda_for(3) == pytest.approx(1 - min(1 / 0.5, 1))  # ratio 1 -> auto 0
    c.observe(None, batches[2])
    ema2 = 0.5 * ema + 0.5 * v[2]
    assert c.lambda_for(3) == pytest.approx(1 - min(ema2 / ema / 0.5, 1))
    # linear acts as a floor
    c2 = SepaController(cfg.model_copy(update={"steps": 4}))
    assert c2.lambda_for(3) == 0.75


observations = st.lists(
    st.tuples(st.floats(0, 1), st.lists(st.floats(0, 10), max_size=6)), max_size=12
)


@settings(max_examples=100, deadline=None)
@given(first=observations, then=observations, gate=st.floats(0, 1), schedule=st.sampled_from(["linear", "auto"]))
def test_state_round_trip_restores_schedule_exactly(first, then, gate, schedule):
    cfg = SepaConfig(schedule=schedule, steps=7, delay_steps=2, correct_rate_gate=gate, warmup=3, ema_decay=0.7)
    a = SepaController(cfg)
    for rate, vals in first:
        a.observe(rate, torch.tensor(vals))
    b = SepaController(cfg)
    b.load_state_dict(a.state_dict())
    for step, (rate, vals) in enumerate(then):
        assert a.lambda_for(step) == b.lambda_for(step)
        a.observe(rate, torch.tensor(vals))
        b.observe(rate, torch.tensor(vals))
    assert a.state_dict() == b.state_dict()


@pytest.mark.parametrize(
    "patch",
    [
        {"var_ema": float("nan")},
        {"var_ema": -1.0},
        {"var_0": 0.0, "var_ema": 1.0},
        {"warmup_seen": -3},
        {"warmup_seen": 1.5},
        {"gate_open": "yes"},
        {"var_ema": None, "var_0": 1.0},
        {"config": {"schedule": "auto", "steps": 99}},
    ],
)
def test_corrupt_state_rejected_and_state_kept(patch):
    c = SepaController(SepaConfig(schedule="auto", warmup=1))
    c.observe(0.5, torch.tensor([1.0, 2.0]))
    good = c.state_dict()
    with pytest.raises(ValueError):
        c.load_state_dict({**good, **patch})
    assert c.state_dict() == good
    with pytest.raises(ValueError):
        c.load_state_dict({"gate_open": True})
    assert math.isfinite(c.lambda_for(3))
