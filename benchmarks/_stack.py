"""A trial's actors and loop body outside Tune, for the step-level benchmarks (step.py, async.py).

`Stack` builds exactly what `orchestrator.trial.loop.run_trial` builds (rollout worker actors, the learner actor,
tokenizer, task, SEPA controller, action ids: its `TrialContext`, and the rollout source) on a local Ray without a placement group, and runs the loop body
of either mode (`orchestrator.trial.step.sequence.TrainingStep`, overlapping or not) plus the metrics write run_trial does after every step.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = str(Path(__file__).resolve().parents[1])
sys.path.insert(0, ROOT)

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def init_ray(num_cpus: int = 6, tries: int = 3) -> None:
    """A private local Ray for a benchmark, or the Ray at `RAY_ADDRESS` when that is set (a running cluster;
    the test suite's own local Ray, so its smoke runs start none). Ray waits a fixed 30 s for its raylet to
    register (ray/_private/node.py) and a loaded machine can miss that ("The current node timed out during
    startup"): the start is tried again, after shutting down what the failed one left."""
    import ray

    env = {"VLLM_CPU_KVCACHE_SPACE": os.environ["VLLM_CPU_KVCACHE_SPACE"], "TOKENIZERS_PARALLELISM": "false",
           # the actors import this checkout's code, as the driver does (above): Ray gives them only the script's
           # folder and the working directory, and an installed copy of the package elsewhere (an editable install
           # of another checkout) would otherwise be theirs
           "PYTHONPATH": os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH", "")) if p)}
    if os.environ.get("RAY_ADDRESS"):
        ray.init(address=os.environ["RAY_ADDRESS"], log_to_driver=False, runtime_env={"env_vars": env})
        return
    for attempt in range(tries):
        try:
            ray.init(address="local", num_cpus=num_cpus, include_dashboard=False, log_to_driver=False,
                     runtime_env={"env_vars": env})
            return
        except Exception as exc:  # Ray raises a bare Exception for this
            if "timed out during startup" not in str(exc) or attempt + 1 == tries:
                raise
            ray.shutdown()
            print(f"ray start timed out (try {attempt + 1} of {tries}); starting it again", flush=True)


class Stack:
    """`cpus` per actor: Ray sets OMP_NUM_THREADS to it, so give what a bare in-process engine / model gets; None:
    the trial's own `resources.worker_cpus` and `learner_cpus`, as its trial would run them."""

    def __init__(self, cfg, cpus: float | None = 2):
        import ray

        from orchestrator import storage as store
        from orchestrator.actors.models import resolve_model
        from orchestrator.actors.setup import rollout_settings
        from orchestrator.config.trial import sepa_settings
        from orchestrator.trial.actors.context import TrialContext
        from orchestrator.trial.actors.learner_group import LearnerGroup
        from orchestrator.trial.actors.start import LearnerRankActor, TrialRolloutActor
        from orchestrator.trial.artifacts.samples import TrialSamples
        from orchestrator.trial.collect.sampling import action_ids
        from orchestrator.trial.step.sequence import TrainingStep
        from orchestrator.trial.step.trial_source import trial_source
        from workers.credit import SepaController
        from workers.learner.inputs import RunSettings
        from workers.models.loading import load_tokenizer
        from workers.tasks import make_task

        self.cfg = cfg
        model_cfg = cfg.model.model_dump()
        worker_cpus, learner_cpus = (cfg.resources.worker_cpus, cfg.resources.learner_cpus) if cpus is None else (
            cpus, cpus)
        self.workers = [
            TrialRolloutActor.options(num_cpus=worker_cpus).remote(model_cfg, rollout_settings(cfg))
            for _ in range(cfg.rollout.num_workers)
        ]
        self.learner = LearnerGroup([LearnerRankActor.options(num_cpus=learner_cpus).remote(
            model_cfg, learner=cfg.learner, credit=cfg.credit,
            run=RunSettings(seed=cfg.seed, total_steps=cfg.steps, dtype=cfg.model.dtype),
            interventions=cfg.interventions)],
            full=cfg.learner.mode == "full")
        self.model_path = resolve_model(cfg.model)
        self.tokenizer = load_tokenizer(self.model_path)
        self.task = make_task(cfg.task, cfg.seed)
        self.sepa = SepaController(sepa_settings(cfg))
        self.actions = action_ids(cfg, self.task, self.tokenizer)
        self.learner.ready()
        ray.get([w.ready.remote() for w in self.workers])
        self.version, self.step_idx, self.rows = 0, 0, []
        self.ctx = TrialContext(cfg, self.workers, self.learner, self.tokenizer, self.task, self.actions)
        self.source = trial_source(self.ctx)  # as run_trial: chosen once from the task
        self.steps = {mode: TrainingStep(self.ctx, self.source, overlap=mode == "one_step_off")
                      for mode in ("sync", "one_step_off")}
        self.metrics_file = Path(tempfile.mkdtemp(prefix="bench-step-")) / store.METRICS_FILE
        self.samples = TrialSamples(cfg, str(self.metrics_file.parent), self.tokenizer)  # written as a trial does

    def step(self, mode: str) -> tuple[float, dict]:
        """One loop iteration of `mode` as run_trial runs it (no eval, no Tune report); (wall s, row)."""
        from orchestrator import storage as store

        t0 = time.perf_counter()
        if mode == "sync":  # a sync step after async ones: drop the prefetched batch
            self.steps["one_step_off"].pending = None
        outcome = self.steps[mode].run(self.step_idx, self.sepa, self.version)
        row, self.version = outcome.row, outcome.version
        self.samples.record(self.step_idx, outcome, self.version)  # as run_trial
        self.rows.append(row)
        store.write_text(str(self.metrics_file), "".join(json.dumps(r) + "\n" for r in self.rows))
        self.step_idx += 1
        return time.perf_counter() - t0, row

    def close(self) -> None:
        from orchestrator.trial.actors.start import shutdown_actors

        shutdown_actors(self.workers, self.learner)
        self.task.close()
        shutil.rmtree(self.metrics_file.parent, ignore_errors=True)  # the rows were printed; nothing reads it after
