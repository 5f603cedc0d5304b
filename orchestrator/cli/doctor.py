"""Handler of `doctor`: a cluster checked end to end before a campaign (orchestrator/preflight/doctor.py)."""

from __future__ import annotations

import argparse
import os
from pathlib import Path


def doctor(args: argparse.Namespace) -> int:
    import ray

    from orchestrator import storage as store
    from orchestrator.preflight.doctor import campaign_check, reach_wandb, render, wandb_check
    from orchestrator.preflight.probes import cluster_checks
    from orchestrator.tracking.mode import wandb_mode
    from orchestrator.tune.launch import ensure_ray

    mode = wandb_mode(args.wandb_mode)
    if mode is None and args.campaign:
        from orchestrator.campaign.expand import load_campaign

        mode = load_campaign(args.campaign).config.wandb.mode
    storage = args.storage
    if storage and not store.is_uri(storage):
        storage = str(Path(storage).resolve())
    if args.address:
        ray.init(address=args.address)
    else:
        ensure_ray(2)  # $RAY_ADDRESS's cluster, else a local one
    checks = cluster_checks(storage)
    checks.append(wandb_check(mode, bool(os.environ.get("WANDB_API_KEY")), reach_wandb))
    checks.append(campaign_check(args.campaign))
    text, code = render(checks)
    print(text)
    return code
