"""Adaptive seeds: the alpha-spending boundaries against scipy's multivariate normal, the procedure's false-claim
rate and early stopping by simulation (autocorrelated learning curves, seeds shared across conditions), the
vectorised twin against the live look (`report.stats.paired_comparison`), and the campaign searcher's looks."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from scipy import integrate
from scipy import stats as sps

from orchestrator.campaign.sections import AdaptiveSeeds
from orchestrator.stats.sequential import (
    nominal_alphas,
    obrien_fleming_spending,
    sequential_paired_t,
    z_boundaries,
)
from orchestrator.tune.adaptive import CampaignSearcher, look

LOOKS = list(range(3, 17))  # start 3, max 16, step 1: the example


def _mvn_crossing(looks: list[int], bounds: np.ndarray) -> float:
    """P(some |Z_k| >= c_k) for the canonical joint distribution, by scipy's multivariate normal CDF."""
    n = np.asarray(looks, dtype=float)
    cov = np.sqrt(np.minimum.outer(n, n) / np.maximum.outer(n, n))
    inside = sps.multivariate_normal(cov=cov).cdf(bounds, lower_limit=-bounds)
    return 1.0 - inside


def test_boundaries_spend_the_alpha_function_look_by_look():
    looks = [3, 5, 8, 12]
    c = z_boundaries(looks)
    spent = obrien_fleming_spending(np.array(looks) / looks[-1])
    for k in range(1, len(looks) + 1):
        assert _mvn_crossing(looks[:k], c[:k]) == pytest.approx(spent[k - 1], abs=2e-4)
    assert spent[-1] == pytest.approx(0.05)
    assert np.all(np.diff(c) < 0)  # O'Brien-Fleming: strict early, near 1.96 at the end


def _curves(rng, campaigns: int, seeds: int, steps: int, effect: float) -> np.ndarray:
    """(campaigns, seeds) paired differences of normalized AUC over steps 0..steps-1 between two conditions whose
    curves share a per-seed level (seeds are paired) and carry AR(1) noise; `effect` shifts the other condition."""
    t = np.arange(steps)
    level = rng.normal(0.3, 0.05, (campaigns, seeds, 1))

    def ar1(shape, rho=0.7):
        e = rng.normal(0, 0.04, (*shape, steps))
        out = np.empty_like(e)
        out[..., 0] = e[..., 0]
        for s in range(1, steps):
            out[..., s] = rho * out[..., s - 1] + e[..., s]
        return out

    base = level + 0.01 * t + ar1((campaigns, seeds))
    other = level + (0.01 + effect) * t + ar1((campaigns, seeds))
    auc = lambda y: integrate.trapezoid(y, t, axis=-1) / (steps - 1)  # noqa: E731
    return auc(other) - auc(base)


def test_adaptive_seeds_hold_the_false_claim_rate_and_stop_early_under_an_effect():
    rng = np.random.default_rng(2026)
    null = _curves(rng, 6000, 16, 16, 0.0)
    claimed, used = sequential_paired_t(null, LOOKS)
    assert claimed.mean() <= 0.06, claimed.mean()
    # the same looks each at the nominal 5% claim far too often: what the spending prevents
    naive = np.zeros(len(null), dtype=bool)
    for n in LOOKS:
        naive |= sps.ttest_1samp(null[:, :n], 0.0, axis=1).pvalue < 0.05
    assert naive.mean() > 0.15

    sd = null.std()
    effect = _curves(rng, 3000, 16, 16, 0.8 * sd / 7.5)  # AUC shift of about 0.8 paired sd
    claimed, used = sequential_paired_t(effect, LOOKS)
    assert claimed.mean() > 0.75 and used.mean() < 13, (claimed.mean(), used.mean())
    assert np.mean(used[claimed] < 16) > 0.5  # most claims come before the fixed maximum


def test_vectorised_twin_decides_like_the_live_look(tmp_path):
    rng = np.random.default_rng(7)
    diffs = _curves(rng, 40, 8, 6, 0.004)
    looks = [3, 5, 8]
    claimed, used = sequential_paired_t(diffs, looks)
    levels = nominal_alphas(looks)
    cfg = AdaptiveSeeds(start=3, max=8, step=2, contrast="B-A", measure="final", metric="m")
    for i, d in enumerate(diffs):
        trials = []
        for s in range(8):
            for cond, value in (("A", 0.0), ("B", float(d[s]))):
                trials.append({"name": f"{cond}_s{s}", "condition": cond, "seed": s, "config": {"steps": 1}})
                tdir = tmp_path / str(i) / "trials" / f"{cond}_s{s}"
                tdir.mkdir(parents=True)
                (tdir / "metrics.jsonl").write_text(json.dumps({"step": 0, "m": value}) + "\n")
        (tmp_path / str(i) / "campaign.json").write_text(json.dumps({"name": "twin", "trials": trials}))
        live = None
        for n, level in zip(looks, levels, strict=True):
            if look(str(tmp_path / str(i)), n, cfg, float(level))["claimed"]:
                live = n
                break
        assert (live is not None) == bool(claimed[i]) and (live or 8) == used[i], i


def _write_rows(directory: Path, name: str, value: float) -> None:
    tdir = directory / "trials" / name
    tdir.mkdir(parents=True, exist_ok=True)
    rows = [{"step": s, "train/correct_rate": value} for s in range(3)]
    (tdir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def _drive(searcher: CampaignSearcher, directory: Path, values) -> list[str]:
    """Run the searcher as Tune would, every suggested trial ending at once with values(cond, seed)."""
    ran, i = [], 0
    while True:
        got = searcher.suggest(f"id{i}")
        if got == CampaignSearcher.FINISHED:
            return ran
        assert got is not None
        name = got["trial"]
        cond, seed = name.split("_s")
        _write_rows(directory, name, values(cond, int(seed)))
        searcher.on_trial_complete(f"id{i}", {})
        ran.append(name)
        i += 1


def _searcher(directory: Path, max_seeds: int) -> CampaignSearcher:
    order = [f"{c}_s{s}" for s in range(max_seeds) for c in ("C1", "C4")]
    cfg = AdaptiveSeeds(start=3, max=max_seeds, step=2, contrast="C4-C1", measure="final")
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "campaign.json").write_text(json.dumps({"name": "adaptive", "trials": [
        {"name": n, "condition": n.split("_s")[0], "seed": int(n.split("_s")[1]), "config": {"steps": 3}}
        for n in order]}))
    return CampaignSearcher(order, {n: int(n.split("_s")[1]) for n in order}, {n: n.split("_s")[0] for n in order},
                            str(directory), cfg)


def test_searcher_adds_paired_seeds_until_the_contrast_is_settled(tmp_path):
    # a clear effect: +0.2 with a little seed noise: settled at the first look that can (before the maximum)
    noise = dict(zip(("C1", "C4"), np.random.default_rng(0).normal(0, 0.02, (2, 16)), strict=True))
    ran = _drive(_searcher(tmp_path / "effect", 9), tmp_path / "effect",
                 lambda c, s: 0.5 + noise[c][s] + (0.2 if c == "C4" else 0.0))
    assert len(ran) < 18 and len(ran) % 2 == 0  # every condition got the same seeds
    looks = [json.loads(x) for x in (tmp_path / "effect" / "events.jsonl").read_text().splitlines()]
    assert looks[-1]["decision"] == "claim" and looks[-1]["lo"] > 0
    # no effect: seeds added look by look (3, 5, 7, 9) up to the maximum, no claim
    ran = _drive(_searcher(tmp_path / "null", 9), tmp_path / "null",
                 lambda c, s: 0.5 + noise[c][s])
    assert sorted(ran) == sorted(f"{c}_s{s}" for s in range(9) for c in ("C1", "C4"))
    looks = [json.loads(x) for x in (tmp_path / "null" / "events.jsonl").read_text().splitlines()]
    assert [x["seeds"] for x in looks] == [3, 5, 7, 9] and looks[-1]["decision"] == "stop at max"
