"""`python -m orchestrator eval CAMPAIGN`: every trial's checkpoint of one step evaluated on held-out sets, as Ray
work, into `trials/<trial>/eval/<set>.csv` (orchestrator/storage.py: `eval_file`); `report` compares them.

What equals what. The checkpoint of step S holds the policy that the trial's in-training evaluation of step S + 1
measured (the evaluation of step s runs before step s's update). `eval` samples it as that evaluation did: the
same held-out problems, the seeds of (trial seed + EVAL_SEED_OFFSET, step S + 1, shard) for each of the trial's
`rollout.num_workers` shards (sources.py, sampling.py), the trial's sampling and engine settings. So with the
trial's own eval.n / k / temperature its numbers on the task's own set and on each of `eval.sets` equal the
in-training `eval/...` of step S + 1; the last checkpoint's numbers are new (no evaluation follows the last update).

Engines: per distinct (base model, engine settings, learner mode), one engine per GPU the trials' rollout workers
would take (on CPU one), never more than trials; each engine takes its trials one after another. A checkpoint,
verified first (restore.py: `verified_checkpoint`), becomes the engine's policy as `export` makes it
(workers/learner/export.py: a PEFT adapter loaded as a LoRA into the shared base, or the full model gathered from
the shards and loaded in place); the trial's shards are sampled one after another on that engine, each from an
empty prefix cache, as the trial's own engines did (a new policy's first requests never hit the cache).
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from pydantic import ValidationError

from orchestrator import storage as store
from orchestrator.config.errors import format_validation
from orchestrator.config.eval_sets import DEFAULT_SET, EvalSetConfig, agentic_mismatch
from orchestrator.config.sections import EvalConfig
from orchestrator.config.trial import TrialConfig
from orchestrator.trial.artifacts.restore import checkpoint_steps, verified_checkpoint
from orchestrator.trial.collect.sources import EVAL_SEED_OFFSET

FIXED_COLUMNS = ("checkpoint_step", "eval_step", "policy_version", "set", "n", "k", "temperature", "seed",
                 "problems", "pass@1", "pass@k")
_PLUGIN = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")


@dataclass(frozen=True)
class EvalRequest:
    """What the command line asked. `step` None: the newest step every trial has a checkpoint of; `sets`: the
    `--set` values (none: the task's own set and each trial's eval.sets); n / k / temperature: None keeps the
    trial's eval settings; `engines`: None, one per GPU (one on CPU)."""

    step: int | None = None
    sets: tuple[str, ...] = ()
    n: int | None = None
    k: int | None = None
    temperature: float | None = None
    engines: int | None = None


@dataclass
class TrialEval:
    """One trial's evaluation, planned and checked before any engine starts."""

    trial: str
    tune_dir: str  # the trial's Tune directory (its checkpoints)
    trial_dir: str  # trials/<trial> (its CSVs)
    step: int  # the checkpoint's step
    cfg: TrialConfig  # as the trial ran it (the checkpoint's copy)
    ev: EvalConfig  # its eval settings with the request's overrides
    sets: list[EvalSetConfig | None]  # None: the task's own held-out set


def set_name(s: EvalSetConfig | None) -> str:
    return DEFAULT_SET if s is None else s.name


def parse_step(text: str) -> int | None:
    """`--step`: a checkpoint's step (>= 0), or `last` (None)."""
    if text == "last":
        return None
    if not text.isdigit():
        raise ValueError(f"--step {text}: a checkpoint's step (0, 1, ...) or 'last'")
    return int(text)


def parse_set(text: str) -> tuple[str, EvalSetConfig | None]:
    """`--set NAME` (the task's own `default`, or one of the trials' eval.sets) or `--set NAME=SPEC` with SPEC a
    dataset file (its every row held out), a task plugin `module:Class`, or a `task:` table in YAML flow style
    (`{name: dataset, path: x.parquet, heldout_path: y.parquet}`). ValueError: one line naming the option."""
    import yaml

    name, eq, spec = text.partition("=")
    if not eq:
        return name, None
    spec = spec.strip()
    if spec.startswith("{"):
        try:
            task = yaml.safe_load(spec)
        except yaml.YAMLError as exc:
            raise ValueError(f"--set {name}: not a YAML table ({str(exc).splitlines()[0]})") from None
    elif _PLUGIN.match(spec):
        task = {"name": spec}
    else:
        path = str(Path(spec).expanduser().resolve()) if not store.is_uri(spec) else spec
        task = {"name": "dataset", "path": path, "heldout_path": path}
    try:
        return name, EvalSetConfig.model_validate({"name": name, "task": task})
    except ValidationError as err:
        raise ValueError(format_validation(f"--set {name}", err).replace(f"--set {name}: task.", f"--set {name}: ")
                         ) from None


def _trial_sets(cfg: TrialConfig, asked: list[tuple[str, EvalSetConfig | None]], trial: str):
    own = {s.name: s for s in cfg.eval.sets}
    if not asked:
        return [None, *cfg.eval.sets]
    out: list[EvalSetConfig | None] = []
    for name, spec in asked:
        if spec is not None:
            out.append(spec)
        elif name == DEFAULT_SET:
            out.append(None)
        elif name in own:
            out.append(own[name])
        else:
            raise ValueError(f"--set {name}: trial {trial} has no such set (its sets: "
                             f"{', '.join([DEFAULT_SET, *own])}); a new one is NAME=FILE, NAME=module:Class or "
                             "NAME='{task table}'")
    if len({set_name(s) for s in out}) != len(out):
        raise ValueError("--set: a set is named twice")
    return out


def _eval_settings(cfg: TrialConfig, request: EvalRequest) -> EvalConfig:
    asked = {k: v for k, v in (("n", request.n), ("k", request.k), ("temperature", request.temperature))
             if v is not None}
    try:
        return EvalConfig.model_validate({**cfg.eval.model_dump(exclude={"sets"}), **asked, "sets": []})
    except ValidationError as err:
        msg = format_validation("x", err).split(": ", 2)[-1]
        raise ValueError(f"--n/--k/--temperature for trial {cfg.name} (eval n {cfg.eval.n}, k {cfg.eval.k}): {msg}"
                         ) from None


def _check_set(cfg: TrialConfig, s: EvalSetConfig, checked: dict) -> None:
    """A set's task builds (its dataset files read, its plugin dry-run) and fits the trial's engines."""
    from orchestrator.config.task_check import check_task_plugin

    why = agentic_mismatch([s], cfg.task.agentic) or check_task_plugin(cfg.model_copy(update={"task": s.task}),
                                                                       checked)
    if why:
        raise ValueError(f"--set {s.name}: {why}")


def plan_eval(campaign, directory: str, request: EvalRequest) -> list[TrialEval]:
    """Every trial of `campaign` (its directory `directory`) that has a checkpoint, at the asked step, its
    checkpoint verified and its sets resolved. Raises LookupError (no such step), CheckpointError (damaged) or ValueError (a bad option), each
    one line, before anything starts."""
    asked = [parse_set(t) for t in request.sets]
    fs, _ = store.filesystem(directory)
    paths = {t.name: store.filesystem(store.join(directory, t.name))[1] for t in campaign.trials}
    steps = {n: checkpoint_steps(fs, p) for n, p in paths.items()}
    names = [n for n in paths if steps[n]]  # trials without any checkpoint yet (not started) are left out
    if not names:
        raise LookupError("no trial has a checkpoint yet")
    steps = {n: steps[n] for n in names}
    step = request.step
    if step is None:
        common = set.intersection(*(set(s) for s in steps.values())) if steps else set()
        if not common:
            raise LookupError("--step last: no step has a checkpoint in every trial; checkpoints: " + "; ".join(
                f"{n}: {', '.join(map(str, s)) or 'none'}" for n, s in steps.items()))
        step = max(common)
    plans, checked = [], {}
    for name in names:
        state, _, _ = verified_checkpoint(fs, paths[name], step)
        cfg = TrialConfig.model_validate(state["config"])
        if cfg.learner.mode == "full" and cfg.credit.uses_critic and cfg.learner.critic.model == "lora":
            raise ValueError(f"trial {name}: a full-mode policy sharing its weights with a LoRA critic cannot be "
                             "taken out of its checkpoint yet (as for export)")
        sets = _trial_sets(cfg, asked, name)
        for s in sets:
            if s is not None and s.task is not None:
                _check_set(cfg, s, checked)
        plans.append(TrialEval(name, store.join(directory, name), store.trial_dir(directory, name), step, cfg,
                               _eval_settings(cfg, request), sets))
    return plans


# ------------------------------------------------------------------------------------------------ the Ray work
def engine_key(cfg: TrialConfig) -> str:
    """Trials sharing an engine: the same base model and engine settings (the global seed aside: every request
    carries its own)."""
    from orchestrator.actors.setup import rollout_settings

    settings = dataclasses.replace(rollout_settings(cfg), seed=0, sleep_mode=False)
    return json.dumps({"model": cfg.model.model_dump(mode="json"), "settings": dataclasses.asdict(settings)},
                      sort_keys=True, default=str)


def engine_gpus(cfg: TrialConfig) -> float:
    """GPUs one of the trial's rollout engines takes (colocated: the GPU it shared with a learner rank)."""
    return 1.0 if cfg.resources.placement == "colocated" else cfg.resources.worker_gpus


def engine_count(cfg: TrialConfig, trials: int, asked: int | None, cluster_gpus: float) -> int:
    """One engine per GPU the cluster has for engines like the trial's (one without GPUs), at most one per trial."""
    if asked is not None:
        return max(1, min(asked, trials))
    g = engine_gpus(cfg)
    return max(1, min(trials, int(cluster_gpus // g) if g > 0 else 1))


def _start_engines(cfg: TrialConfig, count: int) -> list:
    from orchestrator.actors.setup import rollout_settings
    from orchestrator.evaluate.engine import EvalEngine

    settings = dataclasses.replace(rollout_settings(cfg), sleep_mode=False)
    return [EvalEngine.options(num_cpus=cfg.resources.worker_cpus, num_gpus=engine_gpus(cfg)).remote(
        cfg.model.model_dump(), settings) for _ in range(count)]


def evaluate_trial(engine, plan: TrialEval) -> list[dict]:
    """`plan`'s checkpoint on `engine`, every set of it: one CSV row per set."""
    from orchestrator.actors.models import resolve_model
    from orchestrator.trial.actors.calls import Calls, Deadlines
    from orchestrator.trial.actors.context import TrialContext
    from orchestrator.trial.artifacts.samples import SampleText, sample_rows
    from orchestrator.trial.collect.eval_sets import close_context, set_context
    from orchestrator.trial.collect.sampling import action_ids
    from orchestrator.trial.collect.sources import rollout_source
    from workers.credit import resolve_plugins
    from workers.models.loading import load_tokenizer
    from workers.tasks import make_task

    cfg = plan.cfg
    fs, path = store.filesystem(plan.tune_dir)
    state, files, where = verified_checkpoint(fs, path, plan.step)
    learner_files = {k: v for k, v in files.items() if k == "learner.pt" or k.startswith(store.SHARDS_DIR + "/")}
    calls = Calls(Deadlines(cfg.timeouts))
    version = int(state.get("adapter_version") or plan.step + 1)
    calls.get(engine.load_checkpoint.remote(learner_files, cfg.learner, version, where), "sync",
              [(f"eval engine ({plan.trial})", engine)])
    del files, learner_files
    tokenizer = load_tokenizer(resolve_model(cfg.model))
    task = make_task(cfg.task, cfg.seed)
    ctx = TrialContext(cfg, [engine] * cfg.rollout.num_workers, None, tokenizer, task,
                       action_ids(cfg, task, tokenizer), calls)
    rows = []
    text = SampleText(tokenizer, cfg.credit.strategic_grams, resolve_plugins(cfg.credit).get("planning_detector")
                      ) if cfg.logging.samples.eval else None
    writer = generations_writer(plan)
    try:
        for s in plan.sets:
            sctx = set_context(ctx, s, plan.ev)
            try:
                held = rollout_source(sctx).evaluate(plan.step + 1)  # the seeds of the evaluation of step + 1
            finally:
                close_context(sctx, ctx)
            metrics, generations = held.metrics, held.samples
            if text is not None and generations:  # rows as in the samples files, at the evaluation's step
                write_generations(writer, plan, set_name(s), sample_rows(text, generations, step=plan.step + 1,
                                                                         split="eval", version=version))
            rows.append({"checkpoint_step": plan.step, "eval_step": plan.step + 1, "policy_version": version,
                         "set": set_name(s), "n": plan.ev.n, "k": plan.ev.k, "temperature": plan.ev.temperature,
                         "seed": cfg.seed + EVAL_SEED_OFFSET,
                         **{k.removeprefix("eval/"): v for k, v in metrics.items() if k.startswith("eval/")},
                         "time_s": metrics.get("time/eval_s")})
    finally:
        task.close()
    return rows


def generations_writer(plan: TrialEval):
    """Where `eval` writes a trial's generations: its eval/ folder, under the samples' own cap (the trial's
    `logging.samples.max_mb`, on that folder; the first file kept out is said in its events.jsonl)."""
    from orchestrator.trial.artifacts.samples import SamplesWriter

    return SamplesWriter(plan.trial_dir, plan.cfg.logging.samples.max_mb, folder=store.EVAL_DIR)


def write_generations(writer, plan: TrialEval, eval_set: str, rows: list[dict]) -> str | None:
    """One set's generations at `plan`'s checkpoint (rows as in the samples files), or None (said) past the cap."""
    name = store.eval_samples_name(eval_set, plan.step)
    location = writer.write(plan.step + 1, "eval", rows, name=name)
    if location is None:
        print(f"{plan.trial}: {store.EVAL_DIR}/{name} not written: it would take the folder past the trial's "
              f"logging.samples.max_mb ({plan.cfg.logging.samples.max_mb:g} MB)", flush=True)
    return location


def run_eval(plans: list[TrialEval], engines: int | None = None) -> dict[str, list[dict]]:
    """Evaluate every plan on engines of its kind (Ray must be up); write each trial's CSVs. Returns the rows
    by trial."""
    import ray

    groups: dict[str, list[TrialEval]] = {}
    for p in plans:
        groups.setdefault(engine_key(p.cfg), []).append(p)
    gpus = float(ray.cluster_resources().get("GPU", 0.0))
    queues, actors = [], []
    for members in groups.values():
        count = engine_count(members[0].cfg, len(members), engines, gpus)
        started = _start_engines(members[0].cfg, count)
        actors += started
        queues += [(e, members[i::count]) for i, e in enumerate(started)]
    try:
        ray.get([a.ready.remote() for a in actors])
        with ThreadPoolExecutor(len(queues)) as pool:  # the engines work at once; each takes its trials in turn
            done = list(pool.map(lambda q: [(p, evaluate_trial(q[0], p)) for p in q[1]], queues))
    finally:
        for a in actors:
            ray.kill(a)
    out = {}
    for p, rows in (x for q in done for x in q):
        for row in rows:
            write_row(p.trial_dir, row)
        out[p.trial] = rows
    return out


# ------------------------------------------------------------------------------------------------ the CSVs
def write_row(trial_dir: str, row: dict) -> None:
    """`row` into the trial's CSV of its set, replacing a row of the same checkpoint step and settings."""
    location = store.eval_file(trial_dir, row["set"])
    old = read_rows(location)
    same = ("checkpoint_step", "n", "k", "temperature")
    kept = [r for r in old if [str(r.get(c)) for c in same] != [str(row[c]) for c in same]]
    rows = sorted([*kept, {k: ("" if v is None else v) for k, v in row.items()}],
                  key=lambda r: (int(r["checkpoint_step"]), int(r["n"]), int(r["k"]), float(r["temperature"])))
    columns = [*FIXED_COLUMNS, *sorted({c for r in rows for c in r} - set(FIXED_COLUMNS))]
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=columns, restval="", lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    store.write_text(location, buf.getvalue())


def read_rows(location: str) -> list[dict]:
    return store.read_csv(location)


def summary(rows: dict[str, list[dict]]) -> str:
    """One line per trial and set: what the command prints."""
    lines = []
    for trial, trial_rows in rows.items():
        for r in trial_rows:
            lines.append(f"{trial} checkpoint {r['checkpoint_step']} (= eval step {r['eval_step']}) {r['set']}: "
                         f"pass@1 {float(r['pass@1']):.3f} pass@{r['k']} {float(r['pass@k']):.3f} "
                         f"({r['problems']} problems x {r['n']})")
    return "\n".join(lines)
