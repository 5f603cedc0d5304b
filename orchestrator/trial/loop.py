"""One trial's step loop, as a Ray Tune function trainable. Owns no math.

Per step: prompts -> generate (k rollout workers) -> score -> drop uninformative groups -> learner.train_step
-> export adapter -> load it on every worker -> report (the step: orchestrator/trial/step/sequence.py; the actors:
orchestrator/trial/actors/start.py). The SEPA controller runs here: lambda for step t is read before the step, and the
step's correct rate / execution uncertainty are observed after it. Everything needed to continue sits in the
checkpoint: learner state (adapter, optimizer, scheduler, RNG), SEPA controller, task cursor, adapter version and
step.
"""

from __future__ import annotations

import json
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from ray import tune
from ray.util import get_current_placement_group

from orchestrator import storage as store
from orchestrator.actors.models import resolve_model
from orchestrator.config.trial import TrialConfig, sepa_settings
from orchestrator.storage import EVENTS_FILE, METRICS_FILE, PLACEMENT_FILE, STATE_FILE
from orchestrator.tracking.run import TrialTracker
from orchestrator.trial.actors.backend import Backend, open_backend
from orchestrator.trial.actors.calls import Calls, Deadlines, Hang
from orchestrator.trial.actors.context import TrialContext
from orchestrator.trial.actors.phases import Phases
from orchestrator.trial.actors.ports import EnginesPort, LearnerPort, LearnerRestarted
from orchestrator.trial.actors.start import shutdown_actors, trial_scratch_root
from orchestrator.trial.artifacts.batches import TrialBatches
from orchestrator.trial.artifacts.isolation import record_isolation
from orchestrator.trial.artifacts.restore import restore_checkpoint
from orchestrator.trial.artifacts.samples import TrialSamples
from orchestrator.trial.artifacts.uncertainty import write_uncertainty
from orchestrator.trial.collect.eval_sets import EvalSets
from orchestrator.trial.collect.rollouts import HeldOut
from orchestrator.trial.collect.sampling import action_ids
from orchestrator.trial.step.completion import load_inflight
from orchestrator.trial.step.prefetch import load_queue
from orchestrator.trial.step.sequence import TrainingStep
from orchestrator.trial.step.trial_source import trial_source
from workers.credit import SepaController
from workers.envs.tokens import turn_format
from workers.learner.state import BLOB as LEARNER_FILE
from workers.learner.state import SHARDS
from workers.models.loading import load_tokenizer, tokenizer_fingerprint
from workers.startup import imports_done
from workers.sync.scratch import trial_scratch
from workers.tasks import make_task


@dataclass
class Resume:
    """Where a trial starts: step 0, or the step after a verified checkpoint with what it saved."""

    start: int = 0
    version: int = 0  # the adapter version the workers must hold
    state: dict | None = None  # the checkpoint's trial state (task cursor, SEPA controller, ...)
    learner_files: dict[str, bytes] = field(default_factory=dict)  # the learner's blob and shards, by name
    rows: list[dict] = field(default_factory=list)  # metrics rows up to the checkpoint's step
    pending: object = None  # one_step_off / async: the batches sampled ahead of `start`
    inflight: object = None  # rollout.decode_per_step: the groups in flight (orchestrator/trial/step/completion.py)
    rewound: bool = False  # taken in process after the learner restarted (the engines hold a later policy)


def _resume(cfg: TrialConfig, out_dir: str) -> Resume:
    """The trial's newest usable checkpoint in its Tune directory, verified (weights-only learner state, manifest
    checksums). Not only the one Tune hands back: a driver killed between a checkpoint and Tune's next experiment
    snapshot, or a snapshot torn by the kill (the campaign then restarts Tune afresh), leaves newer checkpoints
    than Tune knows of. Damaged ones are skipped, said in events.jsonl; none usable while Tune recorded one, or a
    crafted one: one line naming the file."""
    storage = tune.get_context().get_storage()
    restored = restore_checkpoint(storage.storage_filesystem, storage.trial_fs_path,
                                  recorded=tune.get_checkpoint() is not None,
                                  events=store.join(out_dir, EVENTS_FILE), state_file=STATE_FILE,
                                  learner_file=LEARNER_FILE, metrics_file=METRICS_FILE)
    if restored is None:
        return Resume()
    pending = inflight = None
    files = {LEARNER_FILE: restored.learner}
    with restored.checkpoint.as_directory() as d:
        pending = load_queue(d)  # the batches sampled ahead (orchestrator/trial/step/prefetch.py), if any
        inflight = load_inflight(d)  # or the groups in flight (completion.py)
        shards = Path(d) / SHARDS
        files.update({f"{SHARDS}/{p.name}": p.read_bytes() for p in sorted(shards.glob("*")) if p.is_file()})
    state = restored.state
    return Resume(state["step"] + 1, state["adapter_version"], state, files, restored.rows, pending, inflight)


def _hang_handler(cfg: TrialConfig, out_dir: str, workers: list, learner: LearnerPort, trackers: list):
    """What a missed deadline does before the trial fails (orchestrator/trial/actors/calls.py raises after it): record
    the phase and the actors in events.jsonl and the W&B run, and kill this trial's actors (only them), whose
    GPUs would otherwise stay held by a frozen process; Tune then retries from the newest checkpoint."""

    def handle(hang: Hang) -> None:
        store.append_line(store.join(out_dir, EVENTS_FILE), hang.event())
        print(f"[{cfg.name}] {hang.message()}; killing the trial's actors, the trial fails and is retried",
              flush=True)
        shutdown_actors(workers, learner)
        for tracker in trackers:
            tracker.record_hang(hang.event())

    return handle


def _restore_actors(resume: Resume, learner: LearnerPort, engines: EnginesPort, task, sepa: SepaController,
                    source: str) -> None:
    """Put the checkpoint's learner state (saved by a group of any size), task cursor, SEPA controller and
    policy back. A rewind puts the checkpoint's policy on the engines even at version 0: they hold a later one."""
    if resume.state is not None:
        learner.restore(resume.learner_files, source)
        resume.learner_files = {}  # not held by the driver for the rest of the trial (tens of GB in full mode)
        task.load_state_dict(resume.state["task"])
        sepa.load_state_dict(resume.state["sepa"])
    if (resume.version or resume.rewound) and engines.count:
        engines.load_policy(learner.export_policy(resume.version))


def _rewind(cfg: TrialConfig, out_dir: str, restart: LearnerRestarted) -> Resume:
    """After `LearnerRestarted`: the trial's newest checkpoint, as a Tune retry would take it, and metrics.jsonl
    back to it (the steps after it run again, as they would after a retry)."""
    resume = _resume(cfg, out_dir)
    resume.rewound = True
    store.append_line(store.join(out_dir, EVENTS_FILE), restart.event(resume.start))
    store.write_text(store.join(out_dir, METRICS_FILE), "".join(json.dumps(r) + "\n" for r in resume.rows))
    print(f"[{cfg.name}] {restart.reason}; continuing from step {resume.start} in process (no retry charged)",
          flush=True)
    return resume


def _checkpoint(ctx: TrialContext, step: int, version: int, row: dict, rows: list[dict], sepa: SepaController,
                training: TrainingStep) -> None:
    """Report `row` with a sealed checkpoint of everything needed to continue after `step`."""
    cfg, task = ctx.cfg, ctx.task
    with tempfile.TemporaryDirectory() as d:
        ctx.learner.write_checkpoint(d)  # the blob, and every rank's shards
        (Path(d) / METRICS_FILE).write_text("".join(json.dumps(r) + "\n" for r in rows))
        training.save(d)  # one_step_off / async: the batches sampled ahead of step + 1
        (Path(d) / STATE_FILE).write_text(json.dumps({
            "step": step, "adapter_version": version, "task": task.state_dict(),
            "sepa": sepa.state_dict(), "config": cfg.model_dump(mode="json"),
        }))
        store.seal_checkpoint(d)  # sha256 manifest: a torn or damaged checkpoint is detected on restore
        tune.report(row, checkpoint=tune.Checkpoint.from_directory(d))


def run_trial(config: dict) -> None:
    """Tune function trainable: runs `config` (a TrialConfig as a dict) to its last step.

    Writes `metrics.jsonl` (whole, after every step: a restore rewinds it to the checkpoint, so the file never
    has gaps or repeats), `events.jsonl` and `placement.json` to `output_dir` (a path or URI). Its temporary
    files, and its actors', live in its scratch folder, removed when it ends or fails (workers/sync/scratch.py).
    """
    cfg = TrialConfig.model_validate(config)
    with trial_scratch(trial_scratch_root(cfg)):
        _run(cfg)


def _run(cfg: TrialConfig) -> None:
    out_dir = cfg.output_dir or tempfile.mkdtemp(prefix=f"trial-{cfg.name}-")
    metrics_loc = store.join(out_dir, METRICS_FILE)
    resume = _resume(cfg, out_dir)
    store.append_line(store.join(out_dir, EVENTS_FILE), {"event": "start", "from_step": resume.start,
                                                         "time": time.time()})
    store.write_text(metrics_loc, "".join(json.dumps(r) + "\n" for r in resume.rows))
    if resume.start >= cfg.steps:
        return  # restored from the final checkpoint: nothing left to run

    calls = Calls(Deadlines(cfg.timeouts))
    backend = open_backend(cfg, get_current_placement_group(), calls)  # own actors, or a slot of the shared pool
    try:
        for event in backend.events:  # a pool slot: which slot, its epoch, how long the acquire waited
            store.append_line(store.join(out_dir, EVENTS_FILE), event)
        _steps(cfg, out_dir, resume, calls, backend)
    finally:  # a pool slot: released (the campaign driver releases it too: orchestrator/tune/slot_owner.py)
        backend.close()


@dataclass
class TrialRun:
    """What a trial's steps share across in-process rewinds: fixed once the backend is open."""

    cfg: TrialConfig
    out_dir: str
    calls: Calls
    backend: Backend
    tokenizer: object
    tracker: TrialTracker | None = None  # the W&B run, made once (a rewind's replayed rows are skipped by it)


def _steps(cfg: TrialConfig, out_dir: str, resume: Resume, calls: Calls, backend: Backend) -> None:
    """The trial's steps from `resume`; a learner restarted under the trial (`LearnerRestarted`, raised by its
    port) is absorbed here: the newest checkpoint restored in process and the steps after it run again."""
    workers, learner = backend.workers, backend.learner
    trackers: list[TrialTracker] = []  # the W&B run, once it exists, hears of a hang too
    calls.on_hang = _hang_handler(cfg, out_dir, workers, learner, trackers)
    tokenizer = load_tokenizer(resolve_model(cfg.model))
    imports_done()  # the trainable has its imports (transformers came with the tokenizer): workers/startup.py
    fmt = turn_format(tokenizer)  # from the model's own files: which template and end-of-turn token this run uses
    store.append_line(store.join(out_dir, EVENTS_FILE), {"event": "model", "name": cfg.model.name, **fmt})
    print(f"[{cfg.name}] {cfg.model.name}: chat template {fmt['chat_template'] or 'none'}, eos {fmt['eos']}, "
          f"end of turn {fmt['end_of_turn']}, stop token ids {fmt['stop_token_ids']}", flush=True)
    learner.ready()
    run = TrialRun(cfg, out_dir, calls, backend, tokenizer)
    while True:
        try:
            _train(run, resume, trackers)
            return
        except LearnerRestarted as restart:
            resume = _rewind(cfg, out_dir, restart)


def _train(run: TrialRun, resume: Resume, trackers: list[TrialTracker]) -> None:
    """Restore `resume` onto the backend and run the steps after it (what a Tune attempt does once open)."""
    cfg, out_dir, calls, backend, tokenizer = run.cfg, run.out_dir, run.calls, run.backend, run.tokenizer
    version, rows = resume.version, resume.rows
    workers, learner, engines = backend.workers, backend.learner, backend.engines
    task = make_task(cfg.task, cfg.seed)
    sepa = SepaController(sepa_settings(cfg))
    eval_sets = None
    try:
        _restore_actors(resume, learner, engines, task, sepa, f"{out_dir} checkpoint of step {resume.start - 1}")
        store.write_text(store.join(out_dir, PLACEMENT_FILE), json.dumps(backend.placement()))
        if run.tracker is None:
            run.tracker = TrialTracker(cfg)
            trackers.append(run.tracker)
        tracker = run.tracker
        for row in rows:  # steps before the checkpoint that no earlier attempt got written (killed writer)
            tracker.log(row)

        ctx = TrialContext(cfg, workers, learner, tokenizer, task, action_ids(cfg, task, tokenizer), calls,
                           Phases.for_trial(cfg, engines, learner, out_dir), engines)
        source = trial_source(ctx)  # one task, episodes or a mix, refilled; `replay:` saved batches
        training = TrainingStep.for_trial(ctx, source, resume.pending, resume.inflight)  # every rollout.mode: one sequence
        samples = TrialSamples(cfg, out_dir, tokenizer)
        batches = TrialBatches(cfg, out_dir, tokenizer_fingerprint(tokenizer) if cfg.logging.batches else None)
        eval_sets = EvalSets(ctx)  # eval.sets: more held-out sets, logged as eval/<set>/... (trial/eval_sets.py)
        _loop(run, resume, _StepParts(ctx, sepa, source, training, samples, batches, eval_sets), version, rows)
    except LearnerRestarted:
        task.close()  # this attempt's task and sets end here; the rewind makes new ones from the checkpoint
        if eval_sets is not None:
            eval_sets.close()
        raise
    run.tracker.finish()
    task.close()
    eval_sets.close()
    store.append_line(store.join(out_dir, EVENTS_FILE), {"event": "end", "step": cfg.steps - 1, "time": time.time()})


@dataclass
class _StepParts:
    """One attempt's step machinery (made from its checkpoint by `_train`)."""

    ctx: TrialContext
    sepa: SepaController
    source: object
    training: TrainingStep
    samples: TrialSamples
    batches: TrialBatches
    eval_sets: EvalSets


def _loop(run: TrialRun, resume: Resume, parts: _StepParts, version: int, rows: list[dict]) -> None:
    cfg, out_dir, calls, tracker = run.cfg, run.out_dir, run.calls, run.tracker
    ctx, sepa, source, training = parts.ctx, parts.sepa, parts.source, parts.training
    engines, metrics_loc = ctx.engines, store.join(out_dir, METRICS_FILE)
    for step in range(resume.start, cfg.steps):
        held, calls.step, eval_version = HeldOut(), step, version
        engines.health()  # a frozen engine fails here, before a long phase waits on it
        if cfg.eval.every and (step % cfg.eval.every == 0 or step == cfg.steps - 1):
            held = source.evaluate(step)
            held.metrics.update(parts.eval_sets.evaluate(step))
        outcome = training.run(step, sepa, version)
        if step == 0:  # a pool slot: is what its engines computed for it independent of its batch neighbours?
            record_isolation(engines, outcome.rollouts, out_dir)
        outcome.row, outcome.eval_samples = {**outcome.row, **held.metrics}, held.samples
        row, version = outcome.row, outcome.version
        if outcome.uncertainty is not None:
            write_uncertainty(out_dir, step, outcome.uncertainty)
        parts.batches.record(step, outcome.rollouts)  # logging.batches: trials/<trial>/batches/ (trial/batches.py)
        tables = parts.samples.record(step, outcome, eval_version)  # trials/<trial>/samples/ (trial/samples.py)
        rows.append(row)
        store.write_text(metrics_loc, "".join(json.dumps(r) + "\n" for r in rows))
        tracker.log(row, tables)
        print(f"[{cfg.name}] step {step + 1}/{cfg.steps} correct {row['train/correct_rate']:.3f} "
              f"reward {row['train/reward_mean']:.3f} lambda {row['credit/sepa_lambda']:.3f} "
              f"gen {row['time/generate_s']:.1f}s train {row['time/train_s']:.1f}s", flush=True)
        if (step + 1) % cfg.checkpoint.every == 0 or step + 1 == cfg.steps:
            _checkpoint(ctx, step, version, row, rows, sepa, training)
        else:
            tune.report(row)
