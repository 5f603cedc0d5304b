"""The pool's life: started by the campaign before the Tuner, in a placement group of its own that reserves the
learner's and the engines' bundles once (the bundles a separate trial of the campaign would take, less its
driver's), its actors named in the campaign's Ray namespace (orchestrator/trial/actors/shared.py), waited on
until every model is built, and stopped (actors killed, group removed) when the campaign ends or fails. A
re-submitted campaign starts a new pool; its trials resume from their own checkpoints.

An engine or the learner that dies (its process killed, out of memory, its engine core gone: actors.py) is
restarted by Ray in its bundle, up to `RESTARTS` times, with every slot empty: each trial's next call to it fails
(a raised call, a slot the learner no longer holds, or a rollout under another adapter version than the trial
pushed: orchestrator/trial/step/sequence.py), Tune retries that trial, and it reopens its slot and resumes from
its newest checkpoint, as after its own driver's death."""

from __future__ import annotations

import shutil
import time
from contextlib import contextmanager
from dataclasses import dataclass

import ray
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from orchestrator.config.placement import bundles, engines
from orchestrator.config.trial import TrialConfig
from orchestrator.trial.actors.shared import LEARNER, POOL, SLOTS, engine_name
from orchestrator.trial.actors.start import rollout_settings
from workers.sync.scratch import scratch_root

RESTARTS = 3  # per pool actor and campaign run: a pool that keeps dying is a bug to see, not to retry forever


@dataclass
class Pool:
    group: object
    learner: object
    engines: list
    registry: object
    scratch: str  # the pool's scratch folder on this node (workers/sync/scratch.py), removed by `stop`

    def health(self, timeout: float) -> list[dict]:
        """Every pool actor's health answer within `timeout` (raises when one is frozen or dead)."""
        return ray.get([a.health.remote() for a in [self.learner, *self.engines]], timeout=timeout)

    def stop(self) -> None:
        for actor in [*self.engines, self.learner, self.registry]:
            ray.kill(actor)
        remove_placement_group(self.group)
        shutil.rmtree(self.scratch, ignore_errors=True)


def pool_bundles(cfg: TrialConfig) -> list[dict[str, float]]:
    """The engines' bundles then the learner's: a separate trial's, without its driver."""
    return bundles(cfg)[1:]


def start_pool(cfg: TrialConfig) -> Pool:
    """The pool for trials shaped like `cfg` (every trial of a shared campaign agrees on what matters here:
    orchestrator/campaign/shared.py), ready when this returns."""
    from orchestrator.pool.actors import PoolEngine, pool_learner_actor
    from orchestrator.pool.slots import SlotRegistry

    slots, r, k = cfg.resources.shared_base.slots, cfg.resources, engines(cfg)
    group = placement_group(pool_bundles(cfg), strategy="PACK")
    at = time.monotonic()
    if not group.wait(timeout_seconds=cfg.timeouts.setup):
        remove_placement_group(group)
        raise RuntimeError(f"the shared pool's placement group ({pool_bundles(cfg)}) was not placed within "
                           f"{cfg.timeouts.setup:g} s")

    def bundle(i: int) -> dict:
        return {"scheduling_strategy": PlacementGroupSchedulingStrategy(placement_group=group,
                                                                        placement_group_bundle_index=i)}

    model_cfg, settings = cfg.model.model_dump(), rollout_settings(cfg)
    # the pool's temp files in one folder: a restarted actor removes its dead predecessor's, `stop` the rest
    scratch = scratch_root(cfg.resources.scratch_dir, POOL, cfg.output_dir or cfg.name)
    engine_actor = ray.remote(PoolEngine)
    pool_engines = [engine_actor.options(name=engine_name(i), max_concurrency=slots + 2, num_cpus=r.worker_cpus,
                                         num_gpus=r.worker_gpus, max_restarts=RESTARTS, **bundle(i))
                    .remote(model_cfg, slots, settings, scratch)
                    for i in range(k)]
    learner = pool_learner_actor(slots).options(name=LEARNER, num_cpus=r.learner_cpus, num_gpus=r.learner_gpus,
                                                max_restarts=RESTARTS, **bundle(k)).remote(model_cfg, slots, scratch)
    registry = SlotRegistry.options(name=SLOTS).remote(slots, k)
    pool = Pool(group, learner, pool_engines, registry, scratch)
    try:
        left = max(cfg.timeouts.setup - (time.monotonic() - at), 1.0)
        ray.get([a.ready.remote() for a in [learner, *pool_engines]], timeout=left)
        pool.health(cfg.timeouts.health)
    except BaseException:
        pool.stop()
        raise
    print(f"shared pool: {k} engine(s) and one learner for {slots} slots, ready in "
          f"{time.monotonic() - at:.0f} s", flush=True)
    return pool


@contextmanager
def running_pool(cfg: TrialConfig | None):
    """A pool for the campaign's trials while the block runs (None: separate trials, no pool)."""
    if cfg is None or cfg.resources.shared_base is None:
        yield None
        return
    pool = start_pool(cfg)
    try:
        yield pool
    finally:
        pool.stop()
