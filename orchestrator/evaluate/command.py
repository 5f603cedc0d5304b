"""`python -m orchestrator eval`: the command around offline.py. Its arguments are parsed in orchestrator/cli.py;
a user mistake raises UserError (one line, exit 2). Ray is started by the caller's `start_ray(min_cpus)`
(tune/launch.py's `ensure_ray`, which sits beside this folder, not below it), only once every checkpoint has been
verified and every set built."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from orchestrator import storage as store
from orchestrator.campaign.expand import load_ran_campaign
from orchestrator.config.errors import UserError
from orchestrator.evaluate.offline import EvalRequest, plan_eval, run_eval, summary
from orchestrator.trial.artifacts.restore import CheckpointError


def eval_command(args: argparse.Namespace, start_ray: Callable[[float], None]) -> int:
    """Every trial's checkpoint of `--step` evaluated on the chosen sets; the summary printed."""
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
