"""`python -m orchestrator {expand,run,status,submit,trial}`. User mistakes: one line on stderr, exit code 2."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from orchestrator.errors import UserError, load_yaml, validate


def _trial(args: argparse.Namespace) -> int:
    from orchestrator.config import TrialConfig

    data = load_yaml(args.config) if args.config else {}
    if args.steps is not None:
        data["steps"] = args.steps
    cfg = validate(TrialConfig, data, args.config or "<default trial>")
    from workers.credit import CreditError, resolve_plugins

    try:
        resolve_plugins(cfg.credit)
    except CreditError as exc:
        raise UserError(f"{args.config or '<default trial>'}: credit: {exc}") from None
    from orchestrator.launch import run_single_trial

    result = run_single_trial(cfg, Path(args.storage).resolve())
    return 0 if result else 1


def _expand(args: argparse.Namespace) -> int:
    from orchestrator.campaign import load_campaign, trial_table

    campaign = load_campaign(args.file)
    print(f"campaign {campaign.config.name}: {len(campaign.trials)} trials -> {campaign.directory}")
    print(trial_table(campaign.trials))
    return 0


def _run(args: argparse.Namespace) -> int:
    from orchestrator.campaign import load_campaign
    from orchestrator.launch import run_campaign

    return 1 if run_campaign(load_campaign(args.file)) else 0


def _status(args: argparse.Namespace) -> int:
    from orchestrator.campaign import load_campaign
    from orchestrator.status import render

    print(render(load_campaign(args.file)))
    return 0


def _submit(args: argparse.Namespace) -> int:
    from orchestrator.campaign import load_campaign
    from orchestrator.jobs import submit

    submit(load_campaign(args.file), args.address)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m orchestrator")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, fn, help_ in (("expand", _expand, "print and validate a campaign's trial table"),
                            ("run", _run, "run or resume a campaign as one Ray Tune experiment"),
                            ("status", _status, "each trial's state, step and latest metrics"),
                            ("submit", _submit, "run a campaign as a Ray job (re-submit resumes)")):
        p = sub.add_parser(name, help=help_)
        p.add_argument("file", help="campaign YAML (see campaigns/)")
        p.set_defaults(fn=fn)
        if name == "submit":
            p.add_argument("--address", help="Ray dashboard address (default: $RAY_ADDRESS or 127.0.0.1:8265)")
    t = sub.add_parser("trial", help="run one trial (default: the tiny local default)")
    t.add_argument("config", nargs="?", help="trial config YAML (keys of orchestrator.config.TrialConfig)")
    t.add_argument("--steps", type=int, help="override the number of steps")
    t.add_argument("--storage", default=os.environ.get("ORCHESTRATOR_STORAGE", "results"),
                   help="where trial results and checkpoints go (default: ./results)")
    t.set_defaults(fn=_trial)
    args = parser.parse_args(argv)
    try:
        return args.fn(args)
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
