"""The chunked log-prob / entropy pass (workers/learner/passes/token_stats.py) equals the unchunked one, values and
gradients, on random inputs: through an LM head (hidden states in) and from logits, at any chunk size. The
reference is written here from the definitions (log_softmax, -sum p log p), on the whole [b, T, V] tensor; the
KL terms read the log-probs, so they follow."""

from __future__ import annotations

import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

from tests.tolerance import assert_close_to_scale
from workers.learner.passes.token_stats import token_stats
from workers.objectives.losses import kl_penalty


def _reference(z: torch.Tensor, targets: torch.Tensor, temperature: float):
    logp = torch.log_softmax(z.double() / temperature, -1)
    return logp.gather(-1, targets[..., None])[..., 0], -(logp.exp() * logp).sum(-1)


@settings(max_examples=60, deadline=None)
@given(b=st.integers(1, 4), t=st.integers(1, 9), v=st.integers(2, 40), h=st.integers(1, 8),
       chunk=st.integers(1, 40), temperature=st.floats(0.3, 2.0), with_head=st.booleans(), seed=st.integers(0, 10**6))
@example(b=1, t=7, v=20, h=8, chunk=1, temperature=0.3828125, with_head=True, seed=5)  # entropy ~0 at |z|/T ~ 100
def test_chunked_pass_equals_the_whole_one(b, t, v, h, chunk, temperature, with_head, seed):
    gen = torch.Generator().manual_seed(seed)
    targets = torch.randint(0, v, (b, t), generator=gen)
    head = torch.nn.Linear(h, v, bias=False).double()
    with torch.no_grad():
        head.weight.copy_(torch.randn(v, h, generator=gen, dtype=torch.float64) * 2)
    x = torch.randn(b, t, h if with_head else v, generator=gen, dtype=torch.float64) * 3
    ref_lp = torch.randn(b, t, generator=gen, dtype=torch.float64)
    w = torch.randn(b, t, generator=gen, dtype=torch.float64)

    def loss_of(lp, ent):  # a policy-like loss: log-prob term, KL to a reference, entropy bonus
        return (w * lp).sum() + 0.3 * kl_penalty(lp, ref_lp, "low_var_kl").sum() - 0.1 * ent.sum()

    grads = {}
    for name, c in (("chunked", chunk), ("whole", None)):
        xi = x.clone().requires_grad_(True)
        head.zero_grad()
        stats = token_stats(xi, targets, temperature, c, head=head if with_head else None, entropy=True)
        loss_of(stats.lp, stats.entropy).backward()
        grads[name] = (stats.lp.detach(), stats.entropy.detach(), xi.grad.clone(),
                       head.weight.grad.clone() if with_head else None)
    z = head(x) if with_head else x
    want_lp, want_ent = _reference(z, targets, temperature)
    lp, ent, gx, gw = grads["chunked"]
    # fp32 inside, as on the GPU: float32 rounding of logits as large as |z| / T
    tol = 4e-7 * (1.0 + float(z.detach().abs().max()) / temperature)
    torch.testing.assert_close(lp.double(), want_lp, rtol=1e-5, atol=tol)
    torch.testing.assert_close(ent.double(), want_ent, rtol=1e-5, atol=tol)
    for a, b_ in zip(grads["chunked"], grads["whole"], strict=True):  # and the chunked pass is the whole one
        if a is not None:
            assert_close_to_scale(a, b_, what="chunked vs whole")  # the same sums, chunk by chunk
    # the gradients against the definition's own (float64 autograd through the reference)
    xr = x.clone().requires_grad_(True)
    head.zero_grad()
    r_lp, r_ent = _reference(head(xr) if with_head else xr, targets, temperature)
    loss_of(r_lp, r_ent).backward()
    torch.testing.assert_close(gx, xr.grad, rtol=1e-4, atol=1e-4)
    if with_head:
        torch.testing.assert_close(gw, head.weight.grad, rtol=1e-4, atol=1e-4)


def test_one_chunk_holds_the_logits_at_a_time():
    """With chunks, backward recomputes one chunk's logits: the head sees chunk-sized inputs only (twice each:
    forward and the recompute), never the whole window."""
    head = torch.nn.Linear(4, 50, bias=False)
    seen = []
    head.register_forward_hook(lambda m, i, o: seen.append(o.shape[0]))
    x = torch.randn(3, 10, 4, requires_grad=True)
    stats = token_stats(x, torch.randint(0, 50, (3, 10)), 1.0, 7, head=head, entropy=True)
    stats.lp.sum().backward()
    assert max(seen) == 7 and sum(seen) == 2 * 30


def test_signal_and_first_position():
    from workers.credit import token_uncertainty

    z = torch.randn(2, 6, 11)
    targets = torch.randint(0, 11, (2, 6))
    stats = token_stats(z, targets, 0.7, 4, entropy=True, signal="varentropy", first=True)
    torch.testing.assert_close(stats.signal, token_uncertainty("varentropy", logits=z / 0.7))
    torch.testing.assert_close(stats.first, z[:, 0] / 0.7)
