"""`python -m orchestrator dashboard`: the campaign's W&B workspace (orchestrator/tracking/workspace.py) saved, or
written as a dry run, and the W&B Report a `report --publish wandb` left for a later sync."""

from __future__ import annotations

import json
from pathlib import Path

import wandb_workspaces.workspaces as ws

from orchestrator import storage as store
from orchestrator.campaign.schema import Campaign
from orchestrator.config.errors import UserError
from orchestrator.tracking.login import wandb_login, where_to_save
from orchestrator.tracking.wandb_report import REPORT_FILE
from orchestrator.tracking.workspace import VIEW_FILE, build_workspace, describe, payload


def write_dry_run(campaign: Campaign, view: ws.Workspace) -> str:
    """The view's payload as JSON next to the campaign's report (`<campaign dir>/report/`); returns where."""
    where = store.join(campaign.directory, store.REPORT_DIR, VIEW_FILE)
    if not store.is_uri(where):
        Path(where).parent.mkdir(parents=True, exist_ok=True)
    store.write_text(where, json.dumps(payload(view), indent=1) + "\n")
    return where




def save_workspace(view: ws.Workspace) -> str:
    """Save through the library; the view of the same name is updated, never a second one. Returns its URL."""
    from wandb_workspaces.workspaces import internal

    try:
        view._internal_id = internal.View.from_name(view.entity, view.project, view._internal_name).id
    except ValueError:  # not saved yet: created under our name
        pass
    view.save()
    return view.url




def dashboard(campaign: Campaign, entity: str | None = None, project: str | None = None,
              dry_run: bool = False, with_report: bool = True) -> str:
    """`python -m orchestrator dashboard`: dry run -> the view's JSON next to the report and its sections and
    panels as text; else the view saved (and the W&B Report a `report --publish wandb` left for a later sync).
    Returns what to print."""
    if not dry_run:
        if campaign.config.wandb.mode == "disabled":
            raise UserError(f"{campaign.source}: wandb.mode: disabled, so the campaign logs no W&B runs for a view "
                            "to show (offline or online logs them; --dry-run writes the view anyway)")
        wandb_login(campaign)
    entity, project = where_to_save(campaign, entity, project, online=not dry_run)
    view = build_workspace(campaign, entity, project)
    text = describe(view)
    if dry_run:
        return f"{text}\ndry run: view JSON written to {write_dry_run(campaign, view)} (nothing sent to W&B)"
    lines = [text, f"W&B workspace: {save_workspace(view)}"]
    report_dir = Path(store.join(campaign.directory, store.REPORT_DIR))
    if with_report and not store.is_uri(campaign.directory) and (report_dir / REPORT_FILE).is_file():
        from orchestrator.tracking.wandb_report import save_wandb_report

        lines.append(f"W&B Report: {save_wandb_report(campaign, report_dir, entity, project)}")
    return "\n".join(lines)


def save_at_start(campaign: Campaign) -> None:
    """A `wandb: {mode: online}` campaign saves its view as it starts; W&B unreachable is one warning."""
    if campaign.config.wandb.mode != "online":
        return
    try:
        print(dashboard(campaign, with_report=False).splitlines()[-1], flush=True)
    except Exception as exc:  # the campaign runs on without its view
        print(f"warning: W&B workspace not saved ({type(exc).__name__}: {str(exc)[:200]}); save it later with "
              f"python -m orchestrator dashboard {campaign.source}", flush=True)
