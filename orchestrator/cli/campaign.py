"""Handlers of the campaign commands: `expand`, `run`, `plan`, `status`, `submit`, `dashboard` (arguments parsed
in orchestrator/cli/__init__.py; a user mistake raises UserError: one line, exit 2)."""

from __future__ import annotations

import argparse


def expand(args: argparse.Namespace) -> int:
    from orchestrator.campaign.expand import load_campaign, trial_table

    campaign = load_campaign(args.file)
    print(f"campaign {campaign.config.name}: {len(campaign.trials)} trials -> {campaign.directory}")
    print(trial_table(campaign.trials))
    return 0


def run(args: argparse.Namespace) -> int:
    from orchestrator.campaign.expand import load_campaign
    from orchestrator.tracking.mode import wandb_mode
    from orchestrator.tune.launch import run_campaign

    wandb_mode(args.wandb_mode)  # checked and exported; run_campaign applies it
    return 1 if run_campaign(load_campaign(args.file)) else 0


def plan(args: argparse.Namespace) -> int:
    from orchestrator.campaign.expand import load_campaign
    from orchestrator.preflight.cost_model import device_kind
    from orchestrator.preflight.memory_check import check_campaign_learners
    from orchestrator.preflight.plan import PlanRequest, make_plan, render
    from orchestrator.preflight.shared_plan import planned_slots, shared_section, with_shared_base

    campaign = load_campaign(args.file)
    request = PlanRequest(pilot=args.pilot, effect=args.effect, gpus=args.gpus, cpus=args.cpus,
                          device=args.device, measure=args.measure, metric=args.metric,
                          calibration=args.calibration)
    shares = campaign.trials[0].trial.resources.shared_base is not None
    separate = with_shared_base(campaign, None) if shares else campaign  # the table: each trial on its own GPUs
    plan = make_plan(separate, request)
    print(render(plan, shared=shares))  # a shared campaign's budget is judged against the shared side's GPU-hours
    if args.compare_placement:
        from orchestrator.preflight.plan import compare_lines, other_placement

        other = other_placement(separate)
        print("\n".join(compare_lines(plan, other and make_plan(other, request, cluster=plan.cluster))))
    slots = planned_slots(campaign, args.slots)
    print("\n".join(shared_section(separate, plan, slots, device_kind(args.device), chosen=shares)))
    if any(t.trial.learner.mode == "lora" for t in campaign.trials):
        print("\n".join(_shapes(campaign, separate, plan, args)))
    # per distinct trial shape: learner and engine memory per GPU against the named GPU (and the shared pool's);
    # refuses (exit 2) one that cannot fit. Planning reads model configs already on this machine only (a path or
    # the hub cache)
    lines = check_campaign_learners(campaign, local_only=True, shared_slots=slots)
    if not any(t.gpus for t in plan.trials):
        return 0
    print("\nmemory per GPU (pre-launch estimate, orchestrator/preflight/learner_memory.py):" if lines else
          "\nmemory per GPU: not checked (no model config on this machine: a local path or the hub cache)")
    for line in lines:
        print(line)
    return 0


def _shapes(campaign, separate, plan, args: argparse.Namespace) -> list[str]:
    """`plan`'s pool shapes for a LoRA campaign (orchestrator/preflight/shape_choice.py on pool_shape.py); a written shape the cluster
    given (--gpus/--cpus, RAY_ADDRESS) cannot hold is refused (exit 2)."""
    from orchestrator.config.errors import UserError
    from orchestrator.preflight.cost_model import device_kind
    from orchestrator.preflight.shape_choice import check_shape, shape_lines, shape_report, written_shape
    from orchestrator.preflight.shared_plan import with_shared_base

    try:
        with_shared_base(campaign, 1)
    except UserError:
        return []  # its trials cannot share: the shared section above says why
    own = campaign.trials[0].trial.resources.shared_base
    if own is not None:  # against the cluster when one is named (--gpus/--cpus, RAY_ADDRESS), else the shape alone
        check_shape(campaign, None if plan.cluster.source.startswith("this machine") else plan.cluster)
    cap = args.slots or (own.slots if own is not None else len(campaign.trials))
    kind = device_kind(args.device)
    report = shape_report(plan, kind, cap)
    written = written_shape(campaign.trials[0].trial)
    auto = own is not None and own.shape == "auto"
    chosen = written or (report.pick.shape if auto and report is not None and report.pick else None)
    return shape_lines(separate and plan, report, kind, chosen=chosen, written=written, auto=auto)


def status(args: argparse.Namespace) -> int:
    from orchestrator.campaign.expand import load_campaign
    from orchestrator.jobs.status import render

    print(render(load_campaign(args.file)))
    return 0


def submit(args: argparse.Namespace) -> int:
    from orchestrator.campaign.expand import load_campaign
    from orchestrator.jobs.submit import submit
    from orchestrator.tracking.mode import wandb_mode

    wandb_mode(args.wandb_mode)  # checked here, forwarded to the job as WANDB_MODE
    submit(load_campaign(args.file), args.address)
    return 0


def dashboard(args: argparse.Namespace) -> int:
    from orchestrator.campaign.expand import load_campaign
    from orchestrator.tracking.dashboard import dashboard

    print(dashboard(load_campaign(args.file), args.entity, args.project, dry_run=args.dry_run))
    return 0
