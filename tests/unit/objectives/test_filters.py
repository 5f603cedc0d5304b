"""Reward-variance filter against a slow, loop-based reading of the spec (seed 004, section 3)."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from workers.objectives.filters import rv_filter
from workers.objectives.interventions import RVFilterConfig


def slow_std(group: list[float]) -> float:
    if len(group) < 2:
        return 0.0
    mean = sum(group) / len(group)
    return math.sqrt(sum((x - mean) ** 2 for x in group) / (len(group) - 1))


def slow_rv_filter(rewards: list[list[float]], value: float, prob_mode: str = "softmax", include_zero: bool = True,
                   loss_scaling: str = "none") -> tuple[list[int], float]:
    """The spec step by step: std per group, optional zero drop, rank, probabilities, cumulative top-p."""
    s = [slow_std(g) for g in rewards]
    cands = [i for i in range(len(s)) if include_zero or abs(s[i]) >= 1e-10]
    if not cands:  # documented choice: nothing left after dropping zeros -> all groups compete
        cands = list(range(len(s)))
    ranked = sorted(cands, key=lambda i: (-s[i], i))
    if prob_mode == "softmax":
        m = max(s[i] for i in cands)
        e = {i: math.exp(s[i] - m) for i in cands}
        prob = {i: e[i] / sum(e.values()) for i in cands}
    else:
        total = sum(s[i] for i in cands)
        prob = {i: (s[i] / total if total > 0 else 1.0 / len(cands)) for i in cands}
    kept, cum = [], 0.0
    for i in ranked:
        kept.append(i)
        cum += prob[i]
        if value < 1.0 and cum >= value - 1e-9:
            break
    ratio = len(kept) / len(rewards)
    scale = {"none": 1.0, "linear": ratio, "sqrt": math.sqrt(ratio)}[loss_scaling]
    return sorted(kept), scale


def run(rewards, **kw):
    cfg = RVFilterConfig(enabled=True, **kw)
    t = torch.tensor(rewards, dtype=torch.float64)
    before = t.clone()
    res = rv_filter(t, cfg)
    assert torch.equal(t, before)
    ref_keep, ref_scale = slow_rv_filter(rewards, cfg.value, cfg.prob_mode, cfg.include_zero, cfg.loss_scaling)
    assert res.keep == ref_keep
    assert math.isclose(res.loss_scale, ref_scale, rel_tol=1e-12)
    return res


# std: g0 = g1 = 0.7071 (tie), g2 = 0, g3 = 1.4142. softmax probs ~ 0.4486, 0.2212, 0.2212, 0.1091.
TIES = [[0.0, 1.0], [1.0, 0.0], [5.0, 5.0], [0.0, 2.0]]


def test_ties_broken_by_original_index():
    assert run(TIES, value=0.4).keep == [3]
    assert run(TIES, value=0.5).keep == [0, 3]  # g0 beats its tie g1
    assert run(TIES, value=0.7).keep == [0, 1, 3]
    assert run(TIES, value=0.95).keep == [0, 1, 2, 3]
    assert run(TIES, value=0.7, include_zero=False).keep == [0, 3]  # renormalised: 0.5035 + 0.2482
    assert run(TIES[::-1], value=0.5).keep == [0, 2]  # reversed: g3 -> 0, tie -> 1, 2; index 2 loses now
    shifted = [[1.0, 1.0, 3.0, 2.0], [0.0, 0.0, 1.0, 2.0]]  # same spread; torch.std differs here in the last bit
    assert run(shifted, value=0.5).keep == [0]
    assert run(shifted[::-1], value=0.5).keep == [0]


def test_all_zero_variance_is_uniform_and_keeps_at_least_one():
    flat = [[1.0, 1.0, 1.0], [0.0, 0.0, 0.0], [2.0, 2.0, 2.0], [0.5, 0.5, 0.5]]
    for mode in ("softmax", "linear"):
        assert run(flat, value=0.5, prob_mode=mode).keep == [0, 1]  # 0.25 + 0.25 reaches 0.5
        assert run(flat, value=0.51, prob_mode=mode).keep == [0, 1, 2]
        assert run(flat, value=0.01, prob_mode=mode).keep == [0]
        # include_zero=False would leave nothing: falls back to all groups, never keeps nothing
        assert run(flat, value=0.5, prob_mode=mode, include_zero=False).keep == [0, 1]
        assert run(flat, value=1.0, prob_mode=mode, include_zero=False).keep == [0, 1, 2, 3]


def test_value_one_keeps_everything_with_include_zero():
    rewards = [[0.0, 30.0], [1.0, 1.0], [0.0, 0.1], [2.0, 2.0]]  # softmax mass of the small ones underflows 1e-9
    for mode in ("softmax", "linear"):
        assert run(rewards, value=1.0, prob_mode=mode).keep == [0, 1, 2, 3]
        assert run(rewards, value=1.0, prob_mode=mode, include_zero=False).keep == [0, 2]
    res = rv_filter(torch.tensor(rewards), RVFilterConfig(enabled=True))
    assert res.metrics["rv_filter/kept_ratio"] == 1.0 and res.loss_scale == 1.0


def test_include_zero_changes_the_softmax_normaliser():
    rewards = [[3.0, 3.0], [0.0, 1.0], [1.0, 0.0]]  # stds 0, a, a: probs 1/(1+2e^a), e^a/(1+2e^a) x2
    a = 1 / math.sqrt(2)
    assert math.exp(a) * 2 / (1 + 2 * math.exp(a)) < 0.85
    assert run(rewards, value=0.85).keep == [0, 1, 2]
    assert run(rewards, value=0.85, include_zero=False).keep == [1, 2]
    assert run(rewards, value=0.5, include_zero=False).keep == [1]


def test_linear_versus_softmax():
    rewards = [[0.0, 6.0], [0.0, 2.0], [1.0, 1.0], [4.0, 4.0]]  # stds 3 sqrt2, sqrt2, 0, 0
    # linear: 0.75, 0.25, 0, 0; softmax: ~0.919 for the first
    assert run(rewards, value=0.8, prob_mode="linear").keep == [0, 1]
    assert run(rewards, value=0.8, prob_mode="softmax").keep == [0]
    assert run(rewards, value=0.75, prob_mode="linear").keep == [0]
    assert run(rewards, value=0.99, prob_mode="linear").keep == [0, 1]  # zero-std groups carry no linear mass
    assert run(rewards, value=0.99, prob_mode="softmax").keep == [0, 1, 2, 3]


def test_loss_scaling_values():
    rewards = [[0.0, 10.0], [0.0, 1.0], [1.0, 1.0], [1.0, 1.0]]
    for scaling, expected in (("none", 1.0), ("linear", 0.25), ("sqrt", 0.5)):
        res = run(rewards, value=0.5, loss_scaling=scaling)
        assert res.keep == [0] and res.loss_scale == expected
        assert res.metrics["rv_filter/loss_scale"] == expected


def test_metrics_against_direct():
    rewards = [[0.0, 1.0, 1.0], [2.0, 2.0, 2.0], [0.0, 4.0, 1.0], [1.0, 0.0, 0.0]]
    res = run(rewards, value=0.6)
    stds = [slow_std(g) for g in rewards]
    m = res.metrics
    assert m["rv_filter/groups_kept"] == len(res.keep) and m["rv_filter/groups_total"] == 4
    assert m["rv_filter/kept_ratio"] == len(res.keep) / 4
    assert m["rv_filter/zero_std_groups"] == 1
    assert math.isclose(m["rv_filter/std_all_mean"], sum(stds) / 4, rel_tol=1e-12)
    assert math.isclose(m["rv_filter/std_kept_mean"], sum(stds[i] for i in res.keep) / len(res.keep), rel_tol=1e-12)


def test_group_size_one_disabled_and_bad_shapes():
    single = [[0.3], [1.0], [0.0]]
    res = run(single, value=0.5)  # std 0 everywhere, no NaN
    assert res.keep == [0, 1] and all(math.isfinite(v) for v in res.metrics.values())
    off = rv_filter(torch.tensor(TIES), RVFilterConfig(value=0.1, include_zero=False, loss_scaling="linear"))
    assert off.keep == [0, 1, 2, 3] and off.loss_scale == 1.0
    for bad in (torch.zeros(0, 4), torch.zeros(3, 0), torch.zeros(4)):
        with pytest.raises(ValueError, match="rewards must be"):
            rv_filter(bad, RVFilterConfig(enabled=True))


@settings(max_examples=100, deadline=None)
@given(
    data=st.data(),
    n=st.integers(1, 12),
    g=st.sampled_from([1, 2, 4, 8]),
    value=st.one_of(st.floats(0.01, 1.0), st.just(1.0)),
    prob_mode=st.sampled_from(["softmax", "linear"]),
    include_zero=st.booleans(),
    loss_scaling=st.sampled_from(["none", "linear", "sqrt"]),
)
def test_matches_slow_reference(data, n, g, value, prob_mode, include_zero, loss_scaling):
    # Small integer rewards and power-of-two group sizes: stds are bit-identical in both readings, so ties are
    # real ties (the point of the test) rather than rounding noise.
    rewards = data.draw(st.lists(st.lists(st.integers(0, 3).map(float), min_size=g, max_size=g),
                                 min_size=n, max_size=n))
    res = run(rewards, value=value, prob_mode=prob_mode, include_zero=include_zero, loss_scaling=loss_scaling)
    # run() already checked res.keep against the slow reference; these are the seed's invariants on top
    stds = [slow_std(r) for r in rewards]
    if any(s > 0 for s in stds) and not include_zero:
        assert all(stds[i] > 0 for i in res.keep)
    # kept groups are a prefix of the ranking: nothing dropped scores above anything kept
    dropped = [i for i in range(n) if i not in res.keep]
    if dropped:
        assert min(stds[i] for i in res.keep) >= max(stds[i] for i in dropped)
