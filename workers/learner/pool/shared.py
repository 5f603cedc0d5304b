"""`SharedLearner`: the learner of a shared-base pool (issue 48). One process holds the base model's weights once
and, per slot, one trial's LoRA learner: its adapter(s), optimizer and moments, LR schedule, step counters, critic
(adapter + head + optimizer) and RNG state.

A slot is a `SlotLearner`: the separate learner (workers.learner.learner.Learner) itself, whose one override builds
it on a module tree that aliases the shared frozen tensors (workers/learner/pool/base.py), called with its own
random streams swapped in: a slot
trained on batches B is the separate learner trained alone on B, bit for bit (tests/unit/learner/test_shared.py).
One adapter per call: each call runs one trial's step on its own module tree, as the trials' steps arrive one at
a time from their drivers; a grouped matmul over several adapters would only pay when steps of different trials
were batched into one forward, which the pool's one-call-per-step interface does not do.

Plain Python, no Ray (orchestrator/pool/ wraps it in an actor). Calls are serialised by a lock (the device lock):
the random streams they swap are the process's. Two exceptions take only their slot's lock and run beside another
slot's call: an export (it reads only its slot's adapter and draws no random number: a trial's push does not wait
behind the other trials' steps) and a train step's CPU preparation, the padded batch and its planning mask
(`Learner.prepare`: a pure function of the batch and the slot's own tokenizer, no model, no random stream), done
before the step takes the device lock, so that one slot's tokenizing and padding overlap another slot's training.
Locks are taken in one order (the learner's, then the slot's).

Fencing (workers/fence.py): a slot named by a `SlotLease` (the pool's calls) is opened under it, and a call under an
older lease is refused inside the slot's lock, so it never runs on the slot's next holder's learner.
"""

from __future__ import annotations

import gc
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from workers.credit import CreditConfig
from workers.fence import Fence, SlotLease, SlotNotOpen, slot_index
from workers.learner.config import LearnerConfig
from workers.learner.inputs import LearnerBatch, RunSettings, StepResult
from workers.learner.learner import Learner
from workers.learner.pool.base import SharedBase, SlotRng, swapped_rng
from workers.objectives.interventions import InterventionsConfig
from workers.startup import imports_done
from workers.sync.policy import PolicyUpdate


class SlotLearner(Learner):
    """The separate learner, built on `base`'s shared frozen tensors (its one override)."""

    def __init__(self, base: SharedBase, **settings) -> None:
        self.shared_base = base
        super().__init__(base.model_path, **settings)

    def load_base(self, model_path: str, dtype: torch.dtype, gradient_checkpointing: bool):
        return self.shared_base.load(model_path, dtype, self.device, gradient_checkpointing)


@dataclass
class _LearnerSlot:
    learner: Learner
    rng: SlotRng


def shared_refusal(learner: LearnerConfig) -> str | None:
    """Why a trial's learner settings cannot be a slot (None: they can). A slot is one unsharded LoRA learner:
    full fine-tuning trains the base, and a sharded learner (FSDP, here cpu_offload on a GPU) shards it."""
    if learner.mode != "lora":
        return f"learner.mode is {learner.mode!r}; a shared base trains LoRA adapters only"
    if learner.cpu_offload and torch.cuda.is_available():
        return "learner.cpu_offload shards the model (FSDP); a shared base needs it off"
    return None


class SharedLearner:
    """The base at `model_path` held once and up to `slots` trials' learners on it, addressed by slot index."""

    def __init__(self, model_path: str, slots: int) -> None:
        if slots < 1:
            raise ValueError(f"a shared learner needs at least one slot, got {slots}")
        self.model_path = model_path
        self.base = SharedBase(model_path)
        self._slots: list[_LearnerSlot | None] = [None] * slots
        self._lock = threading.Lock()
        self._slot_locks = [threading.Lock() for _ in range(slots)]
        self.fence = Fence(slots)
        self._busy = {"train_s": 0.0, "export_s": 0.0, "checkpoint_s": 0.0}  # seconds inside each kind of call
        self._born, self._count_lock = time.perf_counter(), threading.Lock()

    # -- slot lifecycle -------------------------------------------------------------------------------
    def open(self, slot: int | SlotLease, *, learner: LearnerConfig, credit: CreditConfig,
             interventions: InterventionsConfig | None, run: RunSettings) -> None:
        """A fresh learner in `slot` (whatever it held is dropped first): adapter, optimizer, schedule and
        random streams a pure function of `run.seed`, as a separate learner's. Under a lease: the slot is
        opened under it (older leases refused from then on)."""
        lease, slot = slot, self._index(slot)
        if (why := shared_refusal(learner)) is not None:
            raise ValueError(why)
        with self._lock, self._slot_locks[slot]:
            self.fence.open(lease)
            self._drop(slot)
            with swapped_rng(None) as rng:  # the learner seeds the streams itself
                built = SlotLearner(self.base, learner=learner, credit=credit, interventions=interventions, run=run)
            self._slots[slot] = _LearnerSlot(built, rng.state)

    def close(self, slot: int | SlotLease) -> None:
        """Drop the slot's learner (its adapter, optimizer state, RNG); the shared base stays."""
        lease, slot = slot, self._index(slot)
        with self._lock, self._slot_locks[slot]:
            self.fence.check(lease)
            self._drop(slot)

    def is_open(self, slot: int | SlotLease) -> bool:
        return self._slots[self._index(slot)] is not None

    # -- the separate learner's calls, per slot ---------------------------------------------------------
    def train_step(self, slot: int | SlotLease, batch: LearnerBatch) -> StepResult:
        """The slot's learner's `train_step`: its `prepare` under the slot's lock only (module docstring), the
        rest under both locks with the slot's random streams swapped in."""
        with self._slot_only(slot) as learner:
            prepared = learner.prepare(batch)
        with self._entered(slot) as learner, self._timed("train_s"):
            return learner.train_prepared(prepared)

    def export_policy(self, slot: int | SlotLease, version: int) -> PolicyUpdate:
        """The slot's adapter as the engines load it; runs beside another slot's call (module docstring)."""
        with self._slot_only(slot) as learner, self._timed("export_s"):
            return learner.export_policy(version)

    def checkpoint_files(self, slot: int | SlotLease) -> dict[str, bytes]:
        """The files a separate learner writes (learner.pt): a trial may resume shared from a separate
        checkpoint and back."""
        with self._entered(slot) as learner, self._timed("checkpoint_s"):
            return learner.checkpoint_files()

    def restore(self, slot: int | SlotLease, files, source: str = "checkpoint") -> None:
        with self._entered(slot) as learner, self._timed("checkpoint_s"):
            learner.restore(files, source)

    def release_cache(self) -> None:
        """Hand the allocator's cached GPU blocks back (nothing to do on CPU)."""
        if torch.cuda.is_available():
            torch.cuda.empty_cache()

    # -- what tests and the pool's memory report read ---------------------------------------------------
    def learner(self, slot: int | SlotLease) -> Learner:
        """The slot's learner (read it only between calls: its random streams are not swapped in)."""
        held = self._slots[self._index(slot)]
        if held is None:
            raise SlotNotOpen(f"slot {slot} is not open")
        return held.learner

    def rng(self, slot: int | SlotLease) -> SlotRng:
        held = self._slots[self._index(slot)]
        if held is None:
            raise SlotNotOpen(f"slot {slot} is not open")
        return held.rng

    def stats(self) -> dict[str, float]:
        """Seconds spent training, exporting and saving or restoring checkpoints (every slot), and since made."""
        return {**self._busy, "up_s": time.perf_counter() - self._born}

    def memory(self) -> dict[str, int]:
        """Bytes: the shared base once, and per open slot its trainable weights and optimizer state."""
        out = {"base": self.base.nbytes()}
        for i, held in enumerate(self._slots):
            if held is not None:
                out[f"slot{i}"] = _slot_bytes(held.learner)
        return out

    # -- internals -------------------------------------------------------------------------------------
    def _index(self, slot: int | SlotLease) -> int:
        slot = slot_index(slot)
        if not 0 <= slot < len(self._slots):
            raise IndexError(f"slot {slot} out of range: this shared learner has {len(self._slots)} slots")
        return slot

    def _drop(self, slot: int) -> None:
        """Free the slot's learner. Every learner's build ends in `imports_done` (workers/startup.py), which
        freezes what is alive for the collector, this learner included: unfrozen, collected (any reference cycle
        of its module tree goes too) and what is left frozen again."""
        if self._slots[slot] is not None:
            self._slots[slot] = None
            gc.unfreeze()
            gc.collect()
            imports_done()

    @contextmanager
    def _timed(self, key: str):
        t0 = time.perf_counter()
        try:
            yield
        finally:
            with self._count_lock:  # exports of different slots end at once
                self._busy[key] += time.perf_counter() - t0

    @contextmanager
    def _slot_only(self, slot: int | SlotLease):
        """The slot's learner under the slot's lock only (beside another slot's call under the learner's lock):
        for what touches neither the process's random streams nor another slot. A stale lease is refused here."""
        lease, slot = slot, self._index(slot)
        with self._slot_locks[slot]:
            self.fence.check(lease)
            held = self._slots[slot]
            if held is None:
                raise SlotNotOpen(f"slot {slot} is not open")
            yield held.learner

    @contextmanager
    def _entered(self, slot: int | SlotLease):
        """The slot's learner with its random streams swapped in, one call at a time; the streams it leaves
        (also after a failed call) are the slot's from then on. A stale lease is refused here, under the locks."""
        lease, slot = slot, self._index(slot)
        with self._lock, self._slot_locks[slot]:
            self.fence.check(lease)
            held = self._slots[slot]
            if held is None:
                raise SlotNotOpen(f"slot {slot} is not open")
            try:
                with swapped_rng(held.rng) as rng:
                    yield held.learner
            finally:
                held.rng = rng.state


def _slot_bytes(learner: Learner) -> int:
    tensors = {id(p): p for p in learner.model.parameters() if p.requires_grad}
    critic = learner.critic
    optimizers = [learner.optimizer] + ([critic.optimizer] if critic is not None else [])
    if critic is not None:
        tensors.update({id(p): p for p in critic.params})
    for opt in optimizers:
        for state in opt.state.values():
            tensors.update({id(v): v for v in state.values() if torch.is_tensor(v)})
    return sum(t.numel() * t.element_size() for t in tensors.values())
