"""How many trials of a shared-base campaign run at once: at most `slots` on each pool (a trial beyond them would
find no free slot: orchestrator/pool/slots.py), and at most the campaign's limit in all.

With one pool, Tune's own limiter does it (max_concurrent_trials = slots). With a pool per base model the limit is
per pool, which Tune's limiter cannot count: the campaign's searcher (orchestrator/tune/adaptive.py) creates a trial
only while its pool has a free slot (`has_slot(name)`), and the scheduler (pool_fifo.py, or the LockstepScheduler)
counts the trials that run or are about to; a pending trial of a pool with a free slot is never held back by a full
pool, and each full pool frees a slot when one of its running trials ends, so nothing waits on anything but a
running trial."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field


@dataclass(frozen=True)
class SlotCap:
    """limit: trials at once in all (None: no limit); slots: trials at once on one pool (None: no shared base);
    pool_of: trial name -> its pool id."""

    limit: int | None = None
    slots: int | None = None
    pool_of: dict[str, str] = field(default_factory=dict)

    def allows(self, name: str | None, active: Collection[str]) -> bool:
        """Whether trial `name` (None: any trial, the limit in all only) may run beside the `active` ones."""
        others = [n for n in active if n != name]
        if self.limit is not None and len(others) >= self.limit:
            return False
        if name is None or self.slots is None or name not in self.pool_of:
            return True
        pool = self.pool_of[name]
        return sum(self.pool_of.get(n) == pool for n in others) < self.slots
