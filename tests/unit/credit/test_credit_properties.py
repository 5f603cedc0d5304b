"""Properties of each stage of the credit stack, and the paper's worked example."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from workers.credit import CreditConfig, SepaConfig, compute_advantages
from workers.credit.episode import grpo, maxrl, uniform_groups
from workers.credit.token import gtpo_weights, hicra, sepa_pool

floats01 = st.floats(0, 1)


def tensors(shape, lo=0.0, hi=5.0):
    import numpy as np

    return arrays(np.float64, shape, elements=st.floats(lo, hi)).map(torch.from_numpy)


@settings(max_examples=100, deadline=None)
@given(r=tensors((3, 7), -3, 3))
def test_grpo_sums_to_zero_per_group(r):
    torch.testing.assert_close(grpo(r).sum(-1), torch.zeros(3, dtype=r.dtype), atol=1e-9, rtol=0)


@settings(max_examples=100, deadline=None)
@given(n=st.integers(1, 32), data=st.data())
def test_maxrl_binary_identity(n, data):
    k = data.draw(st.integers(1, n))
    r = torch.tensor([1.0] * k + [0.0] * (n - k), dtype=torch.float64)
    a = maxrl(r, eps=1e-12)
    torch.testing.assert_close(a[:k], torch.full((k,), (n - k) / k, dtype=torch.float64))
    if k < n:
        torch.testing.assert_close(a[k:], torch.full((n - k,), -1.0, dtype=torch.float64))


def test_maxrl_all_wrong_is_zero_and_eps_configurable():
    assert torch.equal(maxrl(torch.zeros(4)), torch.zeros(4))
    r = torch.tensor([1.0, 0.0])
    assert maxrl(r, eps=0.25)[0].item() == pytest.approx(0.5 / 0.75)  # (1 - .5) / (.5 + .25)
    assert torch.equal(maxrl(r, eps=0.5), torch.zeros(2))  # mean <= eps: all zero


def test_uniform_groups_counted_as_skipped():
    r = torch.tensor([[1.0, 1.0], [0.0, 0.0], [1.0, 0.0], [0.3, 0.3]])
    uniform, correct = uniform_groups(r)
    assert uniform.tolist() == [True, True, False, True]
    assert correct.tolist() == [True, False, False, False]
    cfg = CreditConfig(advantage_mode="maxrl")
    res = compute_advantages(r, torch.ones(4, 2, 3), torch.ones(4, 2, 3, dtype=torch.bool), cfg)
    assert res.stats["groups_skipped_all_correct"] == 1 and res.stats["groups_skipped_all_wrong"] == 2
    assert torch.all(res.token_advantages[[0, 1, 3]] == 0)


@st.composite
def completions(draw):
    b, t = draw(st.integers(1, 5)), draw(st.integers(1, 16))
    sig = draw(tensors((b, t), 0.0, 8.0))
    lengths = [draw(st.integers(1, t)) for _ in range(b)]
    mask = torch.arange(t)[None, :] < torch.tensor(lengths)[:, None]
    plan = torch.tensor(draw(st.lists(st.lists(st.booleans(), min_size=t, max_size=t), min_size=b, max_size=b)))
    adv = draw(tensors((b,), -3.0, 3.0))
    return sig, mask, plan, adv


@settings(max_examples=150, deadline=None)
@given(c=completions(), beta=floats01)
def test_gtpo_keeps_sign_and_mean_without_clamping(c, beta):
    sig, mask, _, adv = c
    w = gtpo_weights(sig, mask, beta)  # beta <= 1 never needs the max(0, .) clamp
    tok = adv[:, None] * w
    assert torch.all(tok[mask] * adv[:, None].expand_as(tok)[mask] >= 0)
    mean_tok = (tok * mask).sum(-1) / mask.sum(-1)
    torch.testing.assert_close(mean_tok, adv, atol=1e-9, rtol=1e-9)


@settings(max_examples=150, deadline=None)
@given(c=completions(), alpha=floats01)
def test_hicra_never_flips_sign_and_leaves_execution_alone(c, alpha):
    sig, mask, plan, adv = c
    a = adv[:, None] * sig
    out = hicra(a, plan, alpha)
    assert torch.all(out * a >= 0)
    assert torch.equal(out[~plan], a[~plan])
    assert torch.all(out[plan].abs() >= a[plan].abs() * (1 - alpha) - 1e-12)


@settings(max_examples=150, deadline=None)
@given(c=completions())
def test_sepa_lambda_zero_identity_and_one_flattens_execution(c):
    sig, mask, plan, _ = c
    assert torch.equal(sepa_pool(sig, mask, plan, 0.0), sig)
    pooled = sepa_pool(sig, mask, plan, 1.0)
    execution = mask & ~plan
    for i in range(sig.shape[0]):
        e = pooled[i][execution[i]]
        if e.numel():
            assert torch.allclose(e, e.mean().expand_as(e), atol=1e-9)
            assert e.var(unbiased=False) < 1e-12
    assert torch.equal(pooled[plan], sig[plan])
    assert torch.equal(pooled[~mask], sig[~mask])


def test_input_not_mutated():
    sig = torch.rand(2, 4, 5)
    mask = torch.ones(2, 4, 5, dtype=torch.bool)
    plan = torch.zeros_like(mask)
    plan[..., 2] = True
    before = (sig.clone(), mask.clone(), plan.clone())
    cfg = CreditConfig(advantage_mode="maxrl", transform_mode="sepa_gtpo_hicra", sepa=SepaConfig())
    compute_advantages(torch.tensor([[1.0, 0, 0, 1], [1, 1, 0, 0]]), sig, mask, cfg, planning=plan, sepa_lambda=0.7)
    assert all(torch.equal(a, b) for a, b in zip(before, (sig, mask, plan), strict=False))


# The paper's worked example: 10 tokens, planning at positions 3 and 7 (1-based).
S = [0.2, 0.3, 1.8, 0.1, 0.9, 0.2, 2.1, 0.3, 0.1, 0.2]
PLAN = [False, False, True, False, False, False, True, False, False, False]


def test_paper_worked_example():
    sig = torch.tensor([S], dtype=torch.float64)
    mask = torch.ones(1, 10, dtype=torch.bool)
    plan = torch.tensor([PLAN])
    pooled = sepa_pool(sig, mask, plan, 1.0)[0]
    exec_mean = sum(s for s, p in zip(S, PLAN, strict=False) if not p) / 8  # 2.3 / 8 = 0.2875, "about 0.29"
    assert exec_mean == pytest.approx(0.2875)
    assert round(pooled[4].item(), 2) == 0.29  # token 5: 0.9 -> 0.29
    assert pooled[2].item() == 1.8 and pooled[6].item() == 2.1  # planning unchanged
    # GTPO after pooling (beta = 0.1): closed form with the pooled completion mean.
    mean_after = (8 * exec_mean + 1.8 + 2.1) / 10  # 0.62
    w = gtpo_weights(pooled[None], mask, 0.1)[0]
    assert w[2].item() == pytest.approx(1 + 0.1 * (1.8 / mean_after - 1))
    assert w[4].item() == pytest.approx(1 + 0.1 * (exec_mean / mean_after - 1))
    # Without SEPA token 5 is amplified (weight > 1); with SEPA it is dampened (< 1), planning dominates.
    w_raw = gtpo_weights(sig, mask, 0.1)[0]
    assert w_raw[4] > 1 > w[4]
    assert w[2] > w[4] and w[6] > w[4]


def test_worked_example_through_compute_advantages():
    rewards = torch.tensor([1.0, 0.0])  # one correct, one wrong: GRPO gives +-0.5
    sig = torch.tensor([S, S])
    mask = torch.ones(2, 10, dtype=torch.bool)
    plan = torch.tensor([PLAN, PLAN])
    cfg = CreditConfig(transform_mode="gtpo_sepa", gtpo_beta=0.1, sepa=SepaConfig())
    res = compute_advantages(rewards, sig, mask, cfg, planning=plan, sepa_lambda=1.0)
    assert res.stats["exec_surprisal_var_after"] == pytest.approx(0.0, abs=1e-6)
    assert res.stats["plan_surprisal_var_after"] == pytest.approx(res.stats["plan_surprisal_var"])
    assert res.stats["exec_surprisal_var"] > 0.05
    torch.testing.assert_close(res.token_advantages[0], -res.token_advantages[1])
