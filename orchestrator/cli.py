"""`python -m orchestrator trial [CONFIG.yaml] [--steps N]`: run one trial locally as a one-trial Tune experiment."""

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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m orchestrator")
    sub = parser.add_subparsers(dest="command", required=True)
    t = sub.add_parser("trial", help="run one trial (default: the tiny local default)")
    t.add_argument("config", nargs="?", help="trial config YAML (keys of orchestrator.config.TrialConfig)")
    t.add_argument("--steps", type=int, help="override the number of steps")
    t.add_argument("--storage", default=os.environ.get("ORCHESTRATOR_STORAGE", "results"),
                   help="where trial results and checkpoints go (default: ./results)")
    args = parser.parse_args(argv)
    try:
        return _trial(args)
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
