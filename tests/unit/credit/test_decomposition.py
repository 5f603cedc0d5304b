"""Surprisal-variance decomposition: exact identities (property tests) and the paper's two failure cases."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from workers.credit import shannon_entropy
from workers.credit.decomposition import class_moments, decompose, decomposition_metrics
from workers.credit.token import sepa_pool


def _sampled(logits: torch.Tensor, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(surprisal, entropy) of `tokens` `[..., T]` under softmax(logits `[..., T, V]`)."""
    logp = torch.log_softmax(logits.double(), dim=-1)
    s = -logp.gather(-1, tokens[..., None]).squeeze(-1)
    return s, shannon_entropy(logits.double())


@st.composite
def batches(draw):
    b, t, v = draw(st.integers(1, 5)), draw(st.integers(1, 9)), draw(st.integers(2, 12))
    seed = draw(st.integers(0, 2**31 - 1))
    g = torch.Generator().manual_seed(seed)
    scale = draw(st.floats(0.1, 8.0))
    logits = torch.randn(b, t, v, generator=g, dtype=torch.float64) * scale
    tokens = torch.randint(0, v, (b, t), generator=g)
    lengths = torch.randint(0, t + 1, (b,), generator=g)
    mask = torch.arange(t)[None, :] < lengths[:, None]
    planning = torch.rand(b, t, generator=g) < draw(st.floats(0.0, 1.0))
    lam = draw(st.floats(0.0, 1.0))
    return logits, tokens, mask, planning, lam


@settings(max_examples=200, deadline=None)
@given(batches())
def test_parts_add_exactly_to_surprisal_variance(batch):
    logits, tokens, mask, planning, lam = batch
    s, h = _sampled(logits, tokens)
    d = decompose(s, h, mask, planning, sepa_lambda=lam)
    for cls, sel in (("exec", mask & ~planning), ("plan", mask & planning)):
        assert d[f"{cls}_n"] == int(sel.sum())
        if not sel.any():
            assert math.isnan(d[f"{cls}_surprisal_var"])
            continue
        sv = s[sel].numpy()
        hv = h[sel].numpy()
        ref = float(np.var(sv))  # independent of the implementation's sums
        tol = 1e-9 * max(1.0, ref)
        assert d[f"{cls}_surprisal_var"] == pytest.approx(ref, abs=tol)
        assert d[f"{cls}_entropy_var"] == pytest.approx(float(np.var(hv)), abs=tol)
        assert d[f"{cls}_noise_var"] == pytest.approx(float(np.var(sv - hv)), abs=tol)
        three = d[f"{cls}_entropy_var"] + d[f"{cls}_noise_var"] + 2 * d[f"{cls}_cov"]
        two = d[f"{cls}_entropy_part"] + d[f"{cls}_noise_part"]
        assert three == pytest.approx(ref, abs=tol)
        assert two == pytest.approx(ref, abs=tol)
        if ref > 1e-12:
            assert d[f"{cls}_noise_share"] == pytest.approx(d[f"{cls}_noise_part"] / ref, rel=1e-12)
    if lam > 0 and (mask & ~planning).any():
        # the removed variance is exactly the before - after surprisal variance of SEPA's pooled signal
        pooled = sepa_pool(torch.where(mask, s, 0.0), mask, planning & mask, lam)
        after = float(np.var(pooled[mask & ~planning].numpy()))
        assert d["exec_surprisal_var_after"] == pytest.approx(after, abs=1e-9 * max(1.0, after))
        assert d["exec_removed_entropy"] + d["exec_removed_noise"] == pytest.approx(
            d["exec_removed"], abs=1e-9 * max(1.0, d["exec_surprisal_var"]))
        assert d["exec_removed"] == pytest.approx(d["exec_surprisal_var"] - after, abs=1e-9 * max(1.0, after))


def _peaked(v: int, p_top: float) -> torch.Tensor:
    """Logits of a distribution with mass p_top on token 0 and the rest spread evenly."""
    p = torch.full((v,), (1 - p_top) / (v - 1), dtype=torch.float64)
    p[0] = p_top
    return p.log()


def test_peaked_sampled_in_its_tail_and_flat_sampled_at_its_mode():
    """The paper's two directions: a confident distribution sampled in its 5% tail (high surprisal, low
    entropy: noise > 0) and a spread one sampled at its mode (low surprisal, high entropy: noise < 0)."""
    v = 16
    peaked = _peaked(v, 0.95)
    flat = _peaked(v, 0.10)  # mode 0.10 vs 0.06 for the others: nearly uniform
    logits = torch.stack([peaked, flat])[None]  # [1, 2, V]
    tokens = torch.tensor([[5, 0]])  # tail of the peaked one, mode of the flat one
    s, h = _sampled(logits, tokens)
    noise = s - h
    assert s[0, 0] > h[0, 0] and noise[0, 0] > 0  # peaked, tail: surprisal overstates uncertainty
    assert s[0, 1] < h[0, 1] and noise[0, 1] < 0  # flat, mode: surprisal understates it
    assert s[0, 0] > s[0, 1] and h[0, 0] < h[0, 1]  # the ordering by surprisal inverts the ordering by entropy
    d = decompose(s, h, torch.ones_like(s, dtype=torch.bool))
    # high entropy goes with negative noise: the covariance is negative and the noise part exceeds the variance
    assert d["exec_cov"] < 0
    assert d["exec_noise_var"] > d["exec_surprisal_var"]
    assert d["exec_noise_share"] > 1.0 and d["exec_entropy_part"] < 0


def test_one_distribution_many_samples_is_all_noise_and_uniform_is_none():
    v = 8
    peaked = _peaked(v, 0.9)
    logits = peaked.expand(1, 6, v)
    tokens = torch.tensor([[0, 0, 3, 0, 5, 0]])  # mode and tail draws from the same distribution
    s, h = _sampled(logits, tokens)
    d = decompose(s, h, torch.ones_like(s, dtype=torch.bool))
    assert d["exec_entropy_var"] == pytest.approx(0.0, abs=1e-15)
    assert d["exec_noise_share"] == pytest.approx(1.0)
    # uniform distributions of different sizes: every draw has S = H = log k, so all variance is entropy
    logits = torch.full((1, 3, 12), -1e9, dtype=torch.float64)
    for i, k in enumerate((2, 5, 12)):
        logits[0, i, :k] = 0.0
    s, h = _sampled(logits, torch.tensor([[1, 4, 7]]))
    d = decompose(s, h, torch.ones_like(s, dtype=torch.bool))
    assert d["exec_noise_var"] == pytest.approx(0.0, abs=1e-12)
    assert d["exec_noise_share"] == pytest.approx(0.0, abs=1e-12)


def test_on_policy_samples_have_zero_mean_noise_and_variance_near_varentropy():
    """E[S | context] = H, so on-policy noise has mean ~0, Cov(H, N) ~ 0 and Var(N) ~ mean varentropy."""
    from workers.credit import varentropy

    g = torch.Generator().manual_seed(0)
    logits = torch.randn(1, 4000, 20, generator=g, dtype=torch.float64) * 2.0
    tokens = torch.multinomial(torch.softmax(logits[0], -1), 1, generator=g).T
    s, h = _sampled(logits, tokens)
    d = decompose(s, h, torch.ones_like(s, dtype=torch.bool))
    ve = float(varentropy(logits).mean())
    assert abs(d["exec_surprisal_mean"] - d["exec_entropy_mean"]) < 0.05
    assert abs(d["exec_cov"]) < 0.05 * d["exec_surprisal_var"]
    assert d["exec_noise_var"] == pytest.approx(ve, rel=0.08)


def test_planning_classes_and_metric_names():
    s = torch.tensor([[1.0, 2.0, 3.0, 9.0]])
    h = torch.tensor([[1.0, 1.0, 1.0, 1.0]])
    mask = torch.tensor([[True, True, True, False]])
    plan = torch.tensor([[False, True, False, True]])
    m = decomposition_metrics(s, h, mask, plan, sepa_lambda=1.0)
    assert m["credit/decomp_exec_n"] == 2 and m["credit/decomp_plan_n"] == 1  # padding never counts
    assert m["credit/decomp_exec_surprisal_var"] == pytest.approx(1.0)  # {1, 3}
    assert m["credit/decomp_exec_noise_share"] == pytest.approx(1.0)  # constant entropy
    assert m["credit/decomp_exec_surprisal_var_after"] == pytest.approx(0.0)  # lambda 1 pools to the mean
    assert m["credit/decomp_exec_removed_noise_share"] == pytest.approx(1.0)
    assert math.isnan(m["credit/decomp_plan_surprisal_var"]) is False
    assert m["credit/decomp_plan_surprisal_var"] == 0.0
    with pytest.raises(ValueError):
        decompose(s, h[:, :3], mask)
    empty = class_moments(s, h, torch.zeros_like(s))
    assert float(empty["n"]) == 0 and math.isnan(float(empty["surprisal_var"]))
