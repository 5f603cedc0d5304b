"""Handlers of the commands that read a campaign's results: `report`, `samples` (what the models wrote:
orchestrator/report/sections/examples.py) and `eval` (held-out evaluation of checkpoints: orchestrator/evaluate/;
Ray is started by the caller's `start_ray(min_cpus)`, only once every checkpoint has been verified and every set
built). Arguments parsed in orchestrator/cli/__init__.py; a user mistake raises UserError (one line, exit 2)."""

from __future__ import annotations

import argparse
import tempfile
from collections.abc import Callable
from pathlib import Path

from orchestrator.config.errors import UserError


def report(args: argparse.Namespace) -> int:
    from orchestrator import storage as store
    from orchestrator.campaign.expand import load_campaign
    from orchestrator.report import ReportOptions, build_report

    if args.dry_run and not args.publish:
        raise UserError("report: --dry-run goes with --publish wandb")
    campaign = load_campaign(args.file)
    uri = store.is_uri(campaign.directory)
    try:
        has_run = store.read_text(store.join(campaign.directory, store.CAMPAIGN_FILE)) is not None
    except OSError as exc:  # an unreachable bucket, missing credentials, ...
        raise UserError(f"{args.file}: storage: cannot read {campaign.directory} ({exc})") from None
    if not has_run:
        raise UserError(f"{args.file}: campaign '{campaign.config.name}' has not run yet (no {campaign.directory}"
                        "/campaign.json); start it with: python -m orchestrator run " + args.file)
    # A URI campaign is read in place through pyarrow.fs; without --out its report is written to a local
    # scratch directory and uploaded to <campaign>/report/, next to the data as for a local campaign.
    scratch = tempfile.TemporaryDirectory(prefix="report-") if uri and not args.out else None
    out_dir = Path(args.out) if args.out else (Path(scratch.name) if scratch else None)
    settings = campaign.config.report
    windows = args.window or settings.auc_windows  # None: from the metric's logging cadence
    try:
        options = ReportOptions(
            metric=args.metric, step=args.step, windows=windows, baseline=args.baseline, out_dir=out_dir,
            effect=args.effect if args.effect is not None else settings.effect_of_interest,
            contrasts=settings.contrast_pairs(list(campaign.config.conditions), args.file),
            interpolate=args.interpolate or settings.auc_interpolate, primary=settings.primary,
            primary_sweep=settings.primary_sweep, adaptive=campaign.config.adaptive)
        report = build_report(campaign.directory if uri else Path(campaign.directory), options)
    except ValueError as exc:  # e.g. an unknown baseline
        raise UserError(f"{args.file}: {exc}") from None
    published = None
    if args.wandb or args.publish == "wandb":  # before the upload: it writes the Report's JSON next to the report
        from orchestrator.report.publish import publish

        published = publish(campaign, report, dry_run=args.dry_run, run_only=not args.publish)
    where = str(report.out_dir)
    if scratch is not None:
        where = store.join(campaign.directory, store.REPORT_DIR)
        for f in sorted(p for p in report.out_dir.rglob("*") if p.is_file()):
            store.write_bytes(store.join(where, *f.relative_to(report.out_dir).parts), f.read_bytes())
    print(report.headline)
    print(f"\nreport: {where}/report.md ({len(report.figures)} figures, "
          f"{len(report.tables)} CSV tables in {where})")
    if published:
        print(published)
    return 0


def samples(args: argparse.Namespace) -> int:
    """A trial's samples (`--trial`), or one problem's completions across trials at one step."""
    from orchestrator.campaign.expand import load_ran_campaign
    from orchestrator.report.sections import examples

    directory = load_ran_campaign(args.file).directory
    trials = examples.campaign_trials(directory)
    if args.trial is not None and args.trial not in {t.name for t in trials}:
        raise UserError(f"{args.file}: --trial {args.trial}: no such trial; trials: "
                        + ", ".join(t.name for t in trials))
    split = "eval" if args.eval or args.trial is None else "train"  # held-out: what every condition shares
    try:
        if args.trial is not None and args.problem is None:
            print(examples.show(directory, args.trial, args.step, split))
        else:
            chosen = [t for t in trials if args.trial in (None, t.name)]
            print(examples.compare(directory, chosen, args.step, args.problem, split))
    except examples.SamplesError as exc:
        raise UserError(f"{args.file}: {exc}") from None
    return 0


def evaluate(args: argparse.Namespace, start_ray: Callable[[float], None]) -> int:
    """Every trial's checkpoint of `--step` evaluated on the chosen sets; the summary printed."""
    from orchestrator import storage as store
    from orchestrator.campaign.expand import load_ran_campaign
    from orchestrator.evaluate.offline import EvalRequest, plan_eval, run_eval, summary
    from orchestrator.trial.artifacts.restore import CheckpointError

    if args.engines is not None and args.engines < 1:
        raise UserError(f"{args.file}: --engines {args.engines}: at least 1")
    campaign = load_ran_campaign(args.file)
    directory = campaign.directory
    request = EvalRequest(step=args.step, sets=tuple(args.set or ()), n=args.n, k=args.k,
                          temperature=args.temperature, engines=args.engines)
    try:
        plans = plan_eval(campaign, directory, request)  # every checkpoint verified, every set built, before Ray
    except (CheckpointError, LookupError, ValueError) as exc:
        raise UserError(f"{args.file}: {exc}") from None
    left_out = [t.name for t in campaign.trials if t.name not in {p.trial for p in plans}]
    if left_out:
        print(f"not evaluated (no checkpoint yet): {', '.join(left_out)}", flush=True)
    start_ray(max(p.cfg.resources.worker_cpus for p in plans))
    print(summary(run_eval(plans, args.engines)))
    print(f"\neval: checkpoint step {plans[0].step} of {len(plans)} trials -> "
          + store.eval_file(store.trial_dir(directory, "<trial>"), "<set>"))
    return 0
