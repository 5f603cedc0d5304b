"""The campaign's W&B view, built with the real wandb-workspaces library for the shipped campaigns (no network)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
import wandb_workspaces.reports.v2 as wr
import wandb_workspaces.workspaces as ws
from wandb_workspaces.workspaces import internal

from orchestrator.campaign.expand import load_campaign
from orchestrator.cli import main
from orchestrator.config.trial import TrialConfig
from orchestrator.tracking import dashboard as dash
from orchestrator.tracking import workspace as wsp
from orchestrator.tracking.names import family, logged_metrics, summary_metrics
from orchestrator.tracking.run import TrialTracker

ROOT = Path(__file__).resolve().parents[3]
CAMPAIGNS = ["campaigns/sepa_lean.yaml", "campaigns/ragen/sokoban_kl.yaml", "campaigns/ragen/frozenlake_rv_filter.yaml"]


@pytest.fixture(autouse=True)
def _storage(tmp_path, monkeypatch):
    monkeypatch.setenv("ORCHESTRATOR_STORAGE", str(tmp_path / "store"))


def _view(path: str):
    campaign = load_campaign(ROOT / path)
    return campaign, wsp.build_workspace(campaign, "ent", "proj")


def _panels(view) -> dict[str, list]:
    return {s.name: s.panels for s in view.sections}


def _titles(view) -> set[str]:
    return {p.title for s in view.sections for p in s.panels}


def _keys(view) -> list[str]:
    return [k for s in view.sections for p in s.panels for k in wsp.panel_keys(p)]


@pytest.mark.parametrize("path", CAMPAIGNS)
def test_view_is_filtered_grouped_and_names_only_logged_metrics(path):
    campaign, view = _view(path)
    cfg = campaign.config
    assert view.name == cfg.name and (view.entity, view.project) == ("ent", "proj")
    filters = wsp.payload(view)["spec"]["section"]["runSets"][0]["filters"]["filters"]
    assert [(f["key"]["name"], f["op"], f["value"]) for f in filters] == [
        ("group", "=", cfg.name), ("jobType", "IN", list(cfg.conditions))]
    assert [g.name for g in view.runset_settings.groupby] == ["condition", *cfg.sweep]
    logged = set().union(*(logged_metrics(t.trial) for t in campaign.trials))
    summary = set().union(*(summary_metrics(t.trial) for t in campaign.trials))
    for key in _keys(view):
        kind, _, name = key.rpartition(":")
        if kind == "config":
            assert name in cfg.sweep, key
        else:
            assert name in (logged | summary if kind == "summary" else logged), key
    assert all(s.panels for s in view.sections)
    assert view.settings.max_runs >= len(campaign.trials)
    json.dumps(wsp.payload(view))  # what the library would send, built offline


def test_sepa_lean_shows_credit_diagnostics_and_no_interventions_or_sweep():
    _, view = _view("campaigns/sepa_lean.yaml")
    sections = _panels(view)
    assert list(sections) == ["Outcome", "Effective batch", "Credit diagnostics", "PPO and critic", "Rollout and timing"]
    batch = {p.title: p.y for p in sections["Effective batch"]}
    assert batch["groups sampled / informative / trained"] == [
        "train/groups_sampled", "train/groups_informative", "train/groups_kept"]
    assert batch["tokens trained"] == ["train/tokens_trained"] and batch["refill rounds"] == ["train/fill_rounds"]
    assert batch["overlong share / masked"] == ["train/overlong_share"]  # overlong mode keep: nothing masked
    outcome = {p.title: p for p in sections["Outcome"]}
    curve = outcome["eval/pass@1 (report metric)"]
    assert curve.y == ["eval/pass@1"] and (curve.groupby_aggfunc, curve.groupby_rangefunc) == ("mean", "stderr")
    assert outcome["train correct rate"].y == ["train/correct_rate"]
    credit = {p.title: p.y for p in sections["Credit diagnostics"]}
    assert credit["SEPA lambda"][0] == "credit/sepa_lambda"
    assert credit["execution surprisal variance (before / after the token stages)"] == [
        "credit/exec_surprisal_var", "credit/exec_surprisal_var_after"]
    assert not any(k.startswith(("kl/", "rv_filter/", "env/", "critic/", "loss/value")) for k in _keys(view))


@pytest.mark.parametrize("path, key", [("campaigns/ragen/sokoban_kl.yaml", "interventions.kl.coef"),
                                       ("campaigns/ragen/frozenlake_rv_filter.yaml", "task.success_rate")])
def test_a_sweep_section_per_swept_key_with_final_auc_and_parallel_coordinates(path, key):
    _, view = _view(path)
    sections = _panels(view)
    final, auc = sections[f"Sweep: {key}"]
    assert isinstance(final, wr.ScatterPlot) and final.x == wr.Config(key)
    assert final.y == wr.SummaryMetric("eval/success") and auc.y == wr.SummaryMetric("auc/eval/success")
    (parallel,) = sections["Sweep: all keys"]
    assert isinstance(parallel, wr.ParallelCoordinatesPlot)
    assert wsp.panel_keys(parallel) == [f"config:{key}", "summary:eval/success", "summary:auc/eval/success"]
    assert "Environment" in sections and "Credit diagnostics" in sections
    assert {"critic explained variance", "value loss", "clip fraction"} <= _titles(view)
    assert "SEPA lambda" not in _titles(view)  # no trial runs SEPA


def test_panels_follow_the_interventions_the_trials_use():
    _, kl = _view("campaigns/ragen/sokoban_kl.yaml")
    _, rv = _view("campaigns/ragen/frozenlake_rv_filter.yaml")
    kl_titles, rv_titles = _titles(kl), _titles(rv)
    assert {"KL to the reference", "KL loss term"} <= kl_titles
    assert not any(t.startswith("RV filter") for t in kl_titles)  # enabled at top-p 1 keeping zeros: drops nothing
    assert "entropy bonus term" not in kl_titles  # coeff 0
    assert {"RV filter: kept ratio", "entropy bonus term"} <= rv_titles
    assert not any("KL" in t for t in rv_titles)


def test_saving_again_updates_the_same_view(monkeypatch):
    campaign, view = _view("campaigns/ragen/sokoban_kl.yaml")
    again = wsp.build_workspace(campaign, "ent", "proj")
    other = wsp.build_workspace(load_campaign(ROOT / "campaigns/sepa_lean.yaml"), "ent", "proj")
    assert view._internal_name == again._internal_name != other._internal_name
    assert internal._internal_name_to_url_query_str(view._internal_name).isalnum()
    sent, stored = [], {}

    def upsert(model):  # W&B's server, as the library talks to it: names are unique per project
        sent.append((model.name, model.id, model.display_name))
        stored.setdefault(model.name, f"id-{len(stored)}")
        return {"upsertView": {"view": {"name": model.name, "id": stored[model.name]}}}

    def from_name(entity, project, name):
        if name not in stored:
            raise ValueError(f"Workspace `{name}` not found in project `{project}`")
        return type("V", (), {"id": stored[name]})()

    monkeypatch.setattr(internal, "upsert_view2", upsert)
    monkeypatch.setattr(internal.View, "from_name", staticmethod(from_name))
    monkeypatch.setattr(ws.Workspace, "url", property(lambda self: f"https://wandb.ai/{self._internal_name}"))
    first = dash.save_workspace(view)
    second = dash.save_workspace(again)
    assert first == second and sent == [(view._internal_name, "", "sokoban_kl"),
                                        (view._internal_name, "id-0", "sokoban_kl")]


def test_dry_run_writes_the_view_next_to_the_report(tmp_path, capsys):
    assert main(["dashboard", str(ROOT / "campaigns/ragen/frozenlake_rv_filter.yaml"), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "[Sweep: task.success_rate]" in out and "[Environment]" in out and "nothing sent to W&B" in out
    written = tmp_path / "store" / "frozenlake_rv_filter" / "report" / wsp.VIEW_FILE
    spec = json.loads(written.read_text())["spec"]
    names = [s["name"] for s in spec["section"]["panelBankConfig"]["sections"]]
    assert names[:3] == ["Outcome", "Sweep: task.success_rate", "Sweep: all keys"]


def test_a_missing_campaign_file_is_one_line_and_exit_2(tmp_path, capsys):
    assert main(["dashboard", str(tmp_path / "nope.yaml"), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1


def test_wandb_report_is_built_offline_from_the_report_dir(tmp_path):
    from orchestrator.tracking.wandb_report import build_wandb_report, describe_report, report_payload

    campaign = load_campaign(ROOT / "campaigns/ragen/sokoban_kl.yaml")
    (tmp_path / "report.md").write_text("# Report\n\n| a | b |\n|---|---|\n| 1 | 2 |\n\n"
                                        "![learning_curves](learning_curves.png)\n![auc_forest](auc_forest.png)\n")
    report = build_wandb_report(campaign, tmp_path, "run-123", "ent", "proj", resolve=False)
    markdown, _, figures, _, runs = report.blocks
    assert "| 1 | 2 |" in markdown.text and "png" not in markdown.text
    assert [p.media_keys for p in figures.panels] == [["figures/learning_curves"], ["figures/auc_forest"]]
    assert figures.runsets[0].filters == 'Metric("ID") == \'run-123\''
    assert any(isinstance(p, wr.ScatterPlot) for p in runs.panels)
    payload = report_payload(report)
    assert payload["spec"]["blocks"] and "Report" in describe_report(report)


def test_tracker_writes_the_auc_summary_of_the_report_metric():
    cfg = TrialConfig(steps=21)
    tracker = TrialTracker(cfg)  # wandb disabled: no run, still the summary it would write
    values = {0: 0.1, 10: 0.5, 20: 0.3}
    for step in range(21):
        tracker.log({"step": step, "train/correct_rate": step / 20,
                     **({"eval/pass@1": values[step]} if step in values else {})})
    auc = tracker.auc_summary()
    assert auc["auc/eval/pass@1"] == pytest.approx(((0.1 + 0.5) / 2 * 10 + (0.5 + 0.3) / 2 * 10) / 20)
    assert auc["auc/train/correct_rate"] == pytest.approx(0.5)


def test_metric_list_names_what_the_producers_return():
    from workers.credit.decomposition import decomposition_metrics
    from workers.objectives.filters import nonfinite_groups, rv_filter
    from workers.objectives.interventions import RVFilterConfig
    from workers.objectives.losses import truncated_importance_weights

    cfg = TrialConfig.model_validate({"credit": {"transform_mode": "gtpo_sepa", "log_decomposition": True,
                                                 "sepa": {"steps": 10}},
                                      "interventions": {"rv_filter": {"enabled": True}},
                                      "rollout": {"mode": "one_step_off"}})
    names = logged_metrics(cfg)
    lp = torch.zeros(2, 3)
    mask = torch.ones(2, 3, dtype=torch.bool)
    produced = {*rv_filter(torch.tensor([[0.0, 1.0], [1.0, 1.0]]), RVFilterConfig(enabled=True)).metrics,
                *nonfinite_groups([[0.0, 1.0]]).metrics,
                *truncated_importance_weights(lp, lp, mask, 2.0)[2],
                *decomposition_metrics(lp, lp, mask, mask & False, sepa_lambda=0.5)}
    assert produced <= names, produced - names
    assert {family(n) for n in names} >= {"rv_filter", "tis", "credit", "train", "time", "rollout", "eval"}


def test_online_campaign_saves_its_view_at_start_and_a_failure_is_one_warning(tmp_path, monkeypatch, capsys):
    import yaml

    key = tmp_path / "key"
    key.write_text("k" * 40 + "\n")
    monkeypatch.setenv("WANDB_API_KEY", "")  # recorded, so the key the save sets is undone after the test
    monkeypatch.delenv("WANDB_API_KEY")
    data = yaml.safe_load((ROOT / "campaigns/ragen/sokoban_kl.yaml").read_text())
    path = tmp_path / "online.yaml"
    path.write_text(yaml.safe_dump({**data, "wandb": {"mode": "online", "entity": "me", "project": "p",
                                                      "api_key_file": str(key)}}))
    campaign = load_campaign(path)
    saved = []
    monkeypatch.setattr(dash, "save_workspace", lambda view: saved.append(view) or "https://wandb.ai/me/p?nw=x")
    dash.save_at_start(campaign)
    assert capsys.readouterr().out == "W&B workspace: https://wandb.ai/me/p?nw=x\n"
    assert [v.name for v in saved] == ["sokoban_kl"] and os.environ["WANDB_API_KEY"] == "k" * 40

    def unreachable(view):
        raise ConnectionError("api.wandb.ai unreachable")

    monkeypatch.setattr(dash, "save_workspace", unreachable)
    dash.save_at_start(campaign)  # no exception: the campaign goes on
    out = capsys.readouterr().out
    assert out.startswith("warning: W&B workspace not saved (ConnectionError") and out.count("\n") == 1
    dash.save_at_start(load_campaign(ROOT / "campaigns/ragen/sokoban_kl.yaml"))  # offline: nothing to do
    assert capsys.readouterr().out == ""


def test_a_categorical_sweep_gets_bars_per_value(tmp_path):
    import yaml

    path = tmp_path / "cat.yaml"
    path.write_text(yaml.safe_dump({"name": "cat", "storage": str(tmp_path), "seeds": [0, 1],
                                    "conditions": {"A": {}}, "sweep": {"credit.advantage_mode": ["grpo", "maxrl"],
                                                                        "learner.optim.lr": [0.01, 0.001]}}))
    view = wsp.build_workspace(load_campaign(path), "ent", "proj")
    sections = _panels(view)
    (bars,) = sections["Sweep: credit.advantage_mode"]
    assert isinstance(bars, wr.BarPlot) and wsp.panel_keys(bars) == [
        "summary:eval/pass@1", "summary:auc/eval/pass@1", "config:credit.advantage_mode"]
    assert all(isinstance(p, wr.ScatterPlot) for p in sections["Sweep: learner.optim.lr"])
    (parallel,) = sections["Sweep: all keys"]
    assert wsp.panel_keys(parallel)[:2] == ["config:credit.advantage_mode", "config:learner.optim.lr"]


def test_report_publish_dry_run_writes_the_wandb_report_and_logs_nothing(tmp_path, capsys):
    import yaml

    from tests.unit.report.test_report_build import write_campaign

    store_dir = tmp_path / "store"
    write_campaign(store_dir / "syn", effects={"C1": 0.0, "C2": 0.03}, seeds=range(3))
    f = tmp_path / "syn.yaml"
    f.write_text(yaml.safe_dump({"name": "syn", "seeds": [0, 1, 2], "conditions": {"C1": {}, "C2": {}},
                                 "storage": str(store_dir)}))
    assert main(["report", str(f), "--publish", "wandb", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "W&B Report 'syn: statistical report'" in out and "nothing sent to W&B" in out
    report_dir = store_dir / "syn" / "report"
    written = json.loads((report_dir / "wandb_report.dry-run.json").read_text())
    panels = [p for b in written["report"]["spec"]["blocks"]
              for p in b.get("metadata", {}).get("panelBankSectionConfig", {}).get("panels", [])]
    figures = sorted(p.stem for p in report_dir.glob("*.png"))
    assert sorted(k.removeprefix("figures/") for p in panels if p["viewType"] == "Media Browser"
                  for k in p["config"]["mediaKeys"]) == figures
    assert not (report_dir / "wandb_report.json").exists() and not (store_dir / "syn" / "wandb").exists()


def test_a_mixed_campaign_gets_a_panel_per_measure_with_a_line_per_member(tmp_path):
    path = tmp_path / "mix.yaml"
    path.write_text("name: mix\nbase:\n  model: {name: tiny-agent}\n  eval: {every: 2}\n  task:\n    mix:\n"
                    "      - {task: {name: chain}, groups: 2}\n      - {task: {name: frozen_lake}, groups: 1, "
                    "label: lake}\nconditions: {grpo: {}}\nseeds: [0]\n")
    campaign = load_campaign(path)
    view = wsp.build_workspace(campaign, "ent", "proj")
    lines = {p.title: list(p.y) for p in _panels(view)["Tasks (mix members)"]}
    assert lines == {"train correct rate per task": ["train/chain/correct_rate", "train/lake/correct_rate"],
                     "held-out pass@1 per task": ["eval/chain/pass@1", "eval/lake/pass@1"],
                     "env success per task (train / held-out)": ["env/lake/success", "eval/lake/success"]}
    assert set(_keys(view)) - {k for k in _keys(view) if ":" in k} <= logged_metrics(campaign.trials[0].trial)
    assert "Tasks (mix members)" not in _panels(_view(CAMPAIGNS[0])[1])
