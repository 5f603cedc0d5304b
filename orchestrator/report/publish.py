"""`report --wandb`: the report's tables and figures as one W&B run in the campaign's group."""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

from orchestrator import storage as store
from orchestrator.campaign import Campaign
from orchestrator.report.build import Report


def log_report(campaign: Campaign, report: Report) -> str:
    """Log every table (wandb.Table) and figure (wandb.Image) plus report.md; returns the run's directory."""
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
    run.finish()
    return run.dir
