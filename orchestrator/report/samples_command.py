"""`python -m orchestrator samples`: what the models wrote, read from a campaign's samples files (examples.py).
Its arguments are parsed in orchestrator/cli.py; a user mistake raises UserError (one line, exit 2)."""

from __future__ import annotations

import argparse

from orchestrator.campaign.expand import load_ran_campaign
from orchestrator.config.errors import UserError
from orchestrator.report.sections import examples


def samples_command(args: argparse.Namespace) -> int:
    """A trial's samples (`--trial`), or one problem's completions across trials at one step."""
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
