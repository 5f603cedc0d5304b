"""Learner-intervention math (KL estimators, chunked entropy, entropy floors, schedules) and its config,
against direct per-element computations."""

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from workers.objectives.interventions import EntropyFloorConfig, InterventionsConfig, KLConfig, RVFilterConfig
from workers.objectives.losses import aggregate, entropy_floor_penalty, entropy_from_logits, kl_penalty
from workers.objectives.settings import KL_ESTIMATORS, scheduled_value

# --- KL -----------------------------------------------------------------------------------------------------------


def direct_kl(lp: float, ref: float, name: str) -> float:
    d = lp - ref
    if name in ("kl", "k1"):
        return d
    if name == "abs":
        return abs(d)
    if name in ("mse", "k2"):
        return 0.5 * d * d
    x = ref - lp
    return min(10.0, max(-10.0, math.exp(x) - x - 1.0))


def test_kl_estimator_names():
    base = {"kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3"}
    assert set(KL_ESTIMATORS) == base | {b + "+" for b in base}
    assert len(KL_ESTIMATORS) == 14


@pytest.mark.parametrize("estimator", KL_ESTIMATORS)
def test_kl_estimators_match_direct_per_element(estimator):
    g = torch.Generator().manual_seed(0)
    lp = -torch.rand(3, 5, generator=g, dtype=torch.float64) * 4
    ref = -torch.rand(3, 5, generator=g, dtype=torch.float64) * 4
    lp[0, 0], ref[0, 0] = -0.1, -30.0  # k3 far in the clamped region (x = -29.9 -> 28.9 -> 10)
    lp[0, 1], ref[0, 1] = -25.0, -0.5  # x = 24.5: exp huge -> clamped to 10
    lp[0, 2] = ref[0, 2]  # identical: every estimator 0
    lp_in, ref_in = lp.clone(), ref.clone()
    out = kl_penalty(lp, ref, estimator)
    name = estimator.removesuffix("+")
    expected = [[direct_kl(a, b, name) for a, b in zip(ra, rb, strict=True)]
                for ra, rb in zip(lp.tolist(), ref.tolist(), strict=True)]
    np.testing.assert_allclose(out.detach().numpy(), np.array(expected), rtol=1e-12, atol=1e-12)
    assert torch.equal(lp, lp_in) and torch.equal(ref, ref_in)  # inputs untouched
    assert out[0, 2] == 0.0


def test_k3_is_clamped_at_ten_and_nonnegative():
    lp = torch.tensor([[-0.01, -40.0, -1.0]], dtype=torch.float64)
    ref = torch.tensor([[-50.0, -0.01, -1.0]], dtype=torch.float64)
    out = kl_penalty(lp, ref, "k3")
    assert out[0, 0] == 10.0 and out[0, 1] == 10.0 and out[0, 2] == 0.0
    assert (kl_penalty(-torch.rand(50) * 5, -torch.rand(50) * 5, "low_var_kl") >= 0).all()


def test_k3_gradient_finite_even_where_exp_would_overflow():
    lp = torch.tensor([-200.0, -1.0, -0.3], requires_grad=True)  # float32: exp(199) = inf
    ref = torch.tensor([-0.5, -1.2, -0.3])
    kl_penalty(lp, ref, "k3").sum().backward()
    assert torch.isfinite(lp.grad).all()
    assert lp.grad[0] == 0.0  # clamped region: no gradient
    assert math.isclose(lp.grad[1].item(), 1.0 - math.exp(-0.2), abs_tol=1e-6)  # d/dlp = 1 - exp(ref - lp)


@pytest.mark.parametrize("base", ["kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3"])
def test_plus_variants_value_of_named_gradient_of_k2(base):
    g = torch.Generator().manual_seed(1)
    lp0 = -torch.rand(4, 6, generator=g, dtype=torch.float64) * 3
    ref = -torch.rand(4, 6, generator=g, dtype=torch.float64) * 3
    weights = torch.rand(4, 6, generator=g, dtype=torch.float64)  # a non-uniform upstream gradient

    def grad_of(est):
        lp = lp0.clone().requires_grad_(True)
        out = kl_penalty(lp, ref, est)
        (out * weights).sum().backward()
        return out.detach(), lp.grad

    plus_val, plus_grad = grad_of(base + "+")
    named_val, named_grad = grad_of(base)
    _, k2_grad = grad_of("k2")
    torch.testing.assert_close(plus_val, named_val, rtol=0, atol=1e-12)
    torch.testing.assert_close(plus_grad, k2_grad, rtol=0, atol=1e-12)
    torch.testing.assert_close(k2_grad, weights * (lp0 - ref), rtol=1e-12, atol=1e-12)  # d 0.5 d^2 = d
    if base not in ("mse", "k2"):
        assert not torch.allclose(named_grad, k2_grad)  # the straight-through actually changes something


def test_unknown_kl_estimator_lists_allowed():
    with pytest.raises(ValueError, match=r"allowed: kl, k1, abs, mse, k2, low_var_kl, k3, kl\+"):
        kl_penalty(torch.zeros(1, 1), torch.zeros(1, 1), "k4")


def test_kl_token_mean_through_aggregate():
    lp = torch.tensor([[-1.0, -2.0, -9.0]])
    ref = torch.tensor([[-1.5, -1.0, 0.0]])
    mask = torch.tensor([[True, True, False]])
    torch.testing.assert_close(aggregate(kl_penalty(lp, ref, "k1"), mask, "token-mean"), torch.tensor(-0.25))


# --- entropy ------------------------------------------------------------------------------------------------------


def direct_entropy(logits: torch.Tensor, temperature: float) -> np.ndarray:
    """-sum p log p per position, element by element in float64 Python."""
    z = logits.double().numpy() / temperature
    out = np.zeros(z.shape[:-1])
    for idx in np.ndindex(*z.shape[:-1]):
        row = z[idx]
        m = max(row)
        ex = [math.exp(v - m) for v in row]
        s = sum(ex)
        out[idx] = -sum((e / s) * math.log(e / s) for e in ex if e > 0)
    return out


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 10_000), b=st.integers(1, 3), t=st.integers(0, 6), v=st.integers(1, 40),
       chunk=st.integers(1, 25), temp=st.floats(0.25, 3.0))
def test_chunked_entropy_equals_unchunked_and_direct(seed, b, t, v, chunk, temp):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(b, t, v, generator=g, dtype=torch.float64) * 4
    before = logits.clone()
    whole = entropy_from_logits(logits, temperature=temp)
    chunked = entropy_from_logits(logits, temperature=temp, chunk_size=chunk)
    assert chunked.shape == (b, t)
    torch.testing.assert_close(chunked, whole, rtol=0, atol=1e-12)
    np.testing.assert_allclose(chunked.numpy(), direct_entropy(logits, temp), rtol=1e-9, atol=1e-10)
    assert torch.equal(logits, before)


@settings(max_examples=8, deadline=None)
@given(seed=st.integers(0, 10_000), chunk=st.integers(1, 7), temp=st.floats(0.5, 2.0))
def test_chunked_entropy_gradient_equals_unchunked_and_is_finite(seed, chunk, temp):
    g = torch.Generator().manual_seed(seed)
    base = torch.randn(2, 3, 11, generator=g, dtype=torch.float64) * 5
    base[0, 0, 0] = 60.0  # nearly one-hot position

    def grad(chunk_size):
        x = base.clone().requires_grad_(True)
        entropy_from_logits(x, temperature=temp, chunk_size=chunk_size).sum().backward()
        return x.grad

    g_chunk, g_whole = grad(chunk), grad(None)
    assert torch.isfinite(g_chunk).all() and g_chunk.abs().sum() > 0
    torch.testing.assert_close(g_chunk, g_whole, rtol=1e-10, atol=1e-12)


def test_entropy_gradient_matches_analytic():
    # dH/dz_j = -p_j (log p_j + H) at temperature 1
    z = torch.tensor([[[1.0, -0.5, 2.0, 0.0]]], dtype=torch.float64, requires_grad=True)
    entropy_from_logits(z, chunk_size=1).sum().backward()
    p = torch.softmax(z.detach(), -1)
    h = -(p * p.log()).sum(-1, keepdim=True)
    torch.testing.assert_close(z.grad, -p * (p.log() + h))


def test_entropy_uniform_bf16_and_errors():
    uniform = torch.zeros(2, 3, 16, dtype=torch.bfloat16)
    h = entropy_from_logits(uniform, chunk_size=4)
    assert h.dtype == torch.float32
    torch.testing.assert_close(h, torch.full((2, 3), math.log(16)))
    assert entropy_from_logits(torch.zeros(2, 0, 5)).shape == (2, 0)
    with pytest.raises(ValueError, match="chunk_size"):
        entropy_from_logits(uniform, chunk_size=0)
    with pytest.raises(ValueError, match="temperature"):
        entropy_from_logits(uniform, temperature=0.0)


def test_entropy_bonus_loss_sign_raises_entropy():
    # One SGD step on loss = -coeff * token-mean(H) must increase the entropy.
    z = torch.tensor([[[3.0, 0.0, -1.0]]], requires_grad=True)
    mask = torch.ones(1, 1, dtype=torch.bool)
    h0 = entropy_from_logits(z)
    (-0.1 * aggregate(h0, mask, "token-mean")).backward()
    with torch.no_grad():
        assert entropy_from_logits(z - 1.0 * z.grad) > h0.detach()


# --- entropy floor ------------------------------------------------------------------------------------------------


def direct_floor(ent, masks, floors, coefs):
    total = 0.0
    for c, floor in floors.items():
        vals = [e for e, m in zip(ent.flatten().tolist(), masks[c].flatten().tolist(), strict=True) if m]
        if vals:
            total += coefs[c] * max(0.0, floor - sum(vals) / len(vals)) ** 2
    return total


def test_entropy_floor_against_direct():
    g = torch.Generator().manual_seed(3)
    ent = torch.rand(3, 6, generator=g, dtype=torch.float64) * 2
    resp = torch.ones(3, 6, dtype=torch.bool)
    resp[2, 4:] = False
    planning = torch.zeros_like(resp)
    planning[0, :2] = True
    planning[1, 3] = True
    masks = {"planning": planning, "execution": resp & ~planning, "all": resp}
    floors = {"planning": 1.9, "execution": 1.5, "all": 0.1}
    coefs = {"planning": 0.3, "execution": 2.0, "all": 5.0}
    pen, metrics = entropy_floor_penalty(ent, masks, floors, coefs)
    assert math.isclose(float(pen), direct_floor(ent, masks, floors, coefs), rel_tol=1e-12)
    assert float(pen) > 0
    for c in floors:
        mean_c = ent[masks[c]].mean().item()
        assert math.isclose(metrics[f"entropy/{c}_mean"], mean_c, rel_tol=1e-12)
        assert math.isclose(metrics[f"entropy/{c}_floor_penalty"],
                            coefs[c] * max(0.0, floors[c] - mean_c) ** 2, rel_tol=1e-12, abs_tol=1e-15)
    assert metrics["entropy/all_floor_penalty"] == 0.0  # mean above the floor


def test_entropy_floor_empty_class_adds_zero_and_no_nan():
    ent = torch.rand(2, 4, dtype=torch.float64, requires_grad=True)
    masks = {"planning": torch.zeros(2, 4, dtype=torch.bool), "all": torch.ones(2, 4, dtype=torch.bool)}
    pen, metrics = entropy_floor_penalty(ent, masks, {"planning": 5.0, "all": 3.0}, {"planning": 1.0, "all": 1.0})
    only_all, _ = entropy_floor_penalty(ent, masks, {"all": 3.0}, {"all": 1.0})
    assert float(pen.detach()) == float(only_all.detach())
    assert metrics["entropy/planning_floor_penalty"] == 0.0 and metrics["entropy/planning_tokens"] == 0.0
    assert "entropy/planning_mean" not in metrics
    assert all(math.isfinite(v) for v in metrics.values())
    pen.backward()
    assert torch.isfinite(ent.grad).all()
    torch.testing.assert_close(ent.grad, torch.full((2, 4), -2 * (3.0 - ent.detach().mean().item()) / 8,
                                                    dtype=torch.float64))


def test_entropy_floor_zero_when_mean_at_or_above_floor():
    ent = torch.full((2, 3), 0.7, requires_grad=True)
    masks = {"all": torch.ones(2, 3)}
    pen, _ = entropy_floor_penalty(ent, masks, {"all": 0.7}, {"all": 10.0})
    assert float(pen.detach()) == 0.0
    pen.backward()
    assert torch.equal(ent.grad, torch.zeros(2, 3))
    with pytest.raises(ValueError, match="need both a mask and a coef"):
        entropy_floor_penalty(ent, masks, {"planning": 0.1}, {"planning": 1.0})


# --- schedules ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["constant", "linear", "cosine"])
def test_schedule_endpoints(kind):
    end_value = 2.0 if kind == "constant" else 0.5
    assert scheduled_value(2.0, 0.5, 0.0, kind) == 2.0
    assert math.isclose(scheduled_value(2.0, 0.5, 1.0, kind), end_value)
    assert math.isclose(scheduled_value(2.0, 0.5, 7.0, kind), end_value)  # progress clamped
    assert scheduled_value(2.0, 0.5, -1.0, kind) == 2.0


def test_schedule_midpoints_and_unknown():
    assert math.isclose(scheduled_value(0.0, 1.0, 0.25, "linear"), 0.25)
    assert math.isclose(scheduled_value(0.0, 1.0, 0.5, "cosine"), 0.5)
    assert math.isclose(scheduled_value(0.0, 1.0, 0.25, "cosine"), (1 - math.cos(math.pi / 4)) / 2)
    with pytest.raises(ValueError, match="allowed: constant, linear, cosine"):
        scheduled_value(0.0, 1.0, 0.5, "step")


# --- config -------------------------------------------------------------------------------------------------------


def test_defaults_are_off():
    cfg = InterventionsConfig()
    assert not cfg.entropy_bonus.is_active and not cfg.kl.is_active
    assert not cfg.rv_filter.is_active and not cfg.entropy_floor.is_active
    assert cfg.kl.estimator == "low_var_kl" and cfg.rv_filter.value == 1.0 and cfg.rv_filter.include_zero
    assert InterventionsConfig.model_validate({}) == cfg


def test_config_validation_errors():
    with pytest.raises(ValidationError, match="unknown KL estimator 'k4'"):
        KLConfig(estimator="k4")
    assert KLConfig(estimator="k3+", coef=0.01).is_active
    with pytest.raises(ValidationError, match="extra"):
        InterventionsConfig.model_validate({"kl": {"coef": 0.1, "kl_loss_coef": 0.1}})
    with pytest.raises(ValidationError, match="extra"):
        InterventionsConfig.model_validate({"entropy": {}})
    for bad in ({"value": 0.0}, {"value": 1.5}, {"prob_mode": "rank"}, {"loss_scaling": "log"},
                {"strategy": "top_k"}):
        with pytest.raises(ValidationError):
            RVFilterConfig(**bad)
    with pytest.raises(ValidationError):
        InterventionsConfig.model_validate({"entropy_bonus": {"coeff": -0.1}})
    with pytest.raises(ValidationError):
        InterventionsConfig.model_validate({"entropy_bonus": {"coeff": float("nan")}})
    with pytest.raises(ValidationError):
        InterventionsConfig.model_validate({"entropy_bonus": {"chunk_size": 0}})
    with pytest.raises(ValidationError, match="logits_chunk"):  # no longer read: only its default still loads
        InterventionsConfig.model_validate({"entropy_bonus": {"chunk_size": 64}})
    assert InterventionsConfig.model_validate({"entropy_bonus": {"chunk_size": 1024}}).entropy_bonus.chunk_size == 1024
    with pytest.raises(ValidationError):
        EntropyFloorConfig.model_validate({"reasoning": {"floor": 1.0, "coef": 1.0}})


def test_rv_filter_is_active_only_when_it_can_drop():
    assert not RVFilterConfig(enabled=True).is_active  # value 1 + include_zero keeps everything
    assert RVFilterConfig(enabled=True, value=0.9).is_active
    assert RVFilterConfig(enabled=True, include_zero=False).is_active
    assert not RVFilterConfig(value=0.5).is_active


def test_entropy_floor_config_schedule():
    cfg = EntropyFloorConfig.model_validate({
        "planning": {"floor": 2.0, "coef": 0.5}, "all": {"floor": 1.0, "coef": 0.1},
        "schedule": {"kind": "linear", "start_factor": 1.0, "end_factor": 0.0}})
    assert cfg.is_active
    assert cfg.floors_at(0.0) == {"planning": 2.0, "all": 1.0}
    assert cfg.floors_at(0.5) == {"planning": 1.0, "all": 0.5}
    assert cfg.floors_at(1.0) == {"planning": 0.0, "all": 0.0}
    assert cfg.coefs() == {"planning": 0.5, "all": 0.1}
    assert EntropyFloorConfig.model_validate({"all": {"floor": 1.0}}).floors_at(0.3) == {"all": 1.0}
    assert not EntropyFloorConfig.model_validate({"all": {"floor": 1.0}}).is_active  # coef 0
