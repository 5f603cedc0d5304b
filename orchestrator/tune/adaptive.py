"""The campaign's Tune `Searcher`: hands Tune the campaign's trials in order, seed by seed, and for adaptive seeds
adds paired seed trials to every condition look by look until the contrast is settled.

Adaptive seeds (`seeds: {adaptive: {start, max, step, contrast: OTHER-BASE, measure}}`): the first look runs seeds
0 .. start-1 of every condition; when all of them have ended, the contrast's paired comparison on `measure`
(`stats.sequential.look_test`, pairs by seed, the measure computed as the report computes it) is tested at that
look's level from the O'Brien-Fleming-type alpha spending of orchestrator/stats/sequential.py, calibrated for the
t reference. Interval excluding zero: the campaign stops and claims; else
`step` more seeds (every condition) run, up to `max`. Each look is a `look` line in the campaign's events.jsonl.

Without adaptive seeds the searcher is used under lockstep rounds and for a shared campaign with a pool per base
model, to create trials no faster than the scheduler has slots, each pool's counted (Tune starts every pending trial
it has resources for).
"""

from __future__ import annotations

import json
import math
import pickle

from ray.tune.search import Searcher

from orchestrator import storage as store
from orchestrator.campaign.sections import CONTRAST, AdaptiveSeeds, default_metric, measure_value
from orchestrator.stats.sequential import look_decision, look_test, nominal_alphas
from orchestrator.storage import EVENTS_FILE


def look(directory: str, seeds: int, cfg: AdaptiveSeeds, level: float, *, interpolate: bool = False) -> dict:
    """The contrast at a look over seeds 0 .. seeds-1 (`sequential.look_test`), each run's measure computed as the
    report computes it (`campaign.sections.measure_value` on the trial's planned logging grid from campaign.json;
    a run missing an interior step is dropped unless `interpolate`)."""
    other, base = CONTRAST.match(cfg.contrast).groups()
    trials = {(t["condition"], int(t.get("seed", 0))): t
              for t in json.loads(store.read_text(store.join(directory, store.CAMPAIGN_FILE)))["trials"]}
    rows = {key: store.read_jsonl(store.join(store.trial_dir(directory, t["name"]), store.METRICS_FILE))
            for key, t in trials.items() if key[0] in (other, base) and key[1] < seeds}
    metric = cfg.metric or default_metric(list(rows.values()))

    def values(cond: str) -> list[float]:
        return [measure_value(rows[cond, s], cfg.measure, metric, trials[cond, s].get("config") or {},
                              interpolate=interpolate) if (cond, s) in rows else math.nan for s in range(seeds)]

    return {"seeds": seeds, **look_test(values(base), values(other), level)}


class CampaignSearcher(Searcher):
    """order: trial names in the order to run (condition -> seed); seed_of / condition_of: per name; adaptive:
    the campaign's AdaptiveSeeds or None; scheduler: the LockstepScheduler (slots, budget), PoolFifo (each pool's
    slots) or None."""

    def __init__(self, order: list[str], seed_of: dict[str, int], condition_of: dict[str, str], directory: str,
                 adaptive: AdaptiveSeeds | None = None, scheduler=None, interpolate: bool = False):
        super().__init__()
        self.interpolate = interpolate  # the campaign's report.auc_interpolate: the stop's AUC is the report's
        self.order, self.seed_of, self.condition_of = order, seed_of, condition_of
        self.directory, self.adaptive, self.scheduler = directory, adaptive, scheduler
        self.looks = adaptive.looks() if adaptive else []
        self.levels = list(nominal_alphas(self.looks, adaptive.alpha)) if adaptive else []
        self.look_index = 0
        self.issued: dict[str, str] = {}  # Tune trial id -> trial name
        self.ended: set[str] = set()
        self.done = False

    def set_search_properties(self, metric, mode, config, **spec) -> bool:
        return True  # the trials come from the campaign, not from a search space

    def _allowed(self) -> list[str]:
        if self.adaptive is None:
            return self.order
        return [n for n in self.order if self.seed_of[n] < self.looks[self.look_index]]

    def suggest(self, trial_id: str):
        if self.done or (self.scheduler is not None and self.scheduler.stopped):
            return Searcher.FINISHED
        issued = set(self.issued.values())
        todo = [n for n in self._allowed() if n not in issued]
        if todo:
            if self.scheduler is not None:  # the first whose pool has a free slot (orchestrator/tune/slot_cap.py)
                todo = [n for n in todo if self.scheduler.has_slot(n)]
                if not todo:
                    return None
                self.scheduler.active.add(todo[0])
            self.issued[trial_id] = todo[0]
            return {"trial": todo[0]}
        if len(self.ended) < len(issued):
            return None  # this look's trials are still running
        if self.adaptive is None or not self._next_look():
            self.done = True
            return Searcher.FINISHED
        return self.suggest(trial_id)

    def _next_look(self) -> bool:
        """Test the contrast at the current look; True when more seeds are to run."""
        seeds, level = self.looks[self.look_index], float(self.levels[self.look_index])
        result = look(self.directory, seeds, self.adaptive, level, interpolate=self.interpolate)
        decision = look_decision(result, self.look_index == len(self.looks) - 1)
        store.append_line(store.join(self.directory, EVENTS_FILE),
                          {"event": "look", "look": self.look_index + 1, "contrast": self.adaptive.contrast,
                           "measure": self.adaptive.measure, **result, "decision": decision})
        print(f"adaptive seeds: look {self.look_index + 1} at {seeds} seeds: {self.adaptive.contrast} "
              f"{self.adaptive.measure} delta {result['delta']:+.4g} [{result['lo']:.4g}, {result['hi']:.4g}] "
              f"p {result['p']:.3g} vs {level:.3g}: {decision}", flush=True)
        if decision != "add seeds":
            return False
        self.look_index += 1
        if self.scheduler is not None:
            self.scheduler.expect(self._allowed())
        return True

    def on_trial_complete(self, trial_id: str, result=None, error: bool = False) -> None:
        if trial_id in self.issued:
            self.ended.add(self.issued[trial_id])

    # Tune saves the searcher with the experiment and restores it with Tuner.restore
    def get_state(self) -> dict:
        return {"look_index": self.look_index, "issued": self.issued, "ended": self.ended, "done": self.done}

    def set_state(self, state: dict) -> None:
        self.look_index, self.issued = state["look_index"], state["issued"]
        self.ended, self.done = state["ended"], state["done"]

    def save(self, checkpoint_path: str) -> None:
        with open(checkpoint_path, "wb") as f:
            pickle.dump(self.get_state(), f)

    def restore(self, checkpoint_path: str) -> None:
        with open(checkpoint_path, "rb") as f:
            self.set_state(pickle.load(f))
