"""A trial's actors: the model they load (hub name, local path, or a tiny model built here), the rollout worker
and learner actor classes, and the placement-group bundles that pack them ([driver, worker x k, learner])."""

from __future__ import annotations

import dataclasses
import os

import ray
import torch
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from orchestrator.config.placement import colocated, learner_slots, worker_slots
from orchestrator.config.trial import ModelConfig, TrialConfig
from orchestrator.trial.actors.calls import Calls
from orchestrator.trial.actors.learner_group import LearnerGroup
from orchestrator.trial.actors.models import resolve_model
from orchestrator.trial.actors.ports import LearnerPort
from workers.learner.inputs import RunSettings
from workers.learner.learner import Learner
from workers.learner.ranks import Ranks, rendezvous_address
from workers.models.gpu_runtime import check_gpu_runtime
from workers.rollout.worker import RolloutWorker, RolloutWorkerSettings, process_health
from workers.sync.scratch import enter_scratch, scratch_root


def where_am_i() -> dict:
    ctx = ray.get_runtime_context()
    return {"placement_group": ctx.get_placement_group_id(), "gpu_ids": [str(g) for g in ray.get_gpu_ids()],
            "pid": os.getpid(), "actor_id": ctx.get_actor_id()}  # a restarted actor: the same id, a new pid


def engine_dtype(dtype: str) -> str:
    """'auto' is decided where the engine runs: bf16 on a real GPU, fp32 on CPU (logical GPUs included)."""
    if dtype != "auto":
        return dtype
    return "bfloat16" if torch.cuda.is_available() else "float32"


@ray.remote(concurrency_groups={"health": 1})
class TrialRolloutActor(RolloutWorker):
    """A rollout worker whose model is a trial's `model` config (resolved where the actor runs) and whose dtype
    may be "auto" (`engine_dtype`). `health` runs on its own thread: it answers while `generate` waits on a
    frozen engine (orchestrator/trial/actors/calls.py asks it after a missed deadline)."""

    def __init__(self, model_cfg: dict, settings: RolloutWorkerSettings, scratch: str | None = None):
        if scratch:  # before the engine (and its processes) exist: their temp files go under the trial's
            enter_scratch(scratch, "rollout")
        check_gpu_runtime()
        super().__init__(resolve_model(ModelConfig(**model_cfg)),
                         dataclasses.replace(settings, dtype=engine_dtype(settings.dtype)))

    def placement(self) -> dict:
        return where_am_i()

    @ray.method(concurrency_group="health")
    def health(self) -> dict:
        return super().health()  # its own thread: answers while generate waits


@ray.remote(concurrency_groups={"health": 1})
class LearnerRankActor(Learner):
    """One learner rank. Built in two calls so the group's address (rank 0's node and a free port there) is known
    before any rank joins: `rendezvous` on rank 0, then `start` on every rank (orchestrator/trial/actors/learner_group.py)."""

    def __init__(self, model_cfg: dict, rank: int = 0, world: int = 1, scratch: str | None = None, **kw):
        if scratch:
            enter_scratch(scratch, f"learner{rank}")
        self._args = (model_cfg, Ranks(rank, world), kw)
        self._rank = rank

    def rendezvous(self) -> str:
        return rendezvous_address()

    def start(self, init_method: str | None) -> None:
        check_gpu_runtime()
        model_cfg, ranks, kw = self._args
        super().__init__(resolve_model(ModelConfig(**model_cfg)), ranks=ranks, init_method=init_method, **kw)

    def placement(self) -> dict:
        return where_am_i()

    @ray.method(concurrency_group="health")
    def health(self) -> dict:
        """Answers on its own thread while a training step runs: a rank that does not answer is frozen."""
        return process_health()

    def release_cache(self) -> None:
        """Hand the allocator's cached blocks (the step's activations, the gathered layers) back to the device, so
        a colocated engine waking on this GPU finds them free; nothing to do on CPU."""
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def _placement(pg, bundle: int) -> dict:
    if pg is None:
        return {}
    return {"scheduling_strategy": PlacementGroupSchedulingStrategy(placement_group=pg, placement_group_bundle_index=bundle)}


def rollout_names(workers: list) -> list[tuple[str, object]]:
    """The rollout workers as (name, handle), the names a hang is recorded with."""
    return [(f"rollout[{i}]", w) for i, w in enumerate(workers)]


def placement_record(pg, workers, learner: LearnerPort, health: list[dict], placement: str = "separate",
                     calls: Calls | None = None) -> dict:
    """Where the trial's actors run: their placement group, GPU ids and pids (checked by tests, handy on a
    cluster; a rollout worker's `engine_pids` are its engine's processes, from `health`); `learner` is rank 0,
    `learner_ranks` every rank; `placement`: separate or colocated (worker i then shares rank i's bundle and
    GPU), "shared" on a pool slot (orchestrator/trial/actors/shared.py). `calls`: the trial's deadlines."""
    ctx = ray.get_runtime_context()
    ranks = learner.placements()
    where = (calls or Calls()).get([w.placement.remote() for w in workers], "setup", rollout_names(workers))
    return {
        "placement": placement,
        "placement_group": pg.id.hex() if pg is not None else None,
        "driver": where_am_i(),
        "workers": [{**w, "engine_pids": [c["pid"] for c in h["children"]]}
                    for w, h in zip(where, health, strict=True)],
        "learner": ranks[0],
        "learner_ranks": ranks,
        "node_id": ctx.get_node_id(),
    }


def rollout_engine(cfg: TrialConfig) -> dict:
    """`rollout.engine` as the workers get it. `in_process: null` is decided by the worker (on for the CPU build),
    except when generation runs ahead (`one_step_off`, async with max_staleness > 0): separate processes: generation then overlaps the learner, and vLLM's
    CPU worker inside the actor fought the learner for the same cores (measured on 2 cores, benchmarks/async.py:
    one_step_off ran at 0.24x sync's steps/s in-process, 0.93x with separate processes)."""
    engine = cfg.rollout.engine.model_dump()
    if engine["in_process"] is None and cfg.rollout.staleness_bound > 0:  # one_step_off, async k > 0
        engine["in_process"] = False
    return engine


def rollout_settings(cfg: TrialConfig) -> RolloutWorkerSettings:
    """How the trial's rollout workers build their engines. Full mode: no LoRA in the engine, the weights
    themselves are reloaded."""
    return RolloutWorkerSettings(
        dtype=cfg.model.dtype, seed=cfg.seed, max_model_len=cfg.model.max_model_len,
        max_lora_rank=cfg.learner.lora.rank, engine=rollout_engine(cfg), enable_lora=cfg.learner.mode == "lora",
        sleep_mode=colocated(cfg))


def shutdown_actors(workers: list, learner: LearnerPort | None = None) -> None:
    """End a trial's actors: every rollout worker and every learner rank (`learner.shutdown`: nothing for a pool
    slot's learner); the one way benchmarks and tests tear them down (a `LearnerGroup` is not an actor: `ray.kill`
    on it fails). A trial run by Tune needs none:
    its actors end with the trial. Killing an actor that is already dead is a no-op."""
    for w in workers:
        ray.kill(w)
    if learner is not None:
        learner.shutdown()


def trial_scratch_root(cfg: TrialConfig) -> str:
    """The trial's scratch folder on each node (workers/sync/scratch.py): the same for every attempt."""
    return scratch_root(cfg.resources.scratch_dir, cfg.name, cfg.output_dir or cfg.name)


def start_actors(cfg: TrialConfig, pg, calls: Calls | None = None) -> tuple[list, LearnerGroup]:
    """The trial's rollout workers and learner group, each actor in its bundle of the trial's placement group `pg`
    (None: no group), waited on through `calls` (the trial's deadlines). Returns at once (colocated: once the
    engines are built, so each engine's memory profile runs before its learner rank allocates on the same GPU);
    `ready` on each says when it has built its model."""
    r = cfg.resources
    model_cfg = cfg.model.model_dump()
    settings, scratch = rollout_settings(cfg), trial_scratch_root(cfg)
    workers = [
        TrialRolloutActor.options(num_cpus=s.cpus, num_gpus=s.gpus, **_placement(pg, s.bundle)).remote(
            model_cfg, settings, scratch)
        for s in worker_slots(cfg)
    ]
    if colocated(cfg):  # vLLM sizes its KV cache from the free memory it sees: the learner allocates after it
        (calls or Calls()).get([w.ready.remote() for w in workers], "setup", rollout_names(workers))
    ranks = [
        LearnerRankActor.options(num_cpus=s.cpus, num_gpus=s.gpus, **_placement(pg, s.bundle)).remote(
            model_cfg, rank=i, world=r.learner_ranks, scratch=scratch, learner=cfg.learner, credit=cfg.credit,
            run=RunSettings(seed=cfg.seed, total_steps=cfg.steps, dtype=cfg.model.dtype,
                            collective_timeout_s=cfg.timeouts.collective),
            interventions=cfg.interventions)
        for i, s in enumerate(learner_slots(cfg))
    ]
    return workers, LearnerGroup(ranks, full=not settings.enable_lora, calls=calls)
