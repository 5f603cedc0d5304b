"""report.md keeps its two promises (issue 49), by a simulation written here with numpy / scipy only: the truth
(slopes, t-tests, Holm, detection at an effect) is computed in this file, never with the report's helpers, and
`build_report` is compared with it on written campaign directories.

- One primary test per report. No-effect campaigns at 3, 4 and 8 seeds, without a sweep (4 conditions: 3
  comparisons with the baseline, Holm over the primary measure's family) and with one (one condition, one key
  swept over 5 values: the primary test is the trend of AUC 0-15 over the values), show a `*` anywhere in
  report.md in <= 6% of campaigns, and in at most alpha + 3 standard errors of this simulation. The rate comes from
  CAMPAIGNS simulated campaigns per cell; `build_report` is run on a few of them per cell, chosen where the rule
  matters (the primary test marked, or an exploratory sweep test with p < 0.01 that a `*` per family would mark),
  and its report.md must carry a `*` exactly where this file says (a `*` per sweep family, what the report did
  before, showed one in 16% of no-effect sweep reports: the comparison fails there).
- The stated minimum detectable effect keeps its power: for each simulated campaign the report's MDE of C2 - C1 on
  the primary measure (power.csv, at the family's Bonferroni level) is planted into a fresh campaign, which a
  paired t-test then detects in >= 78% of campaigns at 3, 4 and 8 seeds (80% within 3 standard errors; the MDE
  from the observed sd as it is was detected in 62-64% at 3-4 seeds).

Generative model: a shared learning curve, a per-seed shift shared by every group (what pairing removes), and per
run an AR(1) deviation (rho 0.8) over 16 steps; eval/pass@1 logged every 5 steps (0, 5, 10, 15).
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
import pytest
from scipy import stats as sps

from orchestrator.report import ReportOptions, build_report
from orchestrator.stats.power import stated_mde

ALPHA, CAMPAIGNS, CHECKED = 0.05, 20_000, 5  # campaigns per cell for the rates; build_report runs per cell
STEPS, EVAL = 16, np.array([0, 5, 10, 15])
KEY, VALUES = "interventions.entropy_bonus.coeff", [0.0, 0.001, 0.01, 0.03, 0.1]
CONDITIONS = ["C1", "C2", "C3", "C4"]
MARK = re.compile(r"^\|.*\|\s*\*\s*\|\s*$")  # a table row whose last cell is a `*`


def _se(p: float, n: int) -> float:
    return math.sqrt(p * (1 - p) / n)


def _evals(rng: np.random.Generator, campaigns: int, groups: int, seeds: int) -> np.ndarray:
    """eval/pass@1 at the eval steps: (campaigns, groups, seeds, 4)."""
    eps = rng.normal(0, 0.02, (campaigns, groups, seeds, STEPS))
    dev = np.empty_like(eps)
    dev[..., 0] = eps[..., 0] / math.sqrt(1 - 0.8**2)
    for t in range(1, STEPS):
        dev[..., t] = 0.8 * dev[..., t - 1] + eps[..., t]
    curve = 0.3 + 0.12 * (1 - np.exp(-np.arange(STEPS) / 8.0))
    return (curve + rng.normal(0, 0.03, (campaigns, 1, seeds, 1)) + dev)[..., EVAL]


def _measures(ev: np.ndarray) -> dict[str, np.ndarray]:
    """The report's three measures, the trapezoid written out: step 15, AUC 0-10, AUC 0-15."""
    auc10 = (ev[..., 0] / 2 + ev[..., 1] + ev[..., 2] / 2) * 5 / 10
    auc15 = (ev[..., 0] / 2 + ev[..., 1] + ev[..., 2] + ev[..., 3] / 2) * 5 / 15
    return {"step 15": ev[..., 3], "AUC 0-10": auc10, "AUC 0-15": auc15}


def _t_p(x: np.ndarray) -> np.ndarray:
    """Two-sided one-sample t-test p-value of x's last axis against 0."""
    n = x.shape[-1]
    t = x.mean(axis=-1) / (x.std(axis=-1, ddof=1) / math.sqrt(n))
    return 2 * sps.t.sf(np.abs(t), n - 1)


def _holm_any(p: np.ndarray) -> np.ndarray:
    """Whether Holm at ALPHA rejects any test of the last axis: the smallest p below ALPHA / m."""
    return p.min(axis=-1) < ALPHA / p.shape[-1]


def _slopes(y: np.ndarray) -> np.ndarray:
    """Per seed the least-squares slope over VALUES: y (..., values, seeds) -> (..., seeds)."""
    x = np.asarray(VALUES) - np.mean(VALUES)
    return np.einsum("v,...vs->...s", x, y) / (x @ x)


# --- written campaigns -----------------------------------------------------------------------------------------

def _write(root: Path, ev: np.ndarray, sweep: bool) -> None:
    """campaign.json and each trial's metrics.jsonl; ev: (groups, seeds, 4)."""
    config = {"steps": STEPS, "eval": {"every": 5}, "rollout": {"prompts_per_step": 4, "n": 4}}
    trials = []
    for g in range(ev.shape[0]):
        for s in range(ev.shape[1]):
            cond = "C1" if sweep else CONDITIONS[g]
            name = f"{cond}_v{g}_s{s}" if sweep else f"{cond}_s{s}"
            trials.append({"name": name, "condition": cond, "seed": s, "config": config,
                           **({"sweep": {KEY: VALUES[g]}} if sweep else {})})
            rows = [{"step": k, "loss": 0.1} for k in range(STEPS)]
            for k, v in zip(EVAL, ev[g, s], strict=True):
                rows[k]["eval/pass@1"] = float(v)
            (root / "trials" / name).mkdir(parents=True)
            (root / "trials" / name / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (root / "campaign.json").write_text(json.dumps({"name": root.name, "trials": trials}))


def _marked_rows(markdown: str) -> list[str]:
    """Table rows of report.md whose last cell is a `*` (a header row, followed by |---, is not one)."""
    lines = markdown.splitlines()
    return [ln for ln, nxt in zip(lines, lines[1:] + [""], strict=True) if MARK.match(ln) and not nxt.startswith("|-")]


def _report(root: Path, ev: np.ndarray, sweep: bool):
    _write(root, ev, sweep)
    return build_report(root, ReportOptions(figures=False))


# --- one primary test per report --------------------------------------------------------------------------------

@pytest.mark.parametrize("sweep", [False, True], ids=["no sweep", "sweep"])
@pytest.mark.parametrize("seeds", [3, 4, 8])
def test_no_effect_reports_carry_a_star_at_most_alpha(seeds, sweep, tmp_path, record_property):
    rng = np.random.default_rng(49_000 + 10 * seeds + sweep)
    ev = _evals(rng, CAMPAIGNS, len(VALUES) if sweep else len(CONDITIONS), seeds)
    m = _measures(ev)
    if sweep:  # the primary test: the trend of AUC 0-15 over the swept values
        p_main = _t_p(_slopes(m["AUC 0-15"]))
        starred = p_main < ALPHA
        # exploratory: the other trends, the per-value deltas against the first value, the paired deltas table
        p_explore = np.concatenate([_t_p(_slopes(m["step 15"]))[:, None]]
                                   + [_t_p(v[:, 1:] - v[:, :1]) for v in m.values()], axis=1)
        per_family = starred | (p_explore.min(axis=1) < ALPHA / 4)  # a `*` in each family (Holm's first step)
        record_property("star_share_if_every_sweep_family_were_marked", float(per_family.mean()))
        interesting = ~starred & (p_explore.min(axis=1) < 0.01)
    else:  # the primary family: C2, C3, C4 against C1 on AUC 0-15, Holm
        starred = _holm_any(_t_p(m["AUC 0-15"][:, 1:] - m["AUC 0-15"][:, :1]))
        interesting = ~starred & np.any([_holm_any(_t_p(m[k][:, 1:] - m[k][:, :1])) for k in ("step 15", "AUC 0-10")],
                                        axis=0)
    share, se = float(starred.mean()), _se(float(starred.mean()), CAMPAIGNS)
    record_property("star_share", share)
    record_property("simulation_se", se)
    assert share <= 0.06 and share - 3 * se <= ALPHA, f"{seeds} seeds, sweep {sweep}: {share:.4f} +- {se:.4f}"
    # the report itself, on campaigns where the rule decides: marked ones and ones an exploratory test would mark
    picks = list(np.flatnonzero(interesting)[:CHECKED - 2]) + list(np.flatnonzero(starred)[:2])
    assert len(picks) == CHECKED
    for i in picks:
        rep = _report(tmp_path / f"c{i}", ev[i], sweep)
        rows = _marked_rows(rep.markdown)
        assert bool(rows) == starred[i], (i, starred[i], rows)
        assert len(rows) == int(starred[i]) or not sweep  # a sweep: only its one primary test
        header = rep.markdown.split("## Missing")[0]
        assert ("Primary test: the trend of **AUC 0-15**" in header) == sweep
        assert "Primary measure: **AUC 0-15**" in header or sweep


# --- the stated MDE keeps its power -----------------------------------------------------------------------------

@pytest.mark.parametrize("seeds", [3, 4, 8])
def test_the_stated_mde_is_detected_with_its_power(seeds, tmp_path, record_property):
    """Each campaign states the MDE of C2 - C1 on AUC 0-15 (family of 3: alpha 0.05 / 3); a fresh campaign from
    the same model with that effect planted in C2 is detected by the paired t-test at that level (|t| above
    scipy's t quantile, t written out) in >= 78% of campaigns."""
    rng = np.random.default_rng(4900 + seeds)
    alpha = ALPHA / 3
    ev = _evals(rng, CAMPAIGNS, len(CONDITIONS), seeds)
    diff = _measures(ev)["AUC 0-15"]
    diff = diff[:, 1] - diff[:, 0]
    sd = diff.std(axis=1, ddof=1)
    mde = stated_mde(seeds, 1.0, alpha) * sd  # the report's function, checked against power.csv below
    fresh = _measures(_evals(rng, CAMPAIGNS, 2, seeds))["AUC 0-15"]
    d = fresh[:, 1] + mde[:, None] - fresh[:, 0]
    t = d.mean(axis=1) / (d.std(axis=1, ddof=1) / math.sqrt(seeds))
    power = float((np.abs(t) > sps.t.isf(alpha / 2, seeds - 1)).mean())
    se = _se(0.8, CAMPAIGNS)
    # the observed sd as it is, for the record (what the report stated before)
    tc = sps.t.isf(alpha / 2, seeds - 1)
    plug_d = next(x for x in np.arange(0.01, 40, 0.001)
                  if sps.nct.sf(tc, seeds - 1, x * math.sqrt(seeds)) + sps.nct.cdf(-tc, seeds - 1, x * math.sqrt(seeds))
                  >= 0.8)
    d0 = fresh[:, 1] + plug_d * sd[:, None] - fresh[:, 0]
    t0 = d0.mean(axis=1) / (d0.std(axis=1, ddof=1) / math.sqrt(seeds))
    record_property("achieved_power", power)
    record_property("achieved_power_plug_in_mde", float((np.abs(t0) > tc).mean()))
    assert power >= 0.78 and abs(power - 0.8) <= 3 * se, (power, se)
    for i in range(2):  # the report states exactly this MDE
        rep = _report(tmp_path / f"c{i}", ev[i], sweep=False)
        row = rep.tables["power"].query("group == 'C2' and measure == 'AUC 0-15'").iloc[0]
        assert row.alpha == pytest.approx(alpha) and row.sd_diff == pytest.approx(sd[i], rel=1e-9)
        assert row.mde_at_current_seeds == pytest.approx(mde[i], rel=1e-9)
