"""The pool's Ray actors: the shared learners (workers/learner/pool/shared.py:SharedLearner, each its slots' adapters
on one copy of the base: learner j of L trains the slots s with s mod L = j, orchestrator/config/pool_key.py:
slot_learner, and refuses the others) and the shared rollout engines (workers/rollout/shared.py:SharedRolloutWorker, one vLLM engine
serving every slot's adapter), each told where it runs (placement.json of every shared trial records them). Every
call of a slot names it by the holder's lease (workers/fence.py): a bare slot index is refused, and a lease older
than the one the slot was opened under is refused with one line naming the slot, both epochs and the trial."""

from __future__ import annotations

import dataclasses
import os
import threading

import ray

from orchestrator.actors.models import resolve_model
from orchestrator.actors.setup import engine_dtype, where_am_i
from orchestrator.config.pool_key import slot_learner
from orchestrator.config.trial import ModelConfig
from orchestrator.pool.probe import CallClock, ProbeAnswer
from workers.fence import SlotLease
from workers.learner.pool.shared import SharedLearner
from workers.models.cuda_faults import exit_on_poisoned_context
from workers.models.gpu_runtime import check_gpu_runtime
from workers.rollout.shared import SharedRolloutWorker
from workers.rollout.worker import RolloutWorkerSettings, process_health
from workers.sync.scratch import enter_scratch

CONTROL = "control"  # the concurrency group of an actor's control calls: never queued behind generate or train


class PoolEngineActor(SharedRolloutWorker):
    """One engine of the pool; threaded by `lifecycle.py` (max_concurrency = slots + 2: every slot's call reaches
    the engine thread at once and is batched with the others); its control calls (health, ready, placement, stats,
    probe) on threads of their own (`pool_engine_actor`)."""

    def __init__(self, model_cfg: dict, slots: int, settings: RolloutWorkerSettings, scratch: str | None = None):
        if scratch:
            enter_scratch(scratch, "pool-engine")
        check_gpu_runtime()
        super().__init__(resolve_model(ModelConfig(**model_cfg)), slots,
                         dataclasses.replace(settings, dtype=engine_dtype(settings.dtype)))

    @ray.method(concurrency_group=CONTROL)
    def placement(self) -> dict:
        return where_am_i()

    @ray.method(concurrency_group=CONTROL)
    def ready(self) -> bool:
        return super().ready()

    @ray.method(concurrency_group=CONTROL)
    def stats(self) -> dict:
        return super().stats()

    @ray.method(concurrency_group=CONTROL)
    def probe(self) -> ProbeAnswer:
        """The supervisor's probe: this process's health and whether the engine thread is making progress."""
        live = self.liveness()
        return ProbeAnswer.of(process_health(), progress=live["progress"], pending=live["pending"],
                              requests=live["requests"])

    @ray.method(concurrency_group=CONTROL)
    def health(self) -> dict:
        """`SharedRolloutWorker.health`; when the engine's own processes are stopped or gone (a killed engine
        core), this actor exits once it has answered, so that Ray restarts it with a new engine (lifecycle.py)
        instead of every trial's retry finding the same dead engine."""
        answer = super().health()
        if not answer["ok"]:
            _exit_soon()
        return answer

    def _check(self, slot: SlotLease) -> int:
        return super()._check(_leased(slot))

    def generate(self, slot: SlotLease, prompt_ids: list[list[int]], request):
        try:
            return super().generate(slot, prompt_ids, request)
        except Exception as e:
            if type(e).__name__ == "EngineDeadError":  # vLLM's engine core died under this call
                _exit_soon()
            raise


def _leased(slot) -> SlotLease:
    """A pool call's slot: a lease, never a bare index (which no fence could check)."""
    if not isinstance(slot, SlotLease):
        raise TypeError(f"a shared pool's call names its slot by the holder's SlotLease, got {slot!r}")
    return slot


def _exit_soon(after_s: float = 1.0) -> None:
    """Exit this process after `after_s` (the answer being sent first) as a crash, which Ray restarts."""
    threading.Timer(after_s, os._exit, args=(70,)).start()


class PoolLearnerActor(SharedLearner):
    """A learner of the pool (`place`: its index j and the pool's count L): its slots' adapters, optimizers and RNG
    on one copy of the base model; a call for a slot of another learner is refused in one line. Calls run one at a
    time (a slot's train step, checkpoint, restore), except `export_policy`, which runs on threads of its own (one
    per slot: `pool_learner_actor`) beside another slot's call, and the control calls (health, ready, placement,
    stats, the supervisor's probe), which answer on a thread of their own meanwhile; every slot call is timed
    (`clock`), so the probe tells how long the current one has run. A call that meets a CUDA error poisoning the
    process's context ends the process (workers/models/cuda_faults.py), which Ray restarts, every slot empty: each
    trial's client reopens its slot and continues from its newest checkpoint (the trial's
    trial/actors/shared.py:PoolLearnerClient)."""

    def __init__(self, model_cfg: dict, slots: int, scratch: str | None = None, place: tuple[int, int] = (0, 1)):
        if scratch:
            enter_scratch(scratch, f"pool-learner{place[0]}")
        check_gpu_runtime()
        self.place = tuple(place)
        self.clock = CallClock()  # how long each slot call has run: the supervisor's probe reads it
        super().__init__(resolve_model(ModelConfig(**model_cfg)), slots)

    @ray.method(concurrency_group="health")
    def placement(self) -> dict:
        return where_am_i()

    @ray.method(concurrency_group="health")
    def ready(self) -> bool:
        return True

    @ray.method(concurrency_group="health")
    def probe(self) -> ProbeAnswer:
        """The supervisor's probe: this process's health and its oldest running call's age."""
        call, age = self.clock.oldest()
        return ProbeAnswer.of(process_health(), call=call, call_s=age)

    def open(self, slot: SlotLease, **settings) -> None:
        with self.clock.running("open"), exit_on_poisoned_context("pool learner open"):
            super().open(slot, **settings)

    def train_step(self, slot: SlotLease, batch):
        with self.clock.running("train_step"), exit_on_poisoned_context("pool learner train_step"):
            return super().train_step(slot, batch)

    def checkpoint_files(self, slot: SlotLease) -> dict[str, bytes]:
        with self.clock.running("checkpoint_files"), exit_on_poisoned_context("pool learner checkpoint_files"):
            return super().checkpoint_files(slot)

    def restore(self, slot: SlotLease, files, source: str = "checkpoint") -> None:
        with self.clock.running("restore"), exit_on_poisoned_context("pool learner restore"):
            super().restore(slot, files, source)

    def _index(self, slot: SlotLease) -> int:
        index = super()._index(_leased(slot))
        j, n = self.place
        if slot_learner(index, n) != j:
            raise ValueError(f"slot {index} trains on learner {slot_learner(index, n)} of the pool's {n}, not on "
                             f"learner {j} (trial {slot.trial})")
        return index

    @ray.method(concurrency_group="export")
    def export_policy(self, slot: SlotLease, version: int):
        with self.clock.running("export_policy"), exit_on_poisoned_context("pool learner export_policy"):
            return super().export_policy(slot, version)

    @ray.method(concurrency_group="health")
    def health(self) -> dict:
        return process_health()

    @ray.method(concurrency_group="health")
    def stats(self) -> dict:
        return super().stats()


def pool_engine_actor():
    """`PoolEngineActor` as a Ray actor class with its control group (two threads: the supervisor's probe and a
    trial's health check at once)."""
    return ray.remote(concurrency_groups={CONTROL: 2})(PoolEngineActor)


def pool_learner_actor(slots: int):
    """`PoolLearnerActor` as a Ray actor class with an export thread per slot (a concurrency group's size is fixed when
    the class is made remote, not in `.options`)."""
    return ray.remote(concurrency_groups={"health": 1, "export": int(slots)})(PoolLearnerActor)
