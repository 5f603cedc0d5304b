"""`python -m orchestrator {expand,run,status,submit,report,trial}`. User mistakes: one line on stderr, exit code 2."""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

from orchestrator.config_files import load_yaml
from orchestrator.errors import UserError, validate


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
    from orchestrator.launch import check_episodes, run_single_trial

    check_episodes(args.config or "<default trial>", [(cfg.name, cfg)])
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


def _window(text: str) -> tuple[int, int]:
    try:
        lo, hi = (int(x) for x in text.split("-"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"window must look like 0-10, got {text!r}") from None
    if not 0 <= lo < hi:
        raise argparse.ArgumentTypeError(f"window needs 0 <= lo < hi, got {text!r}")
    return lo, hi


def _report(args: argparse.Namespace) -> int:
    from orchestrator import storage as store
    from orchestrator.campaign import load_campaign
    from orchestrator.report import build_report

    campaign = load_campaign(args.file)
    uri = store.is_uri(campaign.directory)
    try:
        has_run = store.read_text(store.join(campaign.directory, "campaign.json")) is not None
    except OSError as exc:  # an unreachable bucket, missing credentials, ...
        raise UserError(f"{args.file}: storage: cannot read {campaign.directory} ({exc})") from None
    if not has_run:
        raise UserError(f"{args.file}: campaign '{campaign.config.name}' has not run yet (no {campaign.directory}"
                        "/campaign.json); start it with: python -m orchestrator run " + args.file)
    # A URI campaign is read in place through pyarrow.fs; without --out its report is written to a local
    # scratch directory and uploaded to <campaign>/report/, next to the data as for a local campaign.
    scratch = tempfile.TemporaryDirectory(prefix="report-") if uri and not args.out else None
    out_dir = Path(args.out) if args.out else (Path(scratch.name) if scratch else None)
    try:
        report = build_report(campaign.directory if uri else Path(campaign.directory), metric=args.metric,
                              step=args.step, windows=args.window or ((0, 10), (0, 15)), baseline=args.baseline,
                              out_dir=out_dir)
    except ValueError as exc:  # e.g. an unknown baseline
        raise UserError(f"{args.file}: {exc}") from None
    where = str(report.out_dir)
    if scratch is not None:
        where = store.join(campaign.directory, "report")
        for f in sorted(p for p in report.out_dir.rglob("*") if p.is_file()):
            store.write_bytes(store.join(where, *f.relative_to(report.out_dir).parts), f.read_bytes())
    print(report.headline)
    print(f"\nreport: {where}/report.md ({len(report.figures)} figures, "
          f"{len(report.tables)} CSV tables in {where})")
    if args.wandb:
        from orchestrator.report.publish import log_report

        print(f"W&B report run: {log_report(campaign, report)}")
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
    r = sub.add_parser("report", help="statistical report of a campaign (tables, CSVs, PNGs)")
    r.add_argument("file", help="campaign YAML")
    r.add_argument("--metric", help="metric to compare (default: eval/pass@1 if logged, else train/correct_rate)")
    r.add_argument("--step", type=int, help="step of the step-k table (default: latest step all trials reached)")
    r.add_argument("--window", type=_window, action="append",
                   help="AUC window lo-hi, repeatable (default: 0-10 and 0-15)")
    r.add_argument("--baseline", help="condition or group the others are compared with (default: the first)")
    r.add_argument("--out", help="output directory (default: <campaign dir>/report)")
    r.add_argument("--wandb", action="store_true", help="also log tables and figures as a W&B report run")
    r.set_defaults(fn=_report)
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
    except BrokenPipeError:  # output piped into `head`
        sys.stderr.close()
        return 0
