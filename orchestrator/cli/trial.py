"""Handlers of the trial commands: `trial` (one trial, its checks before launch) and `export` (a trial's policy
out of its verified checkpoint: orchestrator/trial/export.py). Arguments parsed in orchestrator/cli/__init__.py;
a user mistake raises UserError (one line, exit 2)."""

from __future__ import annotations

import argparse
from pathlib import Path

from orchestrator.config.errors import UserError, validate
from orchestrator.config.files import load_yaml


def trial(args: argparse.Namespace) -> int:
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
    from orchestrator.config.pool_key import batch_invariant_refusal

    if refused := batch_invariant_refusal(cfg):  # resources.shared_base: a pool of the trial's own
        raise UserError(f"{args.config or '<default trial>'}: {refused[0]}: {refused[1]}")
    from orchestrator.preflight.checks import check_episodes, check_model_limits
    from orchestrator.tune.launch import run_single_trial

    check_model_limits(cfg.model, args.config or "<default trial>")
    from orchestrator.actors.models import resolve_model_quietly
    from orchestrator.preflight.learner_memory import check_learner_memory

    memory = check_learner_memory(cfg, resolve_model_quietly(cfg.model), args.config or "<default trial>", cfg.name)
    if memory is not None:
        print(memory, flush=True)
    check_episodes(args.config or "<default trial>", [(cfg.name, cfg)])
    result = run_single_trial(cfg, Path(args.storage).resolve())
    return 0 if result else 1


def export(args: argparse.Namespace) -> int:
    """Export `--trial` of a campaign YAML, or the lone trial whose directory `args.source` is, to `--out`."""
    from orchestrator import storage as store
    from orchestrator.campaign.expand import load_ran_campaign
    from orchestrator.trial.artifacts.restore import CheckpointError
    from orchestrator.trial.export import export_trial, lone_trial_tune_dir

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
