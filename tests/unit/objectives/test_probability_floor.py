"""Hard probability floor (workers.objectives.probability_floor): distribution invariants, gradients, the learner's per-token
entry point against a direct per-position computation, and the request parsing the vLLM processor relies on."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from workers.objectives.losses import sequence_logprobs
from workers.objectives.probability_floor import (
    FLOOR_CAP,
    INVALID_LOGPROB,
    floor_probs,
    floored_token_logprobs,
    parse_floor_args,
    validate_floor_request,
)

EPS = 1e-6  # float32 slack on probabilities


def eff_floor(min_prob: float, n_valid: int) -> float:
    return min(min_prob, FLOOR_CAP / n_valid)


@st.composite
def masked_logits(draw, min_actions=1, max_actions=12, lo=-10.0, hi=10.0):
    """(logits [V] float32, valid [V] bool with >= 1 valid), V in [min_actions, max_actions]."""
    v = draw(st.integers(min_actions, max_actions))
    logits = draw(arrays(np.float32, (v,), elements=st.floats(lo, hi, width=32)))
    n_valid = draw(st.integers(1, v))
    idx = draw(st.permutations(range(v)))[:n_valid]
    valid = torch.zeros(v, dtype=torch.bool)
    valid[list(idx)] = True
    return torch.from_numpy(logits), valid


@st.composite
def peaked_logits(draw, max_actions=10):
    """Logits strongly peaked at one valid action (the entropy-collapse case); all actions valid."""
    v = draw(st.integers(2, max_actions))
    peak = draw(st.integers(0, v - 1))
    mag = draw(st.floats(10.0, 40.0))
    logits = torch.zeros(v)
    logits[peak] = mag
    return logits, torch.ones(v, dtype=torch.bool), peak


min_probs = st.floats(0.0, 0.99)
temperatures = st.floats(0.1, 2.0)


def reference_floor(logits: torch.Tensor, valid: torch.Tensor, min_prob: float, temperature: float) -> torch.Tensor:
    """Slow, obvious per-row floor in float64: raise below-floor probabilities to the floor, rescale the rest,
    repeat until nothing rescaled falls below the floor. Returns probabilities (0 for invalid tokens)."""
    z = logits.double() / temperature
    p = torch.zeros_like(z)
    p[valid] = torch.softmax(z[valid], -1)
    n = int(valid.sum())
    f = eff_floor(min_prob, n)
    fixed = torch.zeros_like(valid)
    while True:
        free = valid & ~fixed
        c = (1.0 - int(fixed.sum()) * f) / p[free].sum()
        low = free & (c * p < f)
        if not low.any():
            break
        fixed |= low
    q = torch.where(fixed, torch.full_like(p, f), c * p)
    return torch.where(valid, q, torch.zeros_like(q))


# ------------------------------------------------------------------------------------ distribution invariants
@settings(max_examples=200, deadline=None)
@given(x=masked_logits(), m=min_probs, t=temperatures)
def test_matches_reference_floor(x, m, t):
    logits, valid = x
    q = floor_probs(logits, valid, m, t).exp().double()
    torch.testing.assert_close(q, reference_floor(logits, valid, m, t), atol=2e-6, rtol=1e-5)


@settings(max_examples=200, deadline=None)
@given(x=masked_logits(), m=min_probs, t=temperatures)
def test_probabilities_sum_to_one(x, m, t):
    logits, valid = x
    q = floor_probs(logits, valid, m, t).exp()
    assert abs(q.sum().item() - 1.0) < 1e-5
    assert abs(q[valid].sum().item() - 1.0) < 1e-5


@settings(max_examples=200, deadline=None)
@given(x=masked_logits(), m=min_probs, t=temperatures)
def test_floor_guarantee(x, m, t):
    logits, valid = x
    q = floor_probs(logits, valid, m, t).exp()
    assert q[valid].min().item() >= eff_floor(m, int(valid.sum())) - EPS


@settings(max_examples=200, deadline=None)
@given(x=masked_logits(), m=min_probs, t=temperatures)
def test_mask_preserved(x, m, t):
    logits, valid = x
    lq = floor_probs(logits, valid, m, t)
    assert torch.all(lq[~valid] == INVALID_LOGPROB)
    assert torch.all(lq[~valid].exp() == 0.0)
    assert torch.all(torch.isfinite(lq))


@settings(max_examples=100, deadline=None)
@given(x=peaked_logits(), m=st.floats(0.5, 0.99))
def test_floor_caps_below_uniform(x, m):
    """A floor request at or above 0.99 / n is capped there: floored tokens sit at exactly 0.99 / n and the peak
    keeps the 1% headroom, so the result is never the uniform distribution."""
    logits, valid, peak = x
    n = valid.numel()
    assert m >= FLOOR_CAP / n or n == 2  # the request exceeds the cap except possibly for n == 2
    q = floor_probs(logits, valid, m).exp()
    f = eff_floor(m, n)
    others = torch.cat([q[:peak], q[peak + 1 :]])
    torch.testing.assert_close(others, torch.full_like(others, f), atol=1e-6, rtol=0)
    assert q[peak].item() == pytest.approx(1.0 - (n - 1) * f, abs=1e-6)
    assert q[peak].item() > 1.0 / n


@settings(max_examples=200, deadline=None)
@given(x=masked_logits(), m=min_probs, t=temperatures)
def test_idempotent(x, m, t):
    logits, valid = x
    lq = floor_probs(logits, valid, m, t)
    again = floor_probs(lq, valid, m)  # its own output, as logits, temperature 1
    torch.testing.assert_close(again.exp(), lq.exp(), atol=2e-6, rtol=1e-5)


@settings(max_examples=200, deadline=None)
@given(x=masked_logits(), m=min_probs, t=temperatures)
def test_order_preserved(x, m, t):
    logits, valid = x
    q = floor_probs(logits, valid, m, t).exp()[valid]
    z = logits[valid]
    i, j = torch.meshgrid(torch.arange(z.numel()), torch.arange(z.numel()), indexing="ij")
    higher = z[i] > z[j]
    assert torch.all(q[i][higher] >= q[j][higher] - EPS)


@settings(max_examples=50, deadline=None)
@given(v=st.integers(1, 10), m=min_probs, t=temperatures, data=st.data())
def test_single_valid_action(v, m, t, data):
    logits = torch.from_numpy(data.draw(arrays(np.float32, (v,), elements=st.floats(-20, 20, width=32))))
    k = data.draw(st.integers(0, v - 1))
    valid = torch.zeros(v, dtype=torch.bool)
    valid[k] = True
    x = logits.clone().requires_grad_()
    lq = floor_probs(x, valid, m, t)
    assert lq[k].item() == pytest.approx(0.0, abs=1e-6)
    assert torch.all(lq[~valid] == INVALID_LOGPROB)
    lq[k].backward()
    assert torch.all(torch.isfinite(x.grad))


@settings(max_examples=100, deadline=None)
@given(x=masked_logits(), t=temperatures)
def test_zero_floor_is_masked_softmax(x, t):
    logits, valid = x
    lq = floor_probs(logits, valid, 0.0, t)
    ref = torch.log_softmax(logits[valid] / t, -1)
    torch.testing.assert_close(lq[valid], ref, atol=1e-6, rtol=1e-6)


def test_rows_without_valid_tokens_are_plain_log_softmax():
    logits = torch.randn(3, 7)
    valid = torch.zeros(3, 7, dtype=torch.bool)
    valid[1, [2, 5]] = True
    lq = floor_probs(logits, valid, 0.3, 0.7)
    plain = torch.log_softmax(logits / 0.7, -1)
    torch.testing.assert_close(lq[[0, 2]], plain[[0, 2]])
    assert torch.all(lq[1, valid[1]].exp() >= 0.3 - EPS)


@settings(max_examples=50, deadline=None)
@given(b=st.integers(1, 6), v=st.integers(2, 9), m=min_probs, t=temperatures, data=st.data())
def test_batched_equals_rowwise_and_min_prob_per_row(b, v, m, t, data):
    logits = torch.from_numpy(data.draw(arrays(np.float32, (b, v), elements=st.floats(-10, 10, width=32))))
    valid = torch.from_numpy(data.draw(arrays(np.bool_, (b, v))))
    per_row = torch.from_numpy(data.draw(arrays(np.float32, (b, 1), elements=st.floats(0, 0.5, width=32))))
    batched = floor_probs(logits, valid, per_row, t)
    for i in range(b):
        torch.testing.assert_close(batched[i], floor_probs(logits[i], valid[i], float(per_row[i, 0]), t))
    shared = floor_probs(logits, valid[0], m, t)  # a [V] mask broadcasts over rows
    for i in range(b):
        torch.testing.assert_close(shared[i], floor_probs(logits[i], valid[0], m, t))


def test_rejects_bad_arguments():
    x, valid = torch.zeros(4), torch.ones(4, dtype=torch.bool)
    with pytest.raises(ValueError):
        floor_probs(x, valid, 0.1, temperature=0.0)
    with pytest.raises(ValueError):
        floor_probs(x, valid, -0.1)
    with pytest.raises(TypeError):
        floor_probs(x, valid.float(), 0.1)


# ------------------------------------------------------------------------------------------------ gradients
@settings(max_examples=100, deadline=None)
@given(x=peaked_logits(), m=st.floats(0.01, 0.2), t=st.floats(0.5, 1.5), data=st.data())
def test_gradient_nonzero_at_peak(x, m, t, data):
    """Straight-through (default): every valid action's log-prob has an O(1) gradient, even for floored ones."""
    logits, valid, peak = x
    n = valid.numel()
    a = data.draw(st.integers(0, n - 1).filter(lambda i: i != peak))
    z = logits.clone().requires_grad_()
    lq = floor_probs(z, valid, m, t)
    assert lq[a].exp().item() == pytest.approx(eff_floor(m, n), abs=1e-6)  # the floor binds for action a
    (grad,) = torch.autograd.grad(lq[a], z)
    assert torch.all(torch.isfinite(grad))
    assert grad[a].item() > 0.5 / t  # raising a's logit raises its log-prob: d/dz_a = (1 - p_a) / T
    assert grad.norm().item() < 100.0
    # and it is the score of the underlying masked policy
    (ref,) = torch.autograd.grad(torch.log_softmax(z / t, -1)[a], z)
    torch.testing.assert_close(grad, ref)


def test_exact_gradient_option():
    """straight_through=False: autograd of the floor itself; matches finite differences at a generic point, and is
    zero at a sharply peaked point (why the straight-through gradient is the default)."""
    torch.manual_seed(0)
    z = torch.randn(6, dtype=torch.float64)
    valid = torch.tensor([True, True, False, True, True, True])
    assert torch.autograd.gradcheck(lambda x: floor_probs(x, valid, 0.12, 0.8, straight_through=False), (z.requires_grad_(),))
    peaked = torch.tensor([30.0, 0.0, 0.0, 0.0], requires_grad=True)
    floor_probs(peaked, torch.ones(4, dtype=torch.bool), 0.1, straight_through=False)[1].backward()
    assert torch.all(peaked.grad == 0)


# ------------------------------------------------------------------------------------ floored_token_logprobs
def direct_token_logprobs(logits, targets, action_mask_at):
    """Per position: floor_probs(...)[target] where `action_mask_at(b, t)` gives a mask, plain otherwise."""
    out = torch.empty(targets.shape)
    for b in range(targets.shape[0]):
        for t in range(targets.shape[1]):
            mask = action_mask_at(b, t)
            row = floor_probs(logits[b, t], mask, M, TEMP) if mask is not None else torch.log_softmax(
                logits[b, t].float() / TEMP, -1)
            out[b, t] = row[targets[b, t]]
    return out


M, TEMP = 0.15, 0.8


@st.composite
def token_batches(draw):
    b, t, v = draw(st.integers(1, 3)), draw(st.integers(1, 5)), draw(st.integers(3, 12))
    logits = torch.from_numpy(draw(arrays(np.float32, (b, t, v), elements=st.floats(-8, 8, width=32))))
    k = draw(st.integers(1, v))
    ids = list(draw(st.permutations(range(v)))[:k])
    positions = torch.from_numpy(draw(arrays(np.bool_, (b, t))))
    # targets: mostly valid actions at action positions, sometimes not (-> INVALID_LOGPROB)
    targets = torch.from_numpy(draw(arrays(np.int64, (b, t), elements=st.integers(0, v - 1))))
    for i in range(b):
        for j in range(t):
            if positions[i, j] and draw(st.booleans()):
                targets[i, j] = ids[draw(st.integers(0, k - 1))]
    return logits, targets, ids, positions


@settings(max_examples=100, deadline=None)
@given(batch=token_batches())
def test_token_logprobs_shared_set_equals_direct(batch):
    logits, targets, ids, positions = batch
    mask = torch.zeros(logits.shape[-1], dtype=torch.bool)
    mask[ids] = True
    ref = direct_token_logprobs(logits, targets, lambda b, t: mask if positions[b, t] else None)
    for valid in (ids, torch.tensor(ids), mask):
        got = floored_token_logprobs(logits, targets, valid, M, TEMP, positions=positions)
        torch.testing.assert_close(got, ref, atol=2e-6, rtol=1e-5)
    hit = positions & ~mask[targets]
    assert torch.all(ref[hit] == INVALID_LOGPROB)


@settings(max_examples=100, deadline=None)
@given(batch=token_batches(), data=st.data())
def test_token_logprobs_full_mask_equals_direct(batch, data):
    logits, targets, _, _ = batch
    valid = torch.from_numpy(data.draw(arrays(np.bool_, tuple(logits.shape))))
    ref = direct_token_logprobs(logits, targets, lambda b, t: valid[b, t] if valid[b, t].any() else None)
    got = floored_token_logprobs(logits, targets, valid, M, TEMP)
    torch.testing.assert_close(got, ref, atol=2e-6, rtol=1e-5)


@settings(max_examples=30, deadline=None)
@given(batch=token_batches())
def test_token_logprobs_gradient_equals_direct(batch):
    logits, targets, ids, positions = batch
    mask = torch.zeros(logits.shape[-1], dtype=torch.bool)
    mask[ids] = True
    a = logits.clone().requires_grad_()
    floored_token_logprobs(a, targets, ids, M, TEMP, positions=positions).sum().backward()
    b = logits.clone().requires_grad_()
    direct_token_logprobs(b, targets, lambda i, j: mask if positions[i, j] else None).sum().backward()
    torch.testing.assert_close(a.grad, b.grad, atol=1e-5, rtol=1e-5)


def test_token_logprobs_without_positions_is_sequence_logprobs():
    torch.manual_seed(1)
    logits, targets = torch.randn(2, 5, 9), torch.randint(0, 9, (2, 5))
    none = torch.zeros(2, 5, dtype=torch.bool)
    got = floored_token_logprobs(logits, targets, [1, 2, 3], 0.2, 0.7, positions=none)
    assert torch.equal(got, sequence_logprobs(logits, targets, 0.7))
    first = none.clone()
    first[:, 0] = True  # the action position convention: first completion token
    got = floored_token_logprobs(logits, targets, [1, 2, 3], 0.2, 0.7, positions=first)
    assert torch.equal(got[:, 1:], sequence_logprobs(logits, targets, 0.7)[:, 1:])
    assert not torch.equal(got[:, 0], sequence_logprobs(logits, targets, 0.7)[:, 0])


def test_token_logprobs_argument_errors():
    logits, targets = torch.randn(1, 2, 5), torch.zeros(1, 2, dtype=torch.long)
    with pytest.raises(ValueError):
        floored_token_logprobs(logits, targets, [1, 2], 0.1)  # shared set without positions
    with pytest.raises(ValueError):
        floored_token_logprobs(logits, targets, [1, 7], 0.1, positions=torch.ones(1, 2, dtype=torch.bool))
    with pytest.raises(ValueError):
        floored_token_logprobs(logits, targets, [1, 1], 0.1, positions=torch.ones(1, 2, dtype=torch.bool))
    with pytest.raises(ValueError):
        floored_token_logprobs(logits, targets, torch.ones(1, 2, 5, dtype=torch.bool), 0.1,
                               positions=torch.ones(1, 2, dtype=torch.bool))


# ------------------------------------------------------------------------------------ request parsing (vLLM side)
class _Params:
    def __init__(self, extra_args=None, **kw):
        self.extra_args = extra_args
        self.temperature, self.top_p, self.top_k, self.min_p = 0.7, 1.0, 0, 0.0
        self.presence_penalty = self.frequency_penalty = 0.0
        self.repetition_penalty = 1.0
        self.logit_bias = self.allowed_token_ids = self.bad_words = None
        self.__dict__.update(kw)


def test_parse_floor_args():
    assert parse_floor_args(None) is None and parse_floor_args({"other": 1}) is None
    assert parse_floor_args({"probability_floor": {"token_ids": [4, 2], "min_prob": 0.2}}) == ([4, 2], 0.2)
    assert parse_floor_args({"probability_floor": {"token_ids": [4]}}) == ([4], 0.0)
    for bad in ({"token_ids": []}, {"token_ids": [1, 1]}, {"token_ids": [-1]}, {"token_ids": [1], "min_prob": 1.0},
                {"token_ids": [1], "min_prob": -0.1}, {"token_ids": [1], "typo": 0}, [1, 2], {"token_ids": [True]}):
        with pytest.raises(ValueError):
            parse_floor_args({"probability_floor": bad})


def test_validate_floor_request():
    floor = {"probability_floor": {"token_ids": [1, 2], "min_prob": 0.2}}
    validate_floor_request(_Params(floor))
    validate_floor_request(_Params(None, temperature=0.0, top_p=0.5))  # no floor asked: anything goes
    for kw in ({"temperature": 0.0}, {"top_p": 0.9}, {"top_k": 5}, {"min_p": 0.1}, {"repetition_penalty": 1.1},
               {"logit_bias": {1: 2.0}}):
        with pytest.raises(ValueError):
            validate_floor_request(_Params(floor, **kw))
