"""The off-policy corrections (workers/objectives/offpolicy.py) against a slow per-token reference written from
their definitions, values and gradients of the weighted PPO loss; properties over random batches; `decoupled`
(and `tis`) on a batch with staleness 0 is PPO's loss; metrics-only changes no loss."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from workers.objectives.losses import aggregate, ppo_token_loss, truncated_importance_weights
from workers.objectives.offpolicy import offpolicy_weights, sequence_mismatch
from workers.objectives.settings import OffPolicySettings


def _batch(seed: int, b: int = 4, t: int = 6, spread: float = 1.0):
    g = torch.Generator().manual_seed(seed)
    prox = -torch.rand(b, t, generator=g, dtype=torch.float64) * 3
    behav = prox + spread * torch.randn(b, t, generator=g, dtype=torch.float64)
    mask = torch.rand(b, t, generator=g) > 0.25
    mask[0] = False  # a sequence with no trained token
    mask[1, 0] = True
    return prox, behav, mask


def _slow_measure(prox: float, behav: float, measure: str) -> float:
    d = behav - prox  # log pi_behav - log pi_prox, tokens sampled from pi_behav
    if measure == "k1":
        return d
    if measure == "k2":
        return 0.5 * d * d
    x = max(-20.0, min(20.0, -d))
    return max(-10.0, min(10.0, math.exp(x) - x - 1.0))


def _slow_weights(prox, behav, mask, s: OffPolicySettings) -> list[list[float]]:
    """Loop over sequences and tokens, straight from the module doc's definitions."""
    out = []
    for i in range(prox.shape[0]):
        toks = [j for j in range(prox.shape[1]) if mask[i, j]]
        seq_log = max(-20.0, min(20.0, sum(float(prox[i, j] - behav[i, j]) for j in toks)))
        row = []
        for j in range(prox.shape[1]):
            if not mask[i, j]:
                row.append(0.0)
                continue
            w = math.exp(seq_log if s.level == "sequence" else float(prox[i, j] - behav[i, j]))
            if s.correction == "tis":
                w = min(w, s.cap)
            elif s.correction == "decoupled":
                w = w if w <= s.cap else 0.0
            else:
                w = 1.0
            row.append(w)
        if s.reject_measure is not None and toks:
            mean = sum(_slow_measure(float(prox[i, j]), float(behav[i, j]), s.reject_measure) for j in toks) / len(toks)
            if (abs(mean) if s.reject_measure == "k1" else mean) > s.reject_threshold:
                row = [0.0] * len(row)
        out.append(row)
    return out


THRESHOLD = {"k1": 0.5, "k2": 0.2, "k3": 0.2}  # between _batch(3, spread=0.6)'s sequences: some rejected, some not
SETTINGS = [OffPolicySettings(c, lv, 1.5 if c != "none" else None, m, THRESHOLD.get(m))
            for c in ("none", "tis", "decoupled") for lv in (("token", "sequence") if c != "none" else ("token",))
            for m in (None, "k1", "k2", "k3") if c != "none" or m]


@pytest.mark.parametrize("s", SETTINGS, ids=lambda s: f"{s.correction}-{s.level}-{s.reject_measure}")
def test_weights_and_gradients_match_the_slow_reference(s):
    prox, behav, mask = _batch(3, spread=0.6)
    w, _ = offpolicy_weights(prox, behav, mask, s)
    ref = torch.tensor(_slow_weights(prox, behav, mask, s), dtype=torch.float64)
    assert torch.allclose(w.to(torch.float64), ref, rtol=1e-12, atol=1e-12)
    kept = (ref[mask] > 0).float().mean()
    assert 0 < kept <= 1 and (kept < 1) == (s.reject_measure is not None or s.correction == "decoupled")
    # the weighted PPO loss: values and gradients w.r.t. the current log-probs against a per-token loop
    g = torch.Generator().manual_seed(7)
    adv = torch.randn(prox.shape, generator=g, dtype=torch.float64)
    lp = (prox + 0.3 * torch.randn(prox.shape, generator=g, dtype=torch.float64)).requires_grad_(True)
    tok, _ = ppo_token_loss(lp, prox, adv)
    loss = aggregate(tok * w, mask, "token-mean")
    loss.backward()
    lp_ref = lp.detach().clone().requires_grad_(True)
    total, n = 0.0, int(mask.sum())
    for i in range(prox.shape[0]):
        for j in range(prox.shape[1]):
            if mask[i, j]:
                r = torch.exp(lp_ref[i, j] - prox[i, j])
                a = adv[i, j]
                term = torch.maximum(-a * r, -a * r.clamp(0.8, 1.2))
                if a < 0:
                    term = torch.minimum(term, -a * 3.0)
                total = total + term * ref[i, j]
    (total / n).backward()
    assert float(loss.detach()) == pytest.approx(float(total / n), rel=1e-12, abs=1e-14)
    assert torch.allclose(lp.grad, lp_ref.grad, rtol=1e-10, atol=1e-14)


def test_token_tis_is_one_step_offs_weight_bit_for_bit():
    prox, behav, mask = _batch(5)
    w, metrics = offpolicy_weights(prox.float(), behav.float(), mask, OffPolicySettings("tis", cap=2.0))
    _, legacy, legacy_metrics = truncated_importance_weights(prox.float(), behav.float(), mask, 2.0)
    assert torch.equal(w, legacy) and metrics == legacy_metrics


@pytest.mark.parametrize("kind", ["tis", "decoupled"])
@pytest.mark.parametrize("level", ["token", "sequence"])
def test_no_staleness_is_ppos_loss(kind, level):
    """pi_behav == pi_prox (staleness 0, no engine mismatch): every weight is 1, the loss is PPO's exactly."""
    prox, _, mask = _batch(11)
    adv = torch.randn(prox.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    lp = prox + 0.1
    w, metrics = offpolicy_weights(prox, prox.clone(), mask, OffPolicySettings(kind, level, cap=2.0))
    tok, _ = ppo_token_loss(lp, prox, adv)
    assert torch.equal(w, mask.to(w.dtype))
    assert torch.equal(aggregate(tok * w, mask, "token-mean"), aggregate(tok, mask, "token-mean"))
    assert metrics[f"{kind}/weight_mean"] == 1.0


def test_metrics_only_changes_no_loss_but_logs_the_mismatch():
    prox, behav, mask = _batch(2)
    s = OffPolicySettings("decoupled", cap=2.0, reject_measure="k3", reject_threshold=0.1, metrics_only=True,
                          log_mismatch=True)
    w, metrics = offpolicy_weights(prox, behav, mask, s)
    applied, same = offpolicy_weights(prox, behav, mask, OffPolicySettings(
        "decoupled", cap=2.0, reject_measure="k3", reject_threshold=0.1, log_mismatch=True))
    assert w is None and applied is not None and metrics == same
    assert metrics["mismatch/k3"] > 0 and 0 < metrics["mismatch/rejected_frac"] <= 1
    slow_k1 = sum(float(behav[i, j] - prox[i, j]) for i in range(4) for j in range(6) if mask[i, j]) / int(mask.sum())
    assert metrics["mismatch/k1"] == pytest.approx(slow_k1, rel=1e-12)


def test_settings_refuse_what_cannot_be_computed():
    with pytest.raises(ValueError, match="cap"):
        OffPolicySettings("tis")
    with pytest.raises(ValueError, match="cap"):
        OffPolicySettings("none", cap=2.0)
    with pytest.raises(ValueError, match="rejection"):
        OffPolicySettings(reject_measure="k4", reject_threshold=1.0)


_floats = st.floats(-8.0, 0.0, allow_nan=False)


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 4), st.integers(1, 6), st.data(), st.sampled_from(SETTINGS))
def test_properties(b, t, data, s):
    prox = torch.tensor(data.draw(st.lists(st.lists(_floats, min_size=t, max_size=t), min_size=b, max_size=b)),
                        dtype=torch.float64)
    behav = torch.tensor(data.draw(st.lists(st.lists(_floats, min_size=t, max_size=t), min_size=b, max_size=b)),
                         dtype=torch.float64)
    mask = torch.tensor(data.draw(st.lists(st.lists(st.booleans(), min_size=t, max_size=t), min_size=b,
                                           max_size=b)))
    before = (prox.clone(), behav.clone(), mask.clone())
    w, _ = offpolicy_weights(prox, behav, mask, s)
    assert all(torch.equal(x, y) for x, y in zip(before, (prox, behav, mask), strict=True))  # inputs untouched
    assert torch.isfinite(w).all() and (w[~mask] == 0).all() and (w >= 0).all()
    if s.correction != "none":
        assert (w <= s.cap).all()  # tis truncates at C, decoupled masks what exceeds it
    if s.level == "sequence" or s.reject_measure is not None:
        # a sequence-level weight or a rejection is one value over each sequence's trained tokens
        for i in range(b):
            vals = w[i][mask[i]]
            if s.level == "sequence" and len(vals):
                assert torch.allclose(vals, vals[0].expand_as(vals))
    if s.reject_measure is not None:
        rejected = sequence_mismatch(prox, behav, mask, s.reject_measure) > s.reject_threshold
        assert (w[rejected] == 0).all()
