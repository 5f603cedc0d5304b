"""The dashboard fits the data: a tiny two-condition campaign with a swept key runs offline on the real stack, its W&B
offline runs are read back from their files, and every metric and config key the campaign's view references
exists in those runs, and every logged metric family has a panel. The same campaign, with a second held-out set
(`eval.sets`), is then evaluated offline (`python -m orchestrator eval`): its checkpoint of step 1 reproduces the
in-training evaluation of step 2 (the same policy and seeds), and the report compares it."""

from __future__ import annotations

import csv
import gzip
import json
import subprocess
import sys
from pathlib import Path

import yaml

from orchestrator.campaign.expand import load_campaign
from orchestrator.tracking.names import family, logged_metrics
from orchestrator.tracking.offline import read_run
from orchestrator.tracking.workspace import VIEW_FILE, build_workspace, panel_keys
from orchestrator.tune.launch import run_campaign

ROOT = Path(__file__).resolve().parents[3]
STEPS = 3


def _config_value(config: dict, path: str):
    """A nested config value by dotted path, as W&B reads `config:a.b.c` (KeyError when absent)."""
    node = config
    for part in path.split("."):
        node = node[part]
    return node


def logged_keys(row: dict) -> set[str]:
    """A history row's logged names: a table's or an image's fields (`samples/eval/_type`, `.../nrows`) count as
    the one name it was logged under."""
    media = {k.removesuffix("/_type") for k in row if k.endswith("/_type")}
    return {next((m for m in media if k.startswith(m + "/")), k) for k in row if not k.startswith("_")}


def test_view_references_only_what_the_offline_runs_hold(ray_local, tmp_path):
    path = tmp_path / "dash.yaml"
    path.write_text(yaml.safe_dump({
        "name": "dash", "storage": str(tmp_path / "store"), "seeds": [0], "wandb": {"mode": "offline"},
        "base": {"steps": STEPS, "model": {"name": "tiny"}, "task": {"name": "arithmetic"},
                 "rollout": {"prompts_per_step": 4, "n": 4, "max_tokens": 4}, "learner": {"optim": {"lr": 1e-2}},
                 "eval": {"every": 2, "problems": 4, "n": 2, "k": 2,
                          "sets": [{"name": "small", "task": {"name": "arithmetic", "max_operand": 3}}]},
                 "checkpoint": {"every": 2}},  # steps 1 and 2: `eval --step 1` below
        "conditions": {
            "grpo": {"credit": {"advantage_mode": "grpo"}},
            "sepa": {"credit": {"transform_mode": "gtpo_sepa", "log_decomposition": True,
                                "sepa": {"steps": 2, "delay_steps": 0}},
                     "interventions": {"rv_filter": {"enabled": True, "value": 0.9}}},
        },
        "sweep": {"interventions.kl.coef": [0.05]},  # one value: a swept key's panels and grouping, two trials
        # the two trials as adapters on one pool (one engine and one learner start, not two each): a pool slot's
        # run logs the rows a separate trial's does (the slot's record goes to events.jsonl, not to W&B)
        "resources": {"rollout_workers": 1, "worker_cpus": 0.5, "learner_cpus": 0.5, "driver_cpus": 0.25,
                      "shared_base": {"slots": 2}},
    }))
    campaign = load_campaign(path)
    assert run_campaign(campaign) == 0
    files = sorted((Path(campaign.directory) / "wandb").glob("offline-run-*/run-*.wandb"))
    runs = {r["config"]["name"]: r for r in map(read_run, files)}
    assert sorted(runs) == sorted(t.name for t in campaign.trials)

    view = build_workspace(campaign, "entity", "project")
    keys = [k for s in view.sections for p in s.panels for k in panel_keys(p)]
    history = {name: {k for row in r["history"] for k in logged_keys(row)} for name, r in runs.items()}
    for t in campaign.trials:  # the one list of names agrees with what each trial really logged
        assert history[t.name] <= logged_metrics(t.trial), (t.name, history[t.name] - logged_metrics(t.trial))
    logged = set().union(*history.values())
    for key in keys:
        kind, _, name = key.rpartition(":")
        if kind == "config":
            for r in runs.values():
                _config_value(r["config"], name)
        elif kind == "summary":
            assert any(name in r["summary"] for r in runs.values()), key
        else:
            assert name in logged, key
    shown = {family(k.rpartition(":")[2]) for k in keys}
    charted = {family(k) for k in logged} - {"samples"}  # tables of text (the run page shows them), not charts
    assert charted <= shown, charted - shown
    assert {"samples/train", "samples/eval"} <= logged  # the samples files' rows as W&B tables
    for g in view.runset_settings.groupby:  # grouped by condition and the swept key, both in every run's config
        for r in runs.values():
            _config_value(r["config"], g.name)
    assert {r["group"] for r in runs.values()} == {"dash"}
    assert {r["job_type"] for r in runs.values()} == set(campaign.config.conditions)
    kl = {n: runs[n]["summary"] for n in runs}
    assert all(0.0 <= s["auc/eval/pass@1"] <= 1.0 for s in kl.values()), kl  # the sweep panels' AUC

    assert {"eval/small/pass@1", "eval/small/pass@k"} <= logged  # eval.sets, in the view's "Held-out sets"
    _offline_eval_equals_the_in_training_one(path, campaign)

    # the command a user runs: the view's JSON next to the report, no network
    out = subprocess.run([sys.executable, "-m", "orchestrator", "dashboard", str(path), "--dry-run"], cwd=ROOT,
                         capture_output=True, text=True, errors="replace", timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "[Sweep: interventions.kl.coef]" in out.stdout and "KL to the reference" in out.stdout
    saved = json.loads((Path(campaign.directory) / "report" / VIEW_FILE).read_text())
    assert saved["displayName"] == "dash" and saved["spec"]["section"]["runSets"][0]["grouping"] == [
        {"section": "config", "name": "condition.value"},
        {"section": "config", "name": "interventions.value.kl.coef"}]

    # the report as a W&B Report (offline: its run written for a sync, the Report for the next `dashboard`)
    out = subprocess.run([sys.executable, "-m", "orchestrator", "report", str(path), "--window", "0-2",
                          "--publish", "wandb"], cwd=ROOT, capture_output=True, text=True, errors="replace",
                          timeout=300)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert "wandb sync" in out.stdout and "orchestrator dashboard" in out.stdout
    recorded = json.loads((Path(campaign.directory) / "report" / "wandb_report.json").read_text())
    (report_run,) = [read_run(f) for f in (Path(campaign.directory) / "wandb").glob("offline-run-*/run-*.wandb")
                     if recorded["report_run"] in f.name]
    assert report_run["group"] == "dash" and report_run["job_type"] == "report"
    figure_keys = {k.removesuffix("/_type") for row in report_run["history"] for k in row  # an image's fields
                   if k.startswith("figures/") and k.endswith("/_type")}
    blocks = recorded["report"]["spec"]["blocks"]
    media = [k for b in blocks for p in b.get("metadata", {}).get("panelBankSectionConfig", {}).get("panels", [])
             if p["viewType"] == "Media Browser" for k in p["config"]["mediaKeys"]]
    assert len(media) >= 4 and set(media) == figure_keys, (media, figure_keys)
    offline = (Path(campaign.directory) / "report" / "offline_eval.csv").read_text().splitlines()
    assert len(offline) == 1 + 2 * 2  # 2 groups x (default, small) at checkpoint 1
    assert "## Offline evaluation" in (Path(campaign.directory) / "report" / "report.md").read_text()


def _offline_eval_equals_the_in_training_one(path: Path, campaign) -> None:
    """`eval --step 1` on one engine: every trial's checkpoint of step 1 on its task's own held-out set and on
    `small` gives the numbers and the very completions of the in-training evaluation of step 2."""
    from orchestrator.cli import main

    assert main(["eval", str(path), "--step", "1", "--engines", "1"]) == 0
    for t in campaign.trials:
        tdir = Path(campaign.directory) / "trials" / t.name
        row = [json.loads(ln) for ln in (tdir / "metrics.jsonl").read_text().splitlines()][2]
        for name, prefix in (("default", "eval/"), ("small", "eval/small/")):
            with open(tdir / "eval" / f"{name}.csv") as f:
                (got,) = list(csv.DictReader(f))
            assert (got["checkpoint_step"], got["eval_step"], got["set"]) == ("1", "2", name)
            assert [float(got[m]) for m in ("pass@1", "pass@k", "problems")] == \
                [row[prefix + m] for m in ("pass@1", "pass@k", "problems")], (t.name, name, got, row)
        with gzip.open(tdir / "eval" / "default_checkpoint_1.jsonl.gz", "rt") as f:
            offline = [json.loads(ln) for ln in f]
        with gzip.open(tdir / "samples" / "eval_step_2.jsonl.gz", "rt") as f:
            trained = [json.loads(ln) for ln in f]
        assert [(r["problem"], r["completion"], r["reward"], r["adapter_version"]) for r in offline] == \
            [(r["problem"], r["completion"], r["reward"], r["adapter_version"]) for r in trained], t.name
