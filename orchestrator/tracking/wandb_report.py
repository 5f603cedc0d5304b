"""The statistical report as a W&B Report (wandb-workspaces), beside the campaign's runs: built from report.md,
its figures (from the report run) and the workspace's outcome panels; saved, or written as a dry run."""

from __future__ import annotations

import json
import re
from pathlib import Path

from orchestrator.campaign.schema import Campaign

# ------------------------------------------------------------------ the report as a W&B Report (wandb-workspaces)
REPORT_FILE = "wandb_report.json"  # what `dashboard` saves after a sync


DRY_RUN_FILE = "wandb_report.dry-run.json"  # never saved


def _runsets_in(report_dir: Path) -> dict:
    """What an earlier publish recorded next to the report: the report run's id and the saved Report's id."""
    f = report_dir / REPORT_FILE
    return json.loads(f.read_text()) if f.is_file() else {}


def build_wandb_report(campaign: Campaign, report_dir: Path, report_run: str, entity: str, project: str,
                       *, resolve: bool = True):
    """report.md (tables, claims) as markdown, its figures from the report run (`report_run`, a media panel
    per figure), and the campaign's outcome and sweep panels over its runs (grouped as in the workspace).
    `resolve=False` leaves the run sets' entity/project blank: the library looks their project up on W&B's
    servers when it serialises them, which a dry run must not do (the Report's own entity/project stay)."""
    import wandb_workspaces.reports.v2 as wr
    from wandb_workspaces import expr

    from orchestrator.tracking.workspace import build_workspace

    view = build_workspace(campaign, entity, project)
    markdown = (report_dir / "report.md").read_text()
    figures = re.findall(r"^!\[([^\]]*)\]\([^)]*\)$", markdown, flags=re.M)
    markdown = re.sub(r"^!\[[^\]]*\]\([^)]*\)$", "", markdown, flags=re.M)
    where = {"entity": entity, "project": project} if resolve else {}
    runs = wr.Runset(**where, name=f"{campaign.config.name} runs", filters=view.runset_settings.filters,
                     groupby=[f"config.{g.name}" for g in view.runset_settings.groupby])
    figure_runs = wr.Runset(**where, name="report run", filters=expr.And(expr.Metric("ID") == report_run))
    curves = [p for s in view.sections if s.name == "Outcome" or s.name.startswith("Sweep") for p in s.panels]
    blocks = [wr.MarkdownBlock(text=markdown.strip()),
              wr.H2(text="Figures"),
              wr.PanelGrid(runsets=[figure_runs], panels=[wr.MediaBrowser(title=f, media_keys=[f"figures/{f}"])
                                                          for f in figures]),
              wr.H2(text="The campaign's runs"),
              wr.PanelGrid(runsets=[runs], panels=curves)]
    return wr.Report(entity=entity, project=project, title=f"{campaign.config.name}: statistical report"[:128],
                     description=campaign.config.description or "", blocks=blocks)


def report_payload(report) -> dict:
    """The Report as the library serialises it (run sets unresolved when built with `resolve=False`)."""
    return json.loads(report._to_model().model_dump_json(by_alias=True, exclude_none=True))


def write_report_file(report_dir: Path, report_run: str, payload: dict, saved_id: str | None = None,
                      name: str = REPORT_FILE) -> Path:
    """The report run, the Report's payload and the id it was saved under (kept: a re-save updates it)."""
    f = report_dir / name
    saved_id = saved_id or _runsets_in(report_dir).get("saved_id")
    f.write_text(json.dumps({"report_run": report_run, "saved_id": saved_id, "report": payload}, indent=1) + "\n")
    return f


def save_wandb_report(campaign: Campaign, report_dir: Path, entity: str, project: str) -> str:
    """Save (or update: the id an earlier save recorded) the W&B Report of the report in `report_dir`, whose
    report run `publish` recorded there; returns its URL. Talks to W&B's servers (the library's own path)."""
    recorded = _runsets_in(report_dir)
    report = build_wandb_report(campaign, report_dir, recorded["report_run"], entity, project)
    if recorded.get("saved_id"):
        report.id = recorded["saved_id"]
    report.save()
    write_report_file(report_dir, recorded["report_run"], report_payload(report), report.id)
    return report.url


def describe_report(report) -> str:
    lines = [f"W&B Report '{report.title}' in {report.entity or '(your default entity)'}/{report.project}"]
    for b in report.blocks:
        extra = ""
        if hasattr(b, "panels"):
            extra = ": " + "; ".join(f"{type(p).__name__} {getattr(p, 'title', '') or ''}" for p in b.panels)
        elif hasattr(b, "text"):
            extra = f": {str(b.text).splitlines()[0][:80] if str(b.text) else ''}"
        lines.append(f"  {type(b).__name__}{extra}")
    return "\n".join(lines)
