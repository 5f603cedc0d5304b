"""The vectorised credit stack equals the per-token reference on random ragged batches."""

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.reference_credit import ref_batch, ref_stats
from workers.credit import NAMED_TRANSFORMS, CreditConfig, SepaConfig, compute_advantages


@st.composite
def ragged_batches(draw):
    n = draw(st.integers(1, 4))
    g = draw(st.integers(1, 6))
    t_max = draw(st.integers(1, 12))
    binary = draw(st.booleans())
    reward = st.sampled_from([0.0, 1.0]) if binary else st.floats(-2, 2, allow_nan=False, width=32)
    rewards = [[draw(reward) for _ in range(g)] for _ in range(n)]
    lengths = [[draw(st.integers(0, t_max)) for _ in range(g)] for _ in range(n)]
    sig = st.floats(0, 60, allow_nan=False, width=32)  # above the clamp of 50 sometimes
    signals = [[[draw(sig) for _ in range(L)] for L in row] for row in lengths]
    plans = [[[draw(st.booleans()) for _ in range(L)] for L in row] for row in lengths]
    return rewards, signals, plans, t_max


def pad(rows, t_max, fill):
    return [[list(r) + [fill] * (t_max - len(r)) for r in group] for group in rows]


@settings(max_examples=150, deadline=None)
@given(
    batch=ragged_batches(),
    mode=st.sampled_from(["grpo", "maxrl"]),
    transform=st.sampled_from(sorted(NAMED_TRANSFORMS) + ["order:hicra,gtpo", "order:gtpo,sepa,hicra"]),
    beta=st.floats(0, 2),
    alpha=st.floats(0, 1),
    lam=st.floats(0, 1),
)
def test_vectorised_equals_reference(batch, mode, transform, beta, alpha, lam):
    rewards, signals, plans, t_max = batch
    tm = transform.removeprefix("order:").split(",") if transform.startswith("order:") else transform
    cfg = CreditConfig(advantage_mode=mode, transform_mode=tm, gtpo_beta=beta, hicra_alpha=alpha, sepa=SepaConfig())
    mask = torch.tensor(pad([[[True] * len(s) for s in grp] for grp in signals], t_max, False), dtype=torch.bool)
    sig_t = torch.tensor(pad(signals, t_max, 123.0), dtype=torch.float64)  # padding garbage must be ignored
    plan_t = torch.tensor(pad(plans, t_max, True), dtype=torch.bool)  # padding planning flags too
    res = compute_advantages(torch.tensor(rewards, dtype=torch.float64), sig_t, mask, cfg, planning=plan_t, sepa_lambda=lam)

    ref_adv, ref_sig = ref_batch(rewards, signals, plans, mode, cfg.stages, beta, alpha, lam)
    want = torch.tensor(pad(ref_adv, t_max, 0.0), dtype=torch.float32)
    torch.testing.assert_close(res.token_advantages, want, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(res.signal_after, torch.tensor(pad(ref_sig, t_max, 0.0), dtype=torch.float32), atol=1e-4, rtol=1e-4)

    # Diagnostics: skipped groups, execution / planning uncertainty mean and variance before and after.
    for key, want_v in ref_stats(rewards, signals, plans, ref_sig).items():
        assert abs(res.stats[key] - want_v) < 1e-3 * max(1.0, abs(want_v)), key
