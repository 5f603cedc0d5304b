"""Tolerances for comparing two float computations that differ only in the order they sum things.

Two evaluations of the same float32 sum in different orders (a two-rank all-reduce against one rank, another
micro-batch split, another CPU's vector width or BLAS blocking) are not bit-identical. Their difference is bounded
by the size of what is summed, not by a constant: for n terms x_i, any two orders differ by at most
2 (n - 1) u sum|x_i| (Higham, Accuracy and Stability of Numerical Algorithms, 2nd ed., section 4.2; u = eps / 2).
A fixed `atol=1e-6` holds on the machine it was tuned on and fails on the next (issue 54: a gradient off by 5.6e-6
on an Intel Xeon, 8e-8 on an AMD EPYC).

Each helper states what stands in for the terms' magnitudes:
- `assert_sum_close`: the caller knows the terms (or a bound on them) and how many there are: Higham's bound.
- `assert_close_to_scale`: the elements of a network's output or gradient are long chains of sums whose terms the
  test cannot see; the tensor's own largest magnitude stands in for them, times `NETWORK_ULPS` float32 epsilons.
  Measured (2026-11-29, AMD EPYC) on three kernel paths (AVX-512; AVX2 with MKL and oneDNN held to AVX2; scalar
  `ATEN_CPU_CAPABILITY=default` with `MKL_CBWR=COMPATIBLE`): the two-rank learner group's first-update gradients
  differ from one rank's by at most 29 eps x the tensor's largest element, its metrics by at most 31 eps x their
  own size. `NETWORK_ULPS` keeps a margin of ~35x; the errors these comparisons exist to catch (a gradient
  averaged instead of summed over ranks, a micro-batch dropped) exceed it ~4,000x
  (tests/integration/learner/test_learner_group_math.py injects them; tests/unit/test_tolerance.py on a
  synthetic gradient).

Comparisons that must be exact stay exact (`torch.equal`, `==`): the same computation in the same process order
(resume after a kill, a trial alone against the same trial beside others on one engine) sums in the same order,
so any difference there is a bug, not rounding.
"""

from __future__ import annotations

import math

import torch

EPS32 = float(torch.finfo(torch.float32).eps)  # 1.19e-7: the spacing of float32 numbers at 1.0
NETWORK_ULPS = 1024.0  # ~35x the largest first-step gradient difference measured over three CPU kernel paths


# The magnitude of the test models' logits: a log-prob computed by two implementations (vLLM's CPU kernels, the
# learner's torch forward) differs by rounding of that size (measured: max |logit| 13 for the tiny reasoner on random
# input, 0.8 for the arithmetic model; the observed vLLM-vs-learner gap ~5e-6 on AVX-512).
LOGIT_SCALE = 16.0
# Bound on |vLLM log-prob - learner log-prob| of the same token under the same fp32 weights: ~2e-3, while a wrong
# adapter, a wrong temperature or the unscaled log-prob mode are off by 0.1-10 nats.
LOGPROB_GAP = NETWORK_ULPS * EPS32 * LOGIT_SCALE


def sum_tolerance(magnitude: float, terms: int, ulps: float = 2.0) -> float:
    """Bound on |a - b| for two float32 evaluations of a sum of `terms` numbers whose magnitudes add up to
    `magnitude`: Higham's 2 (n - 1) u sum|x_i| with u = eps / 2, times `ulps` / 2 for the rounding of the inputs
    themselves (each term is itself a rounded product)."""
    return ulps * max(terms - 1, 1) * EPS32 * magnitude


def assert_sum_close(actual: torch.Tensor | float, expected: torch.Tensor | float, *, magnitude: float,
                     terms: int, ulps: float = 2.0, what: str = "value") -> None:
    """`actual` and `expected` are the same sum of `terms` terms, with sum|x_i| <= `magnitude`, in two orders."""
    atol = sum_tolerance(magnitude, terms, ulps)
    a, e = torch.as_tensor(actual, dtype=torch.float64), torch.as_tensor(expected, dtype=torch.float64)
    torch.testing.assert_close(a, e, rtol=0.0, atol=atol,
                               msg=lambda m: f"{what}: {m} (summation bound {atol:.3g}: {terms} terms, "
                                             f"magnitude {magnitude:.3g})")


def scale_tolerance(expected: torch.Tensor, ulps: float = NETWORK_ULPS) -> float:
    """`ulps` float32 epsilons times the tensor's largest magnitude (at least the smallest normal float32, so an
    all-zero tensor is compared exactly but for denormals)."""
    scale = float(expected.detach().abs().max()) if expected.numel() else 0.0
    return ulps * EPS32 * max(scale, float(torch.finfo(torch.float32).tiny))


def assert_close_to_scale(actual: torch.Tensor, expected: torch.Tensor, *, ulps: float = NETWORK_ULPS,
                          what: str = "tensor") -> None:
    """Every element of `actual` within `ulps` eps x max|expected| of `expected` (shapes and dtypes equal)."""
    atol = scale_tolerance(expected, ulps)
    torch.testing.assert_close(actual, expected, rtol=0.0, atol=atol,
                               msg=lambda m: f"{what}: {m} (tolerance {atol:.3g} = {ulps:g} eps x the largest "
                                             f"magnitude {atol / (ulps * EPS32):.3g})")


def close_to_scale(actual: float, expected: float, scale: float, ulps: float = NETWORK_ULPS) -> bool:
    """A scalar metric computed from a network's outputs (a loss, a mean log-prob): within `ulps` eps of `scale`,
    the magnitude of what was averaged (for a mean of |x_i|-sized terms, the mean of |x_i|). NaN equals NaN."""
    if math.isnan(expected):
        return math.isnan(actual)
    return abs(actual - expected) <= ulps * EPS32 * max(abs(scale), abs(expected))


def adam_tolerance(updates: list[torch.Tensor], others: list[torch.Tensor], lr: float, eps: float) -> torch.Tensor:
    """Per-element bound on |w_a - w_b| after Adam(W) took `len(updates)` steps from equal weights on both sides,
    with gradients (`updates` on one side, `others` on the other, step by step) that agree only to rounding
    (`scale_tolerance`).

    Adam's step lr * m / (sqrt(v) + eps) turns a gradient error d into a step error of at most
    lr * eps * d / (|g| + eps)^2 (the first step's; later steps average over earlier gradients, which only damps it).
    That is <= 1% of lr wherever |g| >= 10 sqrt(eps * d); an element whose gradient is smaller than that on either
    side at some step, and not exactly zero on both (no step at all: a LoRA A matrix while B is still zero), is
    rounding-sized there, and Adam may move it anywhere within its +-lr steps on either side: 2 lr a step.
    """
    steps = len(updates)
    sensitive = torch.zeros_like(updates[0], dtype=torch.bool)
    for g, h in zip(updates, others, strict=True):
        small = 10.0 * math.sqrt(eps * max(scale_tolerance(g), scale_tolerance(h)))
        sensitive |= ((g.abs() < small) | (h.abs() < small)) & ~((g == 0) & (h == 0))
    return torch.where(sensitive, 2.0 * lr * steps, 1e-2 * lr * steps)
