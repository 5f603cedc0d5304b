"""Which queued calls the pool engine's thread may start now (shared.py, module docstring: Order), as a pure
function of the queue and the slots with requests in flight, so the rule is read and tested in one place."""

from __future__ import annotations

from collections import deque
from typing import Any


def admissible(queue: deque, busy: set, running: bool) -> tuple[list[Any], deque, bool]:
    """(the calls to start now, the queue left, whether the engine thread should stop). `queue` holds calls (a
    `.run` callable or None for a generate, `.slot`, `.drain`) and None for close; `busy`: the slots with
    requests in flight; `running`: any request in flight.
    - Each slot's calls start in arrival order; a slot's run (load, drop) waits for its requests in flight, and
      its later calls wait behind it. Other slots are not held up.
    - A call of no slot (slot None) starts only at the queue's head: every call before it has started. A draining
      one (the isolation probe) also waits until nothing is in flight; close (None) too, and then stops."""
    busy = set(busy)
    taken, held, left = [], set(), deque()
    for i, c in enumerate(queue):
        if c is None or (c.run is not None and c.slot is None):
            if i == 0 and c is None and not running:
                return [], deque(), True
            if i == 0 and c is not None and not (c.drain and running):
                taken.append(c)
                i += 1
            left.extend(list(queue)[i:])
            break
        if c.slot in held or (c.run is not None and c.slot in busy):
            held.add(c.slot)
            left.append(c)
            continue
        taken.append(c)
        if c.run is None:  # a later load or drop of this slot waits for this generate's requests
            busy.add(c.slot)
    return taken, left, False
