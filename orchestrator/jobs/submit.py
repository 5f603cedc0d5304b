"""`python -m orchestrator submit FILE`: the campaign as a Ray job, through the Jobs API.

Same entrypoint as `ray job submit --working-dir . -- python -m orchestrator run FILE`. A campaign whose job is
still pending or running is not submitted again (its job id is printed instead); once that job has ended, a
new submission resumes the campaign from storage.
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

from orchestrator.campaign.schema import Campaign
from orchestrator.config.errors import UserError
from orchestrator.jobs.env import job_env, secrets_note
from orchestrator.preflight.checks import refuse_storage_inside


def plugin_env(campaign: Campaign, src: Path, cwd: Path) -> dict[str, str]:
    """PYTHONPATH naming the campaign's plugin directories relative to the uploaded working dir: every process of
    the job starts in that dir on its node, so the entries resolve there (and become absolute at start-up)."""
    from orchestrator.campaign.expand import plugin_paths

    rel = []
    for p in plugin_paths(campaign.config, src.parent):
        if not Path(p).is_relative_to(cwd):
            raise UserError(f"{campaign.source}: plugins.paths: {p} lies outside the working dir ({cwd}) that is "
                            "uploaded with the job")
        rel.append(str(Path(p).relative_to(cwd)) or ".")
    return {"PYTHONPATH": os.pathsep.join([*rel, "${PYTHONPATH}"])} if rel else {}  # Ray expands ${VAR}


def submit(campaign: Campaign, address: str | None) -> str:
    """Submit (or find) the campaign's job; returns its submission id."""
    from ray.job_submission import JobStatus, JobSubmissionClient

    cwd = Path.cwd().resolve()
    src = Path(campaign.source).resolve()
    if not src.is_relative_to(cwd):
        raise UserError(f"{campaign.source}: the campaign file must lie inside the working dir ({cwd}) that is "
                        "uploaded with the job")
    refuse_storage_inside(campaign, cwd)
    address = address or os.environ.get("RAY_ADDRESS") or "http://127.0.0.1:8265"
    if (Path.home() / ".ray" / "auth_token").exists():
        os.environ.setdefault("RAY_AUTH_MODE", "token")  # Ray >= 2.59 clusters started by ray.init() need it
    try:
        client = JobSubmissionClient(address)
    except Exception as exc:  # connection refused, auth: the user's cluster setup
        raise UserError(f"--address {address}: cannot reach a Ray job server ({str(exc).splitlines()[0]})") from None
    for job in client.list_jobs():
        meta = job.metadata or {}
        if meta.get("campaign_dir") == campaign.directory and job.status in (JobStatus.PENDING, JobStatus.RUNNING):
            print(f"campaign {campaign.config.name} is already running as job {job.submission_id}; "
                  f"follow it with: ray job logs -f {job.submission_id}")
            return job.submission_id
    sid = f"{campaign.config.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    # the job resolves `storage` again on the cluster: it needs the variables the local resolution used
    env = job_env(re.findall(r"\$\{(\w+)", campaign.config.storage))  # never a secret: see job_env.py
    env.update(plugin_env(campaign, src, cwd))
    note = secrets_note(env.get("WANDB_MODE", campaign.config.wandb.mode))
    if note:
        print(note)
    client.submit_job(
        entrypoint=f"python -m orchestrator run {src.relative_to(cwd)}",
        runtime_env={"working_dir": str(cwd), "env_vars": env},
        submission_id=sid,
        metadata={"campaign": campaign.config.name, "campaign_dir": campaign.directory},
    )
    print(f"submitted campaign {campaign.config.name} as job {sid}; follow it with: ray job logs -f {sid}")
    return sid
