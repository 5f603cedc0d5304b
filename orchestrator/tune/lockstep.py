"""Lockstep rounds: a Tune `TrialScheduler` that keeps every trial of a campaign within one round of the others.

A round is `round_steps` steps. A trial that finishes round r pauses there (round_steps is a multiple of
checkpoint.every, so it pauses right after a checkpoint and loses no work) unless every unfinished trial has
finished round r; `choose_trial_to_run` starts or resumes only trials that are behind, so no trial starts round
r+1 before every unfinished trial has finished round r, and with fewer slots than trials they take turns. The
moment the slowest unfinished trial finishes a round is the campaign's round boundary: there, and only there, a
budget (`gpu_hours`, `deadline`) may end the campaign, so every condition and seed stops at the same step.

GPU-hours (`GpuCharge`): a separate trial is charged the GPUs its placement group holds over its steps' times; a
shared campaign (`resources.shared_base`) its pools' GPUs over the wall since this driver started its trials,
however many trials run on them, the same function `plan` charges over its makespan
(orchestrator/config/pool_key.py:shared_gpu_hours). A paused trial's slot goes back to its pool as it pauses
(orchestrator/tune/slot_owner.py).

Every decision is a line of the campaign's `events.jsonl` (`<storage>/<campaign>/events.jsonl`, next to Tune's
files): `round_done` (a trial finished a round), `pause`, `round` (a boundary: the round every unfinished trial
has finished, GPU-hours spent so far) and `budget_stop`. `status` reads the round back from it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import UTC, datetime

from ray.tune.experiment import Trial
from ray.tune.schedulers import FIFOScheduler, TrialScheduler

from orchestrator import storage as store
from orchestrator.config.pool_key import shared_gpu_hours
from orchestrator.config.trial import TrialConfig
from orchestrator.storage import EVENTS_FILE, campaign_events
from orchestrator.tune.slot_cap import SlotCap


@dataclass(frozen=True)
class GpuCharge:
    """What the budget charges. gpus: separate trial name -> GPUs its placement group holds, charged over its
    steps' times; pools: one trial config per shared pool, charged the pools' GPUs over the wall."""

    gpus: dict[str, float]
    pools: tuple[TrialConfig, ...] = ()

    def step_hours(self, trial: str, seconds: float) -> float:
        return seconds * self.gpus.get(trial, 0.0) / 3600.0

    def wall_hours(self, seconds: float) -> float:
        return shared_gpu_hours(self.pools, seconds) if self.pools else 0.0


class LockstepScheduler(FIFOScheduler):
    """steps: trial name -> its number of steps; gpus: trial name -> GPUs its placement group holds, or the whole
    `GpuCharge` (a shared campaign's pools); budget: the campaign's BudgetConfig or None; directory: the campaign
    directory (events.jsonl); slots: trials running at once, in all (an int) or also per shared pool (a SlotCap:
    orchestrator/tune/slot_cap.py)."""

    def __init__(self, round_steps: int, steps: dict[str, int], gpus: dict[str, float] | GpuCharge, directory: str,
                 budget=None, slots: int | SlotCap | None = None, expected: list[str] | None = None):
        super().__init__()
        self.round_steps = round_steps
        self.cap = slots if isinstance(slots, SlotCap) else SlotCap(limit=slots)
        self.steps, self.directory, self.budget = steps, directory, budget
        self.charge = gpus if isinstance(gpus, GpuCharge) else GpuCharge(dict(gpus))
        # trial name -> rounds finished, for every trial that will run (adaptive seeds: `expect` adds a look's)
        self.rounds: dict[str, int] = dict.fromkeys(steps if expected is None else expected, 0)
        self.active: set[str] = set()  # running or about to start: what the slots count
        self.finished: set[str] = set()
        self.stopped = False  # the budget ended the campaign
        self.loaded = False  # the campaign's past rounds read back (Tune unpickles this object on a resume)
        self.spent = self.round_cost = self.round_wall = self.spent_at_boundary = 0.0
        self.boundary, self.boundary_time = 0, time.time()
        self.charged_at: float | None = None  # the shared pools' wall is charged up to here (None: not yet up)

    def __setstate__(self, state: dict) -> None:
        """A scheduler pickled by an earlier version (a campaign resumed across an upgrade) had an int `slots` and
        a `gpus` dict."""
        if "cap" not in state:
            state["cap"] = SlotCap(limit=state.pop("slots", None))
        if "charge" not in state:
            state["charge"] = GpuCharge(state.pop("gpus", {}))
        state.setdefault("charged_at", None)
        self.__dict__.update(state)

    def _load_past(self) -> None:
        """GPU-hours and rounds of earlier drivers of this campaign (a resumed campaign keeps its budget)."""
        self.loaded = True
        past = [e for e in campaign_events(self.directory) if e.get("event") == "round"]
        if past:
            last = past[-1]
            self.spent = self.spent_at_boundary = last["gpu_hours"]
            self.round_cost, self.round_wall = last.get("round_gpu_hours", 0.0), last.get("round_s", 0.0)
            self.boundary = last["round"]
        self.boundary_time = self.charged_at = time.time()  # the pools are up: Tune runs inside running_pools

    def _charge_wall(self, now: float) -> None:
        """The shared pools' GPUs over the wall since the last charge (nothing without a shared base)."""
        if self.charged_at is not None and now > self.charged_at:
            self.spent += self.charge.wall_hours(now - self.charged_at)
            self.charged_at = now

    @property
    def supports_buffered_results(self) -> bool:
        return False  # every step's result must reach on_trial_result before the trial goes on

    # ------------------------------------------------------------------------------------------ bookkeeping
    def _event(self, **fields) -> None:
        store.append_line(store.join(self.directory, EVENTS_FILE), {**fields, "time": time.time()})

    def _unfinished_min(self) -> int | None:
        live = [r for n, r in self.rounds.items() if n not in self.finished]
        return min(live) if live else None

    def expect(self, names: list[str]) -> None:
        """Trials that will run from now on (adaptive seeds: the next look's)."""
        for n in names:
            self.rounds.setdefault(n, 0)
        self.boundary = min(self.boundary, self._unfinished_min() or 0)  # the new seeds' rounds are boundaries too

    def on_trial_add(self, tune_controller, trial: Trial) -> None:
        if not self.loaded:
            self._load_past()
        name = trial.config["trial"]
        last = (trial.last_result or {}).get("step")  # a restored experiment: where the trial got to
        self.rounds[name] = 0 if last is None else (int(last) + 1) // self.round_steps
        if trial.status == Trial.TERMINATED:
            self.finished.add(name)
        else:
            self.active.add(name)  # Tune starts every pending trial it has resources for

    def _end(self, tune_controller, trial: Trial) -> None:
        before = self._unfinished_min()
        self.finished.add(trial.config["trial"])
        self.active.discard(trial.config["trial"])
        self._maybe_boundary(tune_controller, before)

    def on_trial_complete(self, tune_controller, trial: Trial, result: dict) -> None:
        self._end(tune_controller, trial)

    def on_trial_error(self, tune_controller, trial: Trial) -> None:
        self._end(tune_controller, trial)

    def on_trial_remove(self, tune_controller, trial: Trial) -> None:
        self._end(tune_controller, trial)

    # ------------------------------------------------------------------------------------------ decisions
    def on_trial_result(self, tune_controller, trial: Trial, result: dict) -> str:
        name = trial.config["trial"]
        if "time_this_iter_s" in result:
            self.spent += self.charge.step_hours(name, float(result["time_this_iter_s"]))
        self._charge_wall(time.time())
        step = result.get("step")
        if step is None or (int(step) + 1) % self.round_steps or int(step) + 1 >= self.steps[name]:
            return TrialScheduler.CONTINUE  # inside a round, or the trial's last step: it ends by itself
        if self.stopped:
            return TrialScheduler.STOP
        before = self._unfinished_min()
        self.rounds[name] = (int(step) + 1) // self.round_steps
        self._event(event="round_done", trial=name, round=self.rounds[name], step=int(step))
        if self._maybe_boundary(tune_controller, before):
            return TrialScheduler.STOP
        if self.rounds[name] > self._unfinished_min():
            self._event(event="pause", trial=name, round=self.rounds[name], step=int(step))
            self.active.discard(name)
            return TrialScheduler.PAUSE
        return TrialScheduler.CONTINUE

    def _maybe_boundary(self, tune_controller, before: int | None) -> bool:
        """When the slowest unfinished trial has just finished a round: record it and apply the budget.
        Returns True when the budget ends the campaign here (the remaining trials are stopped)."""
        now_min = self._unfinished_min()
        if now_min is None or before is None or now_min <= before or now_min <= self.boundary:
            return False
        now = time.time()
        self._charge_wall(now)
        self.round_cost, self.round_wall = self.spent - self.spent_at_boundary, now - self.boundary_time
        self.boundary, self.boundary_time, self.spent_at_boundary = now_min, now, self.spent
        self._event(event="round", round=now_min, step=now_min * self.round_steps - 1, gpu_hours=self.spent,
                    round_gpu_hours=self.round_cost, round_s=self.round_wall)
        why = self._over_budget(now)
        if why is None:
            return False
        self.stopped = True
        self._event(event="budget_stop", round=now_min, step=now_min * self.round_steps - 1, reason=why)
        print(f"budget: {why}; every trial stops after step {now_min * self.round_steps - 1}", flush=True)
        if tune_controller is not None:
            for t in tune_controller.get_trials():
                if t.status in (Trial.PENDING, Trial.PAUSED):
                    tune_controller.stop_trial(t)
        return True

    def _over_budget(self, now: float) -> str | None:
        b = self.budget
        if b is None:
            return None
        if b.gpu_hours is not None and self.spent + self.round_cost > b.gpu_hours:
            return (f"{self.spent:.3g} GPU-hours spent, another round would take about {self.round_cost:.3g} "
                    f"of the {b.gpu_hours:g}")
        if b.deadline is not None and now + self.round_wall > b.deadline.timestamp():
            end = datetime.fromtimestamp(now + self.round_wall, UTC).strftime("%Y-%m-%d %H:%M UTC")
            return f"another round would end about {end}, past the deadline {b.deadline:%Y-%m-%d %H:%M %Z}"
        return None

    def has_slot(self, name: str | None = None) -> bool:
        """Whether trial `name` (None: any) may run now beside the active ones (its pool's slots, the limit)."""
        return not self.stopped and self.cap.allows(name, self.active)

    def choose_trial_to_run(self, tune_controller) -> Trial | None:
        """A pending trial, else a paused one that is not ahead of the others (Tune starts pending trials by
        itself too: the campaign searcher creates them only while a slot is free)."""
        if self.stopped:
            return None
        trials = tune_controller.get_trials()
        pending = [t for t in trials if t.status == Trial.PENDING]
        if pending:
            return pending[0]
        low = self._unfinished_min()
        behind = [t for t in trials if t.status == Trial.PAUSED
                  and (low is None or self.rounds.get(t.config["trial"], 0) <= low)
                  and self.has_slot(t.config["trial"])]  # a trial of a full pool waits; another pool's may go
        if not behind:
            return None
        self.active.add(behind[0].config["trial"])
        return behind[0]

    def debug_string(self) -> str:
        return f"Lockstep: round {self.boundary} done by every unfinished trial; {self.spent:.3g} GPU-hours"
