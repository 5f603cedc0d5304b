"""Fencing of a shared pool's slots (`resources.shared_base`): a call names its slot by a `SlotLease`, the slot and
the epoch the pool's slot registry gave the holder when it acquired the slot (orchestrator/pool/slots.py: bumped on
every acquire), so that a late call of a slot's previous holder (a paused or killed trial's driver whose call was
still on its way) cannot act on the slot's new holder. The pool's engine and learner learn a slot's epoch when the
holder opens it (`Fence.open`: the engine's `drop`, the learner's `open`) and refuse older ones (`Fence.check`).

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
    """A leased call on a slot this process holds nothing for (never opened here, closed, or emptied by a restart
    of the process: Ray restarts a pool actor with every slot empty): nothing done. The holder's client reopens the
    slot (the learner's: orchestrator/trial/actors/shared.py:PoolLearnerClient, and the trial goes on from its newest
    checkpoint)."""


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

    def _refuse_older(self, lease: SlotLease) -> None:
        now = self._opened[lease.slot]
        if now is not None and lease.epoch < now.epoch:
            raise StaleLease(f"slot {lease.slot}: call of trial {lease.trial} at epoch {lease.epoch} refused, the "
                             f"slot is at epoch {now.epoch} (trial {now.trial}): a late call of an earlier holder")
