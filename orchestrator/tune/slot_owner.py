"""The campaign driver owns its shared pools' slots (`resources.shared_base`): Tune tells the driver of every trial
that ends, fails (retried or not) or pauses, whatever happened to the trial's own process, and the driver gives that
trial's slot back to its pool's registry there and then (orchestrator/pool/slots.py). A trial whose driver was
SIGKILLed runs no cleanup of its own; its slot comes back as soon as Tune sees the death, so the next trial does
not wait out its setup deadline for it. The trial still releases its slot itself when it ends (its lease: a release
that comes late frees nothing of a later holder's); a late call of the old holder is refused by the pool's fence
(workers/fence.py).

All through Tune's callbacks (`SlotOwner`): an end and a failure by their own hooks, a pause (the lockstep scheduler
taking turns, orchestrator/tune/lockstep.py; any scheduler's) by the trial's PAUSED status, seen at the controller's
next step boundary, before Tune starts another trial. Each release is a `slot_release` line of the campaign's
events.jsonl."""

from __future__ import annotations

import time
from collections.abc import Callable

from ray.tune import Callback

from orchestrator import storage as store
from orchestrator.config.pool_key import slots_name
from orchestrator.storage import EVENTS_FILE

RELEASE_TIMEOUT_S = 10.0  # the driver's loop waits this long at most on a registry (one gone: nothing to free)


def _named_registry(pool: str) -> Callable[[str], int | None]:
    """`release(trial)` on the pool's registry actor, by its name (the pool's actors live as long as the campaign
    driver: no handle needs to survive a pickle of this callback)."""
    import ray

    registry = ray.get_actor(slots_name(pool))
    return lambda trial: ray.get(registry.release.remote(trial), timeout=RELEASE_TIMEOUT_S)


class SlotOwner(Callback):
    """pools: shared trial name -> its pool id; directory: the campaign directory (events.jsonl); registry: pool id
    -> a `release(trial)` for that pool (None: the pool's named Ray actor). Module level and small: Tune pickles
    it with the experiment, so a restored campaign keeps it."""

    def __init__(self, pools: dict[str, str], directory: str,
                 registry: Callable[[str], Callable[[str], int | None]] | None = None):
        self.pools, self.directory, self.registry = dict(pools), directory, registry
        self.paused: set[str] = set()  # trials whose pause was released (a pause is a status, seen every step)

    def release(self, trial: str, why: str) -> int | None:
        """Free the slot `trial` holds in its pool, whatever its attempt; the slot freed, or None (it held none)."""
        pool = self.pools.get(trial)
        if pool is None:
            return None
        try:
            slot = (self.registry or _named_registry)(pool)(trial)
        except Exception as e:  # noqa: BLE001 - a pool stopping with the campaign; the trial's own release remains
            print(f"slot of trial {trial} not released on its {why}: pool {pool}: {type(e).__name__}: {e}",
                  flush=True)
            return None
        if slot is not None:
            store.append_line(store.join(self.directory, EVENTS_FILE), {
                "event": "slot_release", "trial": trial, "pool": pool, "slot": slot, "why": why, "time": time.time()})
        return slot

    def _pauses(self, trials) -> None:
        paused = {t.config["trial"] for t in trials if t.status == "PAUSED"}
        for name in sorted(paused - self.paused):
            self.release(name, "pause")
        self.paused = paused

    def on_step_begin(self, iteration, trials, **info):
        self._pauses(trials)

    def on_step_end(self, iteration, trials, **info):
        self._pauses(trials)

    def on_trial_complete(self, iteration, trials, trial, **info):
        self.release(trial.config["trial"], "end")

    def on_trial_recover(self, iteration, trials, trial, **info):
        self.release(trial.config["trial"], "error")  # retried: the retry acquires afresh, under a new epoch

    def on_trial_error(self, iteration, trials, trial, **info):
        self.release(trial.config["trial"], "error")
