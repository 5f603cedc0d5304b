"""`python -m orchestrator export`: the command around export.py (which trial, from a campaign YAML or a lone
trial's directory). Its arguments are parsed in orchestrator/cli.py; a user mistake raises UserError (one line,
exit 2)."""

from __future__ import annotations

import argparse
from pathlib import Path

from orchestrator import storage as store
from orchestrator.campaign.expand import load_ran_campaign
from orchestrator.config.errors import UserError
from orchestrator.trial.artifacts.restore import CheckpointError
from orchestrator.trial.export import export_trial, lone_trial_tune_dir


def export_command(args: argparse.Namespace) -> int:
    """Export `--trial` of a campaign YAML, or the lone trial whose directory `args.source` is, to `--out`."""
    if Path(args.source).is_file():  # a campaign YAML
        campaign = load_ran_campaign(args.source)
        names = [t.name for t in campaign.trials]
        if args.trial not in names:
            raise UserError(f"{args.source}: --trial {args.trial}: " + ("needed with a campaign" if args.trial is None
                            else "no such trial") + "; trials: " + ", ".join(names))
        tune_dir, trial, name = store.join(campaign.directory, args.trial), args.trial, campaign.config.name
    else:
        if args.trial is not None:
            raise UserError(f"{args.source}: --trial goes with a campaign YAML, not a trial directory")
        try:
            tune_dir = lone_trial_tune_dir(args.source)
        except ValueError as exc:
            raise UserError(str(exc)) from None
        trial, name = tune_dir.rsplit("/", 1)[-1], None
    try:
        manifest = export_trial(tune_dir, trial, Path(args.out), step=args.step, merge=args.merge,
                                campaign=name)
    except (CheckpointError, LookupError, ValueError) as exc:
        raise UserError(f"{args.source}: {exc}") from None
    print(f"exported {trial} step {manifest['step']} ({manifest['kind']}) of {manifest['base_model']} to {args.out}")
    return 0
