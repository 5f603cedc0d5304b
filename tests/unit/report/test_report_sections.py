"""Report sections: paired design (CRN check, distance from the baseline per step) and surprisal vs entropy."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from orchestrator.report import ReportOptions, build_report
from orchestrator.report.sections.decomposition import pooled
from workers.credit import shannon_entropy
from workers.credit.decomposition import decomposition_metrics

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _decomp_row(rng: np.random.Generator, lam: float, peak: float) -> dict[str, float]:
    """Real decomposition metrics of a random batch: on-policy samples from random logits."""
    g = torch.Generator().manual_seed(int(rng.integers(2**31)))
    logits = torch.randn(8, 20, 16, generator=g, dtype=torch.float64) * peak
    tokens = torch.multinomial(torch.softmax(logits.reshape(-1, 16), -1), 1, generator=g).reshape(8, 20)
    s = -torch.log_softmax(logits, -1).gather(-1, tokens[..., None]).squeeze(-1)
    h = shannon_entropy(logits)
    mask = torch.ones(8, 20, dtype=torch.bool)
    plan = torch.rand(8, 20, generator=g) < 0.05
    return decomposition_metrics(s, h, mask, plan, sepa_lambda=lam)


def write_campaign(root: Path, steps: int = 8, seeds=(0, 1, 2)) -> Path:
    rng = np.random.default_rng(0)
    effects = {"C1": 0.0, "C4": 0.02, "C8": 0.05}
    trials = []
    for cond in effects:
        for s in seeds:
            mode = "gtpo_sepa" if cond != "C1" else "none"
            trials.append({"name": f"{cond}_s{s}", "condition": cond, "seed": s, "sweep": {},
                           "config": {"steps": steps, "rollout": {"prompts_per_step": 4, "n": 4},
                                      "credit": {"transform_mode": mode}}})
    root.mkdir(parents=True)
    (root / "campaign.json").write_text(json.dumps({"name": "sections", "trials": trials}))
    start = {s: 0.3 + 0.05 * s for s in seeds}  # the shared step-0 value of each seed (CRN)
    for t in trials:
        cond, seed = t["condition"], t["seed"]
        rows = []
        for k in range(steps):
            lam = min(1.0, k / 4) if cond != "C1" else 0.0
            value = start[seed] + k * (0.01 + effects[cond])  # identical at step 0 across conditions
            row = {"step": k, "train/correct_rate": value, "credit/sepa_lambda": lam}
            if k % 4 == 0 or k == steps - 1:
                row["eval/pass@1"] = value + 0.01
            row.update(_decomp_row(rng, lam, peak=2.0))
            rows.append(json.dumps(row))
        tdir = root / "trials" / t["name"]
        tdir.mkdir(parents=True)
        (tdir / "metrics.jsonl").write_text("\n".join(rows) + "\n")
    return root


def test_sections_tables_markdown_and_figures(tmp_path):
    camp = write_campaign(tmp_path / "c")
    rep = build_report(camp, ReportOptions(out_dir=tmp_path / "out"))
    md = rep.markdown
    assert "## Paired design and distance from the baseline" in md
    assert "common random numbers" in md
    assert "identical across conditions for 3 of 3 seeds" in md
    assert "## Surprisal vs entropy (sampling noise)" in md
    dist = rep.tables["trajectory_distance"]
    c8 = dist[(dist.group == "C8") & (dist.metric == "train/correct_rate")].set_index("step")
    assert c8.loc[0, "mean_diff"] == 0.0 and c8.loc[0, "n_pairs"] == 3
    assert c8.loc[7, "mean_diff"] == pytest.approx(7 * 0.05)
    assert c8.loc[7, "mean_abs_diff"] == pytest.approx(7 * 0.05)
    ev = dist[(dist.group == "C4") & (dist.metric == "eval/pass@1")]
    assert sorted(ev.step) == [0, 4, 7]
    summary = rep.tables["decomposition"].set_index(["group", "token_class"])
    for g in ("C1", "C4", "C8"):
        r = summary.loc[(g, "exec")]
        assert r.surprisal_var == pytest.approx(r.entropy_var + r.noise_var + 2 * r["cov"], rel=1e-9)
        assert 0.5 < r.noise_share < 1.0  # on-policy samples from random logits: mostly sampling noise
    assert np.isnan(summary.loc[("C1", "exec"), "removed"])  # no SEPA: nothing removed
    assert summary.loc[("C8", "exec"), "removed"] > 0
    steps = rep.tables["decomposition_steps"]
    assert set(steps.token_class) == {"exec", "plan"} and steps.step.max() == 7
    for name in ("trajectory_distance", "decomposition_steps", "decomposition"):
        assert pd.read_csv(tmp_path / "out" / f"{name}.csv").shape[0] == len(rep.tables[name])
    names = {p.name for p in rep.figures}
    assert {"trajectory_distance.png", "decomposition.png"} <= names
    for name in ("trajectory_distance.png", "decomposition.png"):
        p = tmp_path / "out" / name
        assert p.read_bytes()[:8] == PNG_MAGIC and p.stat().st_size > 5000
        assert f"]({name})" in md


def test_crn_mismatch_is_reported_and_missing_decomposition_is_said(tmp_path):
    camp = write_campaign(tmp_path / "c", seeds=(0, 1))
    path = camp / "trials" / "C4_s1" / "metrics.jsonl"
    rows = [json.loads(x) for x in path.read_text().splitlines()]
    for r in rows:
        for k in [k for k in r if k.startswith("credit/decomp_")]:
            del r[k]
    rows[0]["train/correct_rate"] += 0.1
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    rep = build_report(camp, ReportOptions(figures=False))
    assert "for 1 of 2 seeds (bit for bit); differing: seed 1" in rep.markdown
    # C4 still has seed 0 with decomposition metrics
    assert "C4" in set(rep.tables["decomposition"].group)


def _engines(camp: Path, resources: dict, shift: float) -> str:
    """The campaign's trials given `resources`, C4_s1's step-0 correct rate moved by `shift`: the report's line."""
    meta = json.loads((camp / "campaign.json").read_text())
    for t in meta["trials"]:
        t["config"]["resources"] = resources
    (camp / "campaign.json").write_text(json.dumps(meta))
    path = camp / "trials" / "C4_s1" / "metrics.jsonl"
    rows = [json.loads(x) for x in path.read_text().splitlines()]
    rows[0]["train/correct_rate"] += shift
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    md = build_report(camp, ReportOptions(figures=False)).markdown
    return next(line for line in md.splitlines() if line.startswith("Check: step-0"))


GPU_SHARED = {"worker_gpus": 1, "learner_gpus": 1, "shared_base": {"slots": 2}}


def test_crn_accepts_the_stated_tolerance_on_shared_gpu_engines_that_are_not_batch_invariant(tmp_path):
    from orchestrator.report.sections.trajectories import STEP0_TOLERANCE

    line = _engines(write_campaign(tmp_path / "c", seeds=(0, 1)), GPU_SHARED, 0.02)
    assert line == ("Check: step-0 `train/correct_rate` is identical across conditions for 1 of 2 seeds (bit for "
                    f"bit); within the stated tolerance {STEP0_TOLERANCE:g} (engines not batch-invariant) for 1.")


@pytest.mark.parametrize("resources", [
    {**GPU_SHARED, "shared_base": {"slots": 2, "batch_invariant": True}},  # batch-invariant kernels
    {"shared_base": {"slots": 2}},  # CPU engines (worker_gpus 0)
    {"worker_gpus": 1, "learner_gpus": 1},  # separate engines
], ids=["batch_invariant", "cpu", "separate"])
def test_crn_requires_identity_where_the_engines_are_batch_invariant_or_cpu(tmp_path, resources):
    line = _engines(write_campaign(tmp_path / "c", seeds=(0, 1)), resources, 1e-9)
    assert "for 1 of 2 seeds (bit for bit); differing: seed 1: " in line and "tolerance" not in line, line


def test_crn_beyond_the_tolerance_is_a_mismatch_that_names_it(tmp_path):
    line = _engines(write_campaign(tmp_path / "c", seeds=(0, 1)), GPU_SHARED, 0.06)
    assert "for 1 of 2 seeds (bit for bit); differing: seed 1: " in line, line
    assert line.endswith("(beyond the stated tolerance 0.05).") and "within" not in line, line


def _near_deterministic(g: torch.Generator, n: int) -> torch.Tensor:
    """Logits of planning tokens the policy is almost sure of (p(argmax) ~ 0.99-0.999 over 8 tokens)."""
    logits = 0.3 * torch.randn(n, 8, generator=g, dtype=torch.float64)
    logits[:, 0] += 5.0 + 3.0 * torch.rand(n, generator=g, dtype=torch.float64)
    return logits


def test_noise_share_is_a_pooled_ratio_near_the_truth_and_nan_below_the_token_floor(tmp_path):
    """35 near-deterministic planning tokens per step: a step's Cov(S, N) / Var(S) is anything (the mean of
    per-step ratios is far below 0 here), the ratio of pooled sums is near the population share
    E[varentropy] / (Var(H) + E[varentropy]) computed from the exact distributions (workers.credit)."""
    from workers.credit import varentropy

    g = torch.Generator().manual_seed(0)
    big = _near_deterministic(g, 100_000)
    h, ve = shannon_entropy(big[None])[0], varentropy(big[None])[0]
    truth = float(ve.mean() / (h.var(unbiased=False) + ve.mean()))
    trials, per_step = [], []
    for seed, plan_per_step in ((0, 35), (1, 35), (2, 35), (3, 1)):  # seed 3: 1 planning token per step
        name = f"C1_s{seed}"
        trials.append({"name": name, "condition": "C1", "seed": seed, "sweep": {}, "config": {"steps": 20}})
        rows = []
        for k in range(20):
            logits = torch.cat([_near_deterministic(g, plan_per_step), 2.0 * torch.randn(120, 8, generator=g,
                                                                                           dtype=torch.float64)])
            y = torch.multinomial(torch.softmax(logits, -1), 1, generator=g)[:, 0]
            s = -torch.log_softmax(logits, -1).gather(-1, y[:, None])[:, 0]
            plan = torch.arange(logits.shape[0]) < plan_per_step
            row = decomposition_metrics(s[None], shannon_entropy(logits[None])[0][None],
                                        torch.ones(1, s.numel(), dtype=torch.bool), plan[None])
            if seed < 3:
                per_step.append(row["credit/decomp_plan_noise_share"])
            rows.append(json.dumps({"step": k, "train/correct_rate": 0.3, **row}))
        d = tmp_path / "trials" / name
        d.mkdir(parents=True)
        (d / "metrics.jsonl").write_text("\n".join(rows) + "\n")
    (tmp_path / "campaign.json").write_text(json.dumps({"name": "d", "trials": trials}))
    assert np.nanmean(per_step) < 0.0 < truth  # what a mean of per-step ratios would say
    rep = build_report(tmp_path, ReportOptions(figures=False))
    plan = rep.tables["decomposition"].set_index("token_class").loc["plan"]
    assert plan.noise_share == pytest.approx(truth, abs=0.03)
    assert plan.noise_share_ci_low < truth < plan.noise_share_ci_high <= 1.05
    assert 0.0 <= plan.noise_share_varentropy <= 1.0 and plan.noise_share_varentropy == pytest.approx(truth, abs=0.03)
    steps = rep.tables["decomposition_steps"]
    assert (steps[steps.token_class == "plan"].tokens == 3 * 35 + 1).all()
    # seed 3's 20 planning tokens in all give no share (below the 30-token floor), so it does not drag the mean
    assert math.isnan(pooled(np.ones(20), {"noise_part": np.ones(20), "surprisal_var": np.ones(20)})["noise_share"])
    assert pooled(np.ones(30), {"noise_part": np.ones(30), "surprisal_var": np.full(30, 2.0)})["noise_share"] == 0.5


def _isolation_line(camp: Path, records: dict[str, dict]) -> str:
    for name, rec in records.items():
        (camp / "trials" / name / "isolation.json").write_text(json.dumps(rec))
    md = build_report(camp, ReportOptions(figures=False)).markdown
    return next((line for line in md.splitlines() if line.startswith("Isolation (")), "")


def _probe(diff: float, gpu: bool = True, invariant: bool = False) -> dict:
    return {"identical": diff == 0.0, "max_abs_diff": diff, "tokens": 40, "batch_invariant": invariant, "gpu": gpu}


def test_isolation_says_which_held_per_trial(tmp_path):
    """The pool trials' probes (isolation.json): the same bits, within the stated tolerance on GPU engines without
    batch-invariant kernels, or beyond it; batch-invariant or CPU engines must give the same bits. No probe: no
    line."""
    from orchestrator.report.sections.isolation import ISOLATION_TOLERANCE

    assert _isolation_line(write_campaign(tmp_path / "none", seeds=(0,)), {}) == ""
    line = _isolation_line(write_campaign(tmp_path / "a", seeds=(0,)),
                           {"C1_s0": _probe(0.0), "C4_s0": _probe(0.01)})
    assert line.endswith(f"the same bits for 1 of 2 trials; within the stated tolerance {ISOLATION_TOLERANCE:g} "
                         "nats (engines not batch-invariant) for 1, largest 0.01."), line
    line = _isolation_line(write_campaign(tmp_path / "b", seeds=(0,)),
                           {"C1_s0": _probe(0.01, invariant=True), "C4_s0": _probe(0.2)})
    assert "the same bits for 0 of 2 trials; beyond: C1_s0: max |delta| 0.01 where batch-invariant kernels must " \
           "give the same bits; C4_s0: max |delta| 0.2, beyond the stated tolerance 0.05." in line, line
    line = _isolation_line(write_campaign(tmp_path / "c", seeds=(0,)), {"C1_s0": _probe(1e-7, gpu=False)})
    assert line.endswith("beyond: C1_s0: max |delta| 1e-07 where CPU engines must give the same bits."), line
