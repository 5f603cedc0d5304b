"""`report --publish wandb`: the report's tables and figures as one W&B run in the campaign's group, and the
report itself as a W&B Report (wandb-workspaces) beside the campaign's runs."""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

from orchestrator import storage as store
from orchestrator.campaign.schema import Campaign
from orchestrator.report.build import Report
from orchestrator.tracking.wandb_report import (
    DRY_RUN_FILE,
    build_wandb_report,
    describe_report,
    report_payload,
    save_wandb_report,
    write_report_file,
)


def log_report(campaign: Campaign, report: Report) -> tuple[str, str]:
    """Log every table (wandb.Table) and figure (wandb.Image) plus report.md; returns (run id, run directory)."""
    import wandb

    w = campaign.config.wandb
    os.environ["WANDB_MODE"] = "offline" if w.mode == "disabled" else w.mode
    os.environ.setdefault("WANDB_SILENT", "true")
    root = Path(store.expand(w.dir or campaign.directory)).resolve()
    run_id = re.sub(r"[^A-Za-z0-9_-]", "-", f"{campaign.config.name}-report-{time.strftime('%Y%m%d-%H%M%S')}")
    run = wandb.init(id=run_id, project=w.project, entity=w.entity, group=campaign.config.name, job_type="report",
                     name=f"{campaign.config.name}-report", dir=str(root), tags=[*w.tags, "report"],
                     config={"campaign": campaign.config.name, "metric": report.metric, "step": report.step,
                             "baseline": report.baseline}, reinit="finish_previous")
    run.log({f"report/{name}": wandb.Table(dataframe=df.astype(str) if df.empty else df)
             for name, df in report.tables.items()})
    run.log({f"figures/{Path(p).stem}": wandb.Image(str(p)) for p in report.figures})
    run.save(str(report.out_dir / "report.md"), base_path=str(report.out_dir), policy="now")
    run_dir = run.dir
    run.finish()
    return run_id, run_dir
















def publish(campaign: Campaign, report: Report, *, dry_run: bool = False, run_only: bool = False) -> str:
    """`report --wandb` (run_only) / `report --publish wandb [--dry-run]`; returns what to print.

    The figures are logged once, to a report run in the campaign's mode (disabled counts as offline). Online,
    the W&B Report is saved and its URL returned; offline, it is written next to the report for a later
    `wandb sync` + `orchestrator dashboard`, which saves it."""
    from orchestrator.tracking.login import wandb_login, where_to_save

    online = campaign.config.wandb.mode == "online" and not dry_run
    if dry_run:
        entity, project = where_to_save(campaign, None, None, online=False)
        wreport = build_wandb_report(campaign, report.out_dir, "REPORT-RUN-ID", entity, project, resolve=False)
        where = write_report_file(report.out_dir, "REPORT-RUN-ID", report_payload(wreport), name=DRY_RUN_FILE)
        return f"{describe_report(wreport)}\ndry run: W&B Report JSON written to {where} (nothing sent to W&B)"
    run_id, run_dir = log_report(campaign, report)
    lines = [f"W&B report run: {run_dir}"]
    if run_only:
        return lines[0]
    if online:
        wandb_login(campaign)
        entity, project = where_to_save(campaign, None, None, online=True)
        write_report_file(report.out_dir, run_id, {})
        lines.append(f"W&B Report: {save_wandb_report(campaign, report.out_dir, entity, project)}")
    else:
        entity, project = where_to_save(campaign, None, None, online=False)
        wreport = build_wandb_report(campaign, report.out_dir, run_id, entity, project, resolve=False)
        where = write_report_file(report.out_dir, run_id, report_payload(wreport))
        lines += [describe_report(wreport),
                  f"W&B Report written to {where} for a later sync (campaign is {campaign.config.wandb.mode}): "
                  f"wandb sync {Path(run_dir).parent}; then python -m orchestrator dashboard {campaign.source} "
                  "saves the workspace and this Report"]
    return "\n".join(lines)
