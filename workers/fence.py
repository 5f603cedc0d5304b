"""Fencing of a shared pool's slots (`resources.shared_base`): a call names its slot by a `SlotLease`, the slot and
the epoch the pool's slot registry gave the holder when it acquired the slot (orchestrator/pool/slots.py: bumped on
every acquire), so that a late call of a slot's previous holder (a paused or killed trial's driver whose call was
still on its way) cannot act on the slot's new holder. The pool's engine and learner learn a slot's epoch when the
holder opens it (`Fence.open`: the engine's `drop`, the learner's `open`) and refuse older ones (`Fence.check`).

The engine serves a leased call only under the lease the slot was opened under (`Fence.require`): an older one is
stale, and a newer one, or any on a slot this process never opened (the engine restarted since: every slot empty),
is `SlotNotOpen`, which the holder's client answers by opening the slot again with its current adapter
(orchestrator/trial/actors/engine_recovery.py), so a restarted engine never samples a slot with another's adapter
or none.

A bare int slot is not fenced: the engine and learner used alone (tests, benchmarks); the pool's actors refuse one
(orchestrator/pool/actors.py)."""

from __future__ import annotations

import threading
from dataclasses import dataclass


@dataclass(frozen=True)
class SlotLease:
    """A holder's claim on one slot: `epoch` counts the slot's acquires; `trial` names the holder."""

    slot: int
    epoch: int
    trial: str


class StaleLease(RuntimeError):
    """A call from a slot's earlier holder (or an earlier attempt of its trial): refused, nothing done."""


class SlotNotOpen(RuntimeError):
    """A leased call on a slot this process holds nothing for under the caller's lease (never opened here, opened
    under another epoch, closed, or emptied by a restart of the process: Ray restarts a pool actor with every slot
    empty): nothing done. The holder's client reopens the slot: the engines' with its current adapter and the call
    redone (orchestrator/trial/actors/engine_recovery.py), the learner's and the trial goes on from its newest
    checkpoint (orchestrator/trial/actors/shared.py:PoolLearnerClient)."""


def slot_index(slot: int | SlotLease) -> int:
    return slot.slot if isinstance(slot, SlotLease) else slot


class Fence:
    """The newest lease each slot was opened under, as this process learned it (empty after a restart: the slot
    is empty too, and its holder's next call fails on that: orchestrator/pool/lifecycle.py)."""

    def __init__(self, slots: int):
        self._opened: list[SlotLease | None] = [None] * int(slots)
        self._lock = threading.Lock()

    def open(self, lease: int | SlotLease) -> None:
        """`lease` is the slot's holder from now on (refused when a newer one already opened it)."""
        if isinstance(lease, SlotLease):
            with self._lock:
                self._refuse_older(lease)
                self._opened[lease.slot] = lease

    def check(self, lease: int | SlotLease) -> None:
        if isinstance(lease, SlotLease):
            with self._lock:
                self._refuse_older(lease)

    def require(self, lease: int | SlotLease) -> None:
        """`check`, and the slot was opened under this very lease here (else `SlotNotOpen`)."""
        if isinstance(lease, SlotLease):
            with self._lock:
                self._refuse_older(lease)
                now = self._opened[lease.slot]
                if now is None or now.epoch != lease.epoch:
                    was = "never opened" if now is None else f"opened at epoch {now.epoch}"
                    raise SlotNotOpen(f"slot {lease.slot} is not open for trial {lease.trial} at epoch {lease.epoch} "
                                      f"in this process ({was}): its holder opens it again")

    def _refuse_older(self, lease: SlotLease) -> None:
        now = self._opened[lease.slot]
        if now is not None and lease.epoch < now.epoch:
            raise StaleLease(f"slot {lease.slot}: call of trial {lease.trial} at epoch {lease.epoch} refused, the "
                             f"slot is at epoch {now.epoch} (trial {now.trial}): a late call of an earlier holder")
