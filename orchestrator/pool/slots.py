"""Which trial holds which slot of the pool. A trial acquires a slot by its name: a retried trial that still holds
one gets it back; otherwise the lowest free slot, or one whose holder's driver died without releasing it (a
SIGKILLed trial driver runs no cleanup). The trial opens whatever slot it gets fresh before use
(orchestrator/trial/actors/shared.py:connect), so a reused slot never carries its last holder's state."""

from __future__ import annotations

from collections.abc import Callable

import ray


class SlotTable:
    """`alive(driver_id)`: whether the driver that acquired a slot still runs."""

    def __init__(self, slots: int, alive: Callable[[str | None], bool]):
        self.holders: list[tuple[str, str | None] | None] = [None] * slots
        self.alive = alive

    def try_acquire(self, trial: str, driver: str | None = None) -> int | None:
        """The trial's slot, or None when every slot is held by a running trial."""
        for i, h in enumerate(self.holders):
            if h is not None and h[0] == trial:
                self.holders[i] = (trial, driver)
                return i
        free = [i for i, h in enumerate(self.holders) if h is None]
        if not free:
            free = [i for i, h in enumerate(self.holders) if not self.alive(h[1])]
        if not free:
            return None
        self.holders[free[0]] = (trial, driver)
        return free[0]

    def acquire(self, trial: str, driver: str | None = None) -> int:
        slot = self.try_acquire(trial, driver)
        if slot is None:
            held = ", ".join(h[0] for h in self.holders if h)
            raise RuntimeError(f"no free slot for trial {trial}: all {len(self.holders)} held by running trials "
                               f"({held}); Tune runs at most `slots` trials of a pool at once")
        return slot

    def release(self, trial: str) -> None:
        self.holders = [None if h is not None and h[0] == trial else h for h in self.holders]

    def held(self) -> dict[str, int]:
        return {h[0]: i for i, h in enumerate(self.holders) if h is not None}


def _driver_alive(actor_id: str | None) -> bool:
    if actor_id is None:
        return True
    from ray.util.state import get_actor

    try:
        state = get_actor(actor_id)
    except Exception:  # noqa: BLE001 - the state API unavailable: assume alive (never steal a running slot)
        return True
    return state is not None and state.state != "DEAD"


@ray.remote(num_cpus=0)
class SlotRegistry:
    """The pool's slot table as a small actor; `engines`: how many engine actors the pool runs."""

    def __init__(self, slots: int, engines: int):
        self.table, self.count = SlotTable(slots, _driver_alive), engines

    def acquire(self, trial: str, driver: str | None = None) -> int:
        return self.table.acquire(trial, driver)

    def try_acquire(self, trial: str, driver: str | None = None) -> int | None:
        return self.table.try_acquire(trial, driver)

    def release(self, trial: str) -> None:
        self.table.release(trial)

    def held(self) -> dict[str, int]:
        return self.table.held()

    def engines(self) -> int:
        return self.count
