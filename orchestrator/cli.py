"""`python -m orchestrator {expand,plan,run,status,submit,report,samples,export,eval,dashboard,doctor,trial}`. User
mistakes: one line on stderr, exit code 2."""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

from orchestrator.config.errors import UserError, validate
from orchestrator.config.files import load_yaml


def _trial(args: argparse.Namespace) -> int:
    from orchestrator.config.trial import TrialConfig

    data = load_yaml(args.config) if args.config else {}
    if args.steps is not None:
        data["steps"] = args.steps
    if args.replay is not None and isinstance(data, dict):
        data["replay"] = args.replay
    if args.config and isinstance(data, dict):  # plugin paths: relative to the trial file, which is one itself
        here = Path(args.config).resolve().parent
        plugins = data.get("plugins") if isinstance(data.get("plugins"), dict) else {}
        paths = plugins.get("paths", []) if isinstance(plugins.get("paths", []), list) else []
        data["plugins"] = {**plugins, "paths": [str((here / str(p)).resolve()) for p in [*paths, "."]]}
    cfg = validate(TrialConfig, data, args.config or "<default trial>")
    from orchestrator.config.task_check import check_task_plugin
    from workers.credit import CreditError, resolve_plugins

    checked: dict[str, str] = {}
    why = check_task_plugin(cfg, checked)
    if why:
        raise UserError(f"{args.config or '<default trial>'}: task: {why}")
    from orchestrator.config.task_check import check_eval_sets

    at, why = check_eval_sets(cfg, checked)
    if why:
        raise UserError(f"{args.config or '<default trial>'}: {at}: {why}")

    try:
        resolve_plugins(cfg.credit)
    except CreditError as exc:
        raise UserError(f"{args.config or '<default trial>'}: credit: {exc}") from None
    if cfg.replay is not None:  # a run's saved batches instead of sampling (orchestrator/trial/artifacts/replay.py)
        from orchestrator.trial.artifacts.replay import check_replay

        cfg = cfg.model_copy(update={"replay": check_replay(cfg, cfg.replay, args.config or "<default trial>")})
    from orchestrator.preflight.checks import check_episodes
    from orchestrator.preflight.model_limits import check_model_limits
    from orchestrator.tune.launch import run_single_trial

    check_model_limits(cfg.model, args.config or "<default trial>")
    from orchestrator.preflight.learner_memory import check_learner_memory
    from orchestrator.trial.actors.models import resolve_model_quietly

    memory = check_learner_memory(cfg, resolve_model_quietly(cfg.model), args.config or "<default trial>", cfg.name)
    if memory is not None:
        print(memory, flush=True)
    check_episodes(args.config or "<default trial>", [(cfg.name, cfg)])
    result = run_single_trial(cfg, Path(args.storage).resolve())
    return 0 if result else 1


def _expand(args: argparse.Namespace) -> int:
    from orchestrator.campaign.expand import load_campaign, trial_table

    campaign = load_campaign(args.file)
    print(f"campaign {campaign.config.name}: {len(campaign.trials)} trials -> {campaign.directory}")
    print(trial_table(campaign.trials))
    return 0


def _run(args: argparse.Namespace) -> int:
    from orchestrator.campaign.expand import load_campaign
    from orchestrator.tracking.mode import wandb_mode
    from orchestrator.tune.launch import run_campaign

    wandb_mode(args.wandb_mode)  # checked and exported; run_campaign applies it
    return 1 if run_campaign(load_campaign(args.file)) else 0


def _plan(args: argparse.Namespace) -> int:
    from orchestrator.campaign.expand import load_campaign
    from orchestrator.preflight.cost_model import device_kind
    from orchestrator.preflight.memory_check import check_campaign_learners
    from orchestrator.preflight.plan import PlanRequest, make_plan, render
    from orchestrator.preflight.shared_plan import planned_slots, shared_section, with_shared_base

    campaign = load_campaign(args.file)
    request = PlanRequest(pilot=args.pilot, effect=args.effect, gpus=args.gpus, cpus=args.cpus,
                          device=args.device, measure=args.measure, metric=args.metric)
    shares = campaign.trials[0].trial.resources.shared_base is not None
    separate = with_shared_base(campaign, None) if shares else campaign  # the table: each trial on its own GPUs
    plan = make_plan(separate, request)
    print(render(plan))
    if args.compare_placement:
        from orchestrator.preflight.plan import compare_lines, other_placement

        other = other_placement(separate)
        print("\n".join(compare_lines(plan, other and make_plan(other, request, cluster=plan.cluster))))
    slots = planned_slots(campaign, args.slots)
    print("\n".join(shared_section(separate, plan, slots, device_kind(args.device), chosen=shares)))
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


def _status(args: argparse.Namespace) -> int:
    from orchestrator.campaign.expand import load_campaign
    from orchestrator.jobs.status import render

    print(render(load_campaign(args.file)))
    return 0


def _submit(args: argparse.Namespace) -> int:
    from orchestrator.campaign.expand import load_campaign
    from orchestrator.jobs.submit import submit
    from orchestrator.tracking.mode import wandb_mode

    wandb_mode(args.wandb_mode)  # checked here, forwarded to the job as WANDB_MODE
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


def _effect(text: str) -> float:
    try:
        x = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"effect must be a number, got {text!r}") from None
    if not (x > 0 and x < float("inf")):
        raise argparse.ArgumentTypeError(f"effect must be a positive number in the metric's units, got {text!r}")
    return x


def _report(args: argparse.Namespace) -> int:
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


def _doctor(args: argparse.Namespace) -> int:
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


def _samples(args: argparse.Namespace) -> int:
    from orchestrator.report.samples_command import samples_command

    return samples_command(args)


def _export(args: argparse.Namespace) -> int:
    from orchestrator.trial.export_command import export_command

    return export_command(args)


def _step_arg(text: str) -> int | None:
    from orchestrator.evaluate.offline import parse_step

    try:
        return parse_step(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix(f"--step {text}: ")) from None


def _eval(args: argparse.Namespace) -> int:
    from orchestrator.evaluate.command import eval_command

    def start_ray(min_cpus: float) -> None:  # imported only once the checkpoints and sets are checked
        from orchestrator.tune.launch import ensure_ray

        ensure_ray(min_cpus)

    return eval_command(args, start_ray)


def _dashboard(args: argparse.Namespace) -> int:
    from orchestrator.campaign.expand import load_campaign
    from orchestrator.tracking.dashboard import dashboard

    print(dashboard(load_campaign(args.file), args.entity, args.project, dry_run=args.dry_run))
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
        if name in ("run", "submit"):
            p.add_argument("--wandb-mode", choices=("offline", "online", "disabled"),
                           help="override the campaign's wandb.mode (default: $WANDB_MODE, else the file's)")
    pl = sub.add_parser("plan", help="the compute plan of a campaign (launches nothing)")
    pl.add_argument("file", help="campaign YAML")
    pl.add_argument("--pilot", help="a pilot campaign (its directory or YAML): measured step times, paired sd")
    pl.add_argument("--effect", type=float, help="effect of interest in the metric's units: seeds for 80%% power")
    pl.add_argument("--gpus", type=float, help="cluster GPUs (default: the Ray cluster at RAY_ADDRESS, else here)")
    pl.add_argument("--cpus", type=float, help="cluster CPUs")
    pl.add_argument("--device", help="GPU kind for the cost model: H100 (default), H200, A100, L40S")
    pl.add_argument("--measure", help="auc_LO_HI or final (default: seeds.adaptive's, else auc_0_15 or final)")
    pl.add_argument("--metric", help="metric of the measure (default: the report's)")
    pl.add_argument("--compare-placement", action="store_true",
                    help="also plan every trial under the other resources.placement (colocated / separate)")
    pl.add_argument("--slots", type=int, help="slots of the shared-base plan printed for a LoRA campaign "
                    "(default: its resources.shared_base.slots, else min(trials, 8))")
    pl.set_defaults(fn=_plan)
    r = sub.add_parser("report", help="statistical report of a campaign (tables, CSVs, PNGs)")
    r.add_argument("file", help="campaign YAML")
    r.add_argument("--metric", help="metric to compare (default: eval/pass@1 if logged, else train/correct_rate)")
    r.add_argument("--step", type=int, help="step of the step-k table (default: latest step all trials reached)")
    r.add_argument("--window", type=_window, action="append",
                   help="AUC window lo-hi, repeatable (default: report.auc_windows, else from the eval cadence)")
    r.add_argument("--effect", type=_effect, help="effect of interest for the power table, in the metric's units "
                                                  "(default: report.effect_of_interest)")
    r.add_argument("--interpolate", action="store_true",
                   help="bridge a missing interior step in AUC windows (default: report.auc_interpolate)")
    r.add_argument("--baseline", help="condition or group the others are compared with (default: the first)")
    r.add_argument("--out", help="output directory (default: <campaign dir>/report)")
    r.add_argument("--wandb", action="store_true", help="also log tables and figures as a W&B report run")
    r.add_argument("--publish", choices=["wandb"], help="also publish the report as a W&B Report (its figures "
                   "logged once to a report run of the campaign's group; offline: written for a later sync)")
    r.add_argument("--dry-run", action="store_true", help="with --publish: write the Report's JSON, send nothing")
    r.set_defaults(fn=_report)
    sm = sub.add_parser("samples", help="what the models wrote: a trial's samples, or one problem's completions "
                        "across conditions and seeds at one step")
    sm.add_argument("file", help="campaign YAML")
    sm.add_argument("--trial", help="one trial's samples (default: every trial, one problem side by side)")
    sm.add_argument("--step", type=int, help="the step (default: the last one every chosen trial wrote)")
    sm.add_argument("--problem", help="a problem id: its completions across trials (held-out by default)")
    sm.add_argument("--eval", action="store_true", help="the held-out evaluations' generations (the default "
                    "without --trial: every condition sees the same held-out problems)")
    sm.set_defaults(fn=_samples)
    ex = sub.add_parser("export", help="a trial's trained policy as a model directory (PEFT adapter, merged or "
                        "full model) from its verified checkpoint")
    ex.add_argument("source", help="campaign YAML (with --trial), or the directory a lone `orchestrator trial` wrote")
    ex.add_argument("--trial", help="the campaign's trial to export")
    ex.add_argument("--step", type=int, help="the checkpoint of this step (default: the newest)")
    ex.add_argument("--out", required=True, help="a new directory for the model")
    ex.add_argument("--merge", action="store_true", help="LoRA trials: merge the adapter into the base weights")
    ex.set_defaults(fn=_export)
    ev = sub.add_parser("eval", help="evaluate every trial's checkpoint of one step on held-out sets (Ray work) "
                        "into trials/<trial>/eval/<set>.csv; `report` compares them")
    ev.add_argument("file", help="campaign YAML")
    ev.add_argument("--step", type=_step_arg, default=None, help="the checkpoint of this step, or 'last' (default: "
                    "the newest step every trial has a checkpoint of)")
    ev.add_argument("--set", action="append", metavar="NAME[=SPEC]", help="repeatable: 'default' (the task's own "
                    "held-out set), a name from the trials' eval.sets, or NAME=FILE (a dataset file, every row held "
                    "out), NAME=module:Class (a task plugin), NAME='{task table}' (default: default + eval.sets)")
    ev.add_argument("--n", type=int, help="samples per problem (default: the trial's eval.n)")
    ev.add_argument("--k", type=int, help="pass@k's k (default: the trial's eval.k)")
    ev.add_argument("--temperature", type=float, help="sampling temperature (default: the trial's eval.temperature)")
    ev.add_argument("--engines", type=int, help="engines per kind of base model (default: one per GPU, one on CPU)")
    ev.set_defaults(fn=_eval)
    d = sub.add_parser("dashboard", help="save the campaign's W&B workspace (view) or, with --dry-run, write it")
    d.add_argument("file", help="campaign YAML")
    d.add_argument("--dry-run", action="store_true", help="write the view's JSON next to the report; no network")
    d.add_argument("--entity", help="W&B entity (default: the campaign's wandb.entity, else your default)")
    d.add_argument("--project", help="W&B project (default: the campaign's wandb.project)")
    d.set_defaults(fn=_dashboard)
    doc = sub.add_parser("doctor", help="check a cluster end to end before a campaign (exit 0: all checks pass)")
    doc.add_argument("--address", help="Ray cluster address (default: $RAY_ADDRESS, else a local Ray)")
    doc.add_argument("--storage", help="storage path or URI the campaign will use (written and read from a node)")
    doc.add_argument("--campaign", help="campaign YAML: its models resolve and their max_model_len fits")
    doc.add_argument("--wandb-mode", choices=("offline", "online", "disabled"),
                     help="the W&B mode to check (default: $WANDB_MODE, else the campaign's)")
    doc.set_defaults(fn=_doctor)
    t = sub.add_parser("trial", help="run one trial (default: the tiny local default)")
    t.add_argument("config", nargs="?", help="trial config YAML (keys of orchestrator.config.trial.TrialConfig)")
    t.add_argument("--steps", type=int, help="override the number of steps")
    t.add_argument("--replay", metavar="RUN_DIR", help="train on the batches a run saved (logging.batches) instead "
                   "of sampling: a trial directory, or the directory a lone `orchestrator trial` wrote")
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
