"""Uncertainty signals against direct computations (scipy, numpy)."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.special import softmax
from scipy.stats import entropy

from workers.credit import CreditError, shannon_entropy, token_uncertainty, varentropy


def direct(logits: np.ndarray, temperature: float):
    p = softmax(logits / temperature, axis=-1)
    h = entropy(p, axis=-1)
    logp = np.log(p)
    var = (p * (-logp - h[..., None]) ** 2).sum(-1)
    return h, var


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10_000), t=st.integers(1, 9), chunk=st.integers(1, 20), temp=st.floats(0.3, 2.0))
def test_entropy_and_varentropy_match_direct_and_chunking_is_exact(seed, t, chunk, temp):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(2, t, 50, generator=g, dtype=torch.float64) * 3
    h_ref, v_ref = direct(logits.numpy(), temp)
    h = shannon_entropy(logits, chunk_size=chunk, temperature=temp)
    v = varentropy(logits, chunk_size=chunk, temperature=temp)
    np.testing.assert_allclose(h.numpy(), h_ref, rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(v.numpy(), v_ref, rtol=1e-7, atol=1e-9)
    torch.testing.assert_close(h, shannon_entropy(logits, chunk_size=10_000, temperature=temp), rtol=0, atol=1e-12)


def test_gradients_flow_through_chunked_entropy():
    logits = torch.randn(3, 4, 7, requires_grad=True)
    shannon_entropy(logits, chunk_size=2).sum().backward()
    assert logits.grad is not None and logits.grad.abs().sum() > 0


def test_dispatch_and_unknown_kind():
    lp = torch.tensor([[-0.5, -2.0]])
    assert torch.equal(token_uncertainty("surprisal", logprobs=lp), -lp)
    with pytest.raises(CreditError, match="allowed: surprisal, shannon_entropy, varentropy"):
        token_uncertainty("renyi", logprobs=lp)
    with pytest.raises(CreditError, match="full logits"):
        token_uncertainty("shannon_entropy", logprobs=lp)
    uniform = torch.zeros(1, 2, 8)
    torch.testing.assert_close(token_uncertainty("shannon_entropy", logits=uniform), torch.full((1, 2), np.log(8)))
    torch.testing.assert_close(token_uncertainty("varentropy", logits=uniform), torch.zeros(1, 2))
