"""Which trial holds which slot of the pool, and under which epoch. A trial acquires a slot by its name (a retried
trial that still holds one gets it back; otherwise the lowest free slot) and gets a lease (workers/fence.py): the
slot and its epoch, a count of the slot's acquires, bumped on every one, so each attempt of each holder has an epoch
of its own and the pool's engine and learner refuse a late call from an earlier one. The trial opens whatever slot
it gets fresh before use (trial/actors/shared.py:connect), so a reused slot never carries its last
holder's state.

The registry runs in the pool's placement group (the learner's bundle) and Ray restarts it there like the pool's
other actors; its table (holders and epochs) is written to a file in the pool's scratch folder on every change and
read back by the restarted actor, so a restart neither frees a held slot nor hands out an epoch twice.

A slot comes back when it is released: by the campaign driver, which sees every trial end, pause and error in Tune
whatever happened to the trial's process (orchestrator/tune/slot_owner.py; a SIGKILLed trial driver runs no
cleanup), and by the trial itself when it ends (its lease: a late release of an earlier attempt frees nothing). No
liveness probe: Ray's state API, which could tell a dead holder, needs the dashboard that the project's local Rays
run without (orchestrator/tune/launch.py)."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

import ray

from workers.fence import SlotLease


@dataclass(frozen=True)
class Holder:
    trial: str
    epoch: int
    driver: str | None  # the holder's Ray actor id: for the records only


class SlotTable:
    def __init__(self, slots: int):
        self.holders: list[Holder | None] = [None] * slots
        self.epochs = [0] * slots

    def try_acquire(self, trial: str, driver: str | None = None) -> SlotLease | None:
        """The trial's lease on its slot (a new epoch), or None when every slot is held by another trial."""
        mine = [i for i, h in enumerate(self.holders) if h is not None and h.trial == trial]
        free = mine or [i for i, h in enumerate(self.holders) if h is None]
        if not free:
            return None
        slot = free[0]
        self.epochs[slot] += 1
        self.holders[slot] = Holder(trial, self.epochs[slot], driver)
        return SlotLease(slot, self.epochs[slot], trial)

    def acquire(self, trial: str, driver: str | None = None) -> SlotLease:
        lease = self.try_acquire(trial, driver)
        if lease is None:
            held = ", ".join(h.trial for h in self.holders if h)
            raise RuntimeError(f"no free slot for trial {trial}: all {len(self.holders)} held by running trials "
                               f"({held}); Tune runs at most `slots` trials of a pool at once")
        return lease

    def release(self, trial: str, epoch: int | None = None) -> int | None:
        """Free the slot `trial` holds (only under `epoch` when given: a trial's own release, which must not free
        a later attempt's slot); returns the slot freed, or None."""
        for i, h in enumerate(self.holders):
            if h is not None and h.trial == trial and (epoch is None or h.epoch == epoch):
                self.holders[i] = None
                return i
        return None

    def held(self) -> dict[str, int]:
        return {h.trial: i for i, h in enumerate(self.holders) if h is not None}

    def save(self, path: Path) -> None:
        """The table as JSON at `path`, replaced whole (a reader never sees half of it)."""
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"holders": [asdict(h) if h else None for h in self.holders],
                                   "epochs": self.epochs}))
        os.replace(tmp, path)

    @classmethod
    def load(cls, path: Path, slots: int) -> SlotTable:
        """The table saved at `path` (a restarted registry's), or an empty one of `slots` slots."""
        table = cls(slots)
        if path.is_file():
            data = json.loads(path.read_text())
            table.holders = [Holder(**h) if h else None for h in data["holders"]]
            table.epochs = list(data["epochs"])
        return table


@ray.remote(num_cpus=0)
class SlotRegistry:
    """The pool's slot table as a small actor; `engines`, `learners`: how many engine and learner actors the pool
    runs (a trial reads them to find its own: orchestrator/config/pool_key.py:slot_engines, slot_learner); `state`:
    the file its table lives in across the actor's restarts (module docstring)."""

    def __init__(self, slots: int, engines: int, state: str, learners: int = 1):
        self.path = Path(state)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.table, self.count, self.learner_count = SlotTable.load(self.path, slots), engines, learners

    def _saved(self, result):
        self.table.save(self.path)
        return result

    def acquire(self, trial: str, driver: str | None = None) -> SlotLease:
        return self._saved(self.table.acquire(trial, driver))

    def try_acquire(self, trial: str, driver: str | None = None) -> SlotLease | None:
        return self._saved(self.table.try_acquire(trial, driver))

    def release(self, trial: str, epoch: int | None = None) -> int | None:
        return self._saved(self.table.release(trial, epoch))

    def held(self) -> dict[str, int]:
        return self.table.held()

    def engines(self) -> int:
        return self.count

    def learners(self) -> int:
        return self.learner_count
