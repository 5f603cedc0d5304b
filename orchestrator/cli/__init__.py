"""`python -m orchestrator {expand,plan,run,status,submit,report,samples,export,eval,dashboard,doctor,trial}`: the
arguments of every command, parsed here; their handlers in this folder, by what they act on (`campaign.py`,
`trial.py`, `results.py`, `doctor.py`). User mistakes: one line on stderr, exit code 2."""

from __future__ import annotations

import argparse
import os
import sys

from orchestrator.cli import campaign, doctor, results, trial
from orchestrator.config.errors import UserError


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


def _step_arg(text: str) -> int | None:
    from orchestrator.evaluate.offline import parse_step

    try:
        return parse_step(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix(f"--step {text}: ")) from None


def _eval(args: argparse.Namespace) -> int:
    def start_ray(min_cpus: float) -> None:  # imported only once the checkpoints and sets are checked
        from orchestrator.tune.launch import ensure_ray

        ensure_ray(min_cpus)

    return results.evaluate(args, start_ray)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m orchestrator")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, fn, help_ in (("expand", campaign.expand, "print and validate a campaign's trial table"),
                            ("run", campaign.run, "run or resume a campaign as one Ray Tune experiment"),
                            ("status", campaign.status, "each trial's state, step and latest metrics"),
                            ("submit", campaign.submit, "run a campaign as a Ray job (re-submit resumes)")):
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
    pl.add_argument("--calibration", help="a calibration file (benchmarks/calibrate.py): measured decode throughput, "
                    "learner rate, adapter export / load and start-up in place of the cost model's assumed ones")
    pl.add_argument("--slots", type=int, help="slots of the shared-base plan printed for a LoRA campaign "
                    "(default: its resources.shared_base.slots, else min(trials, 8))")
    pl.set_defaults(fn=campaign.plan)
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
    r.set_defaults(fn=results.report)
    sm = sub.add_parser("samples", help="what the models wrote: a trial's samples, or one problem's completions "
                        "across conditions and seeds at one step")
    sm.add_argument("file", help="campaign YAML")
    sm.add_argument("--trial", help="one trial's samples (default: every trial, one problem side by side)")
    sm.add_argument("--step", type=int, help="the step (default: the last one every chosen trial wrote)")
    sm.add_argument("--problem", help="a problem id: its completions across trials (held-out by default)")
    sm.add_argument("--eval", action="store_true", help="the held-out evaluations' generations (the default "
                    "without --trial: every condition sees the same held-out problems)")
    sm.set_defaults(fn=results.samples)
    ex = sub.add_parser("export", help="a trial's trained policy as a model directory (PEFT adapter, merged or "
                        "full model) from its verified checkpoint")
    ex.add_argument("source", help="campaign YAML (with --trial), or the directory a lone `orchestrator trial` wrote")
    ex.add_argument("--trial", help="the campaign's trial to export")
    ex.add_argument("--step", type=int, help="the checkpoint of this step (default: the newest)")
    ex.add_argument("--out", required=True, help="a new directory for the model")
    ex.add_argument("--merge", action="store_true", help="LoRA trials: merge the adapter into the base weights")
    ex.set_defaults(fn=trial.export)
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
    d.set_defaults(fn=campaign.dashboard)
    doc = sub.add_parser("doctor", help="check a cluster end to end before a campaign (exit 0: all checks pass)")
    doc.add_argument("--address", help="Ray cluster address (default: $RAY_ADDRESS, else a local Ray)")
    doc.add_argument("--storage", help="storage path or URI the campaign will use (written and read from a node)")
    doc.add_argument("--campaign", help="campaign YAML: its models resolve and their max_model_len fits")
    doc.add_argument("--wandb-mode", choices=("offline", "online", "disabled"),
                     help="the W&B mode to check (default: $WANDB_MODE, else the campaign's)")
    doc.set_defaults(fn=doctor.doctor)
    t = sub.add_parser("trial", help="run one trial (default: the tiny local default)")
    t.add_argument("config", nargs="?", help="trial config YAML (keys of orchestrator.config.trial.TrialConfig)")
    t.add_argument("--steps", type=int, help="override the number of steps")
    t.add_argument("--replay", metavar="RUN_DIR", help="train on the batches a run saved (logging.batches) instead "
                   "of sampling: a trial directory, or the directory a lone `orchestrator trial` wrote")
    t.add_argument("--storage", default=os.environ.get("ORCHESTRATOR_STORAGE", "results"),
                   help="where trial results and checkpoints go (default: ./results)")
    t.set_defaults(fn=trial.trial)
    args = parser.parse_args(argv)
    try:
        return args.fn(args)
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # output piped into `head`
        sys.stderr.close()
        return 0
