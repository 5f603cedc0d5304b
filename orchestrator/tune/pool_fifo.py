"""FIFO for a shared-base campaign with a pool per base model (orchestrator/tune/slot_cap.py says why Tune's own
limiter cannot cap it)."""

from __future__ import annotations

from ray.tune.experiment import Trial
from ray.tune.schedulers import FIFOScheduler

from orchestrator.tune.slot_cap import SlotCap


class PoolFifo(FIFOScheduler):
    """Tune's FIFO, counting the trials that run or are about to (`active`, which the campaign searcher adds to when
    it creates a trial) so that the searcher creates a trial only while its pool has a free slot."""

    def __init__(self, cap: SlotCap):
        super().__init__()
        self.cap, self.active, self.stopped = cap, set(), False

    def has_slot(self, name: str | None = None) -> bool:
        return self.cap.allows(name, self.active)

    def expect(self, names: list[str]) -> None:
        """Adaptive seeds' next look (nothing to count before its trials are created)."""

    def on_trial_add(self, tune_controller, trial: Trial) -> None:
        if trial.status != Trial.TERMINATED:
            self.active.add(trial.config["trial"])  # also a failed trial requeued for its retry: it keeps its place

    def _end(self, trial: Trial) -> None:
        self.active.discard(trial.config["trial"])

    def on_trial_complete(self, tune_controller, trial: Trial, result: dict) -> None:
        self._end(trial)

    def on_trial_error(self, tune_controller, trial: Trial) -> None:
        self._end(trial)

    def on_trial_remove(self, tune_controller, trial: Trial) -> None:
        self._end(trial)

    def debug_string(self) -> str:
        return f"FIFO over shared pools: {len(self.active)} trial(s) running or starting"
