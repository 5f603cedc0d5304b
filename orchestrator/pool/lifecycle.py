"""The pools' life: started by the campaign before the Tuner, one per base model (orchestrator/config/pool_key.py:
a campaign that sweeps models gets one per model), each in a placement group of its own that reserves its E
engines' and L learners' bundles once (`resources.shared_base.engines`, default rollout.num_workers, and
`.learners`, default 1; each bundle a separate trial's: orchestrator/config/pool_key.py:pool_bundles), its
actors named by its pool id in the campaign's Ray namespace (`engine_name(pool, i)`, `learner_name(pool, j)`),
waited on until every model is built, and stopped (actors killed, group removed) when the campaign ends or fails.
Each learner holds the base once and trains the slots s with s mod L = j (pool_key.py:slot_learner; it refuses
the others); each engine serves every slot's adapter, a trial sampling on its `slot_engines`. The pools start
side by side (each placed and its actors started in turn, then all waited on together); one that fails to start
stops them all. A re-submitted campaign starts new pools; its trials resume from their own checkpoints.

An engine or a learner that dies (its process killed, out of memory, its engine core gone: actors.py) is
restarted by Ray in its bundle, up to `RESTARTS` times (the pool's restart budget), with every slot empty; one that
is stopped, frozen or stuck is killed by the campaign's supervisor (supervisor.py) and restarted the same way. A
restarted engine costs its trials only time: each trial's engine client opens its slot again with its current
adapter and resubmits the requests it had in flight (trial/actors/engine_recovery.py). A learner's
restart costs no trial a retry either: each trial on that learner (its slots only: the other learners' trials see
nothing) waits for it, reopens its slot and restores its newest checkpoint in its own process
(trial/actors/shared.py:PoolLearnerClient). Once an actor's
budget is spent its calls fail in one line."""

from __future__ import annotations

import dataclasses
import time
import uuid
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass

import ray
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from orchestrator.actors.setup import rollout_settings
from orchestrator.config.pool_key import (
    POOL,
    engine_env,
    engine_name,
    learner_name,
    pool_bundles,
    pool_engines,
    pool_groups,
    pool_learners,
    slots_name,
)
from orchestrator.config.trial import TrialConfig
from workers.sync.scratch import remove_scratch, scratch_root

RESTARTS = 3  # per pool actor and campaign run: a pool that keeps dying is a bug to see, not to retry forever


@dataclass
class Pool:
    id: str  # orchestrator/config/pool_key.py:pool_id of its trials
    group: object
    learners: list = dataclasses.field(default_factory=list)  # learner j: `learner_name(id, j)`
    engines: list = dataclasses.field(default_factory=list)
    registry: object = None
    scratch: str = ""  # the pool's scratch folder on this node (workers/sync/scratch.py), removed by `stop`

    def health(self, timeout: float) -> list[dict]:
        """Every pool actor's health answer within `timeout` (raises when one is frozen or dead)."""
        return ray.get([a.health.remote() for a in [*self.learners, *self.engines]], timeout=timeout)

    def actors(self) -> list:
        return [a for a in [*self.engines, *self.learners, self.registry] if a is not None]

    def usage(self, timeout: float = 10.0) -> str:
        """One line: how busy the pool's engines and each learner were over its life (the share of the engines'
        wall spent decoding, of each learner's spent training); empty when an actor does not answer."""
        try:
            learners = ray.get([a.stats.remote() for a in self.learners], timeout=timeout)
            engines = ray.get([e.stats.remote() for e in self.engines], timeout=timeout)
        except Exception:  # noqa: BLE001 - a dead or restarting actor: no line rather than a failed stop
            return ""
        return usage_line(self.id, engines, learners)

    def stop(self) -> None:
        if self.learners and self.engines and (line := self.usage()):
            print(line, flush=True)
        for actor in self.actors():
            ray.kill(actor)
        remove_placement_group(self.group)
        if self.scratch:
            remove_scratch(self.scratch)


def usage_line(pool: str, engines: list[dict], learners: list[dict]) -> str:
    """`Pool.usage`'s line from the engines' and learners' `stats` answers."""
    decoding = [e["step_s"] / max(e["up_s"], 1e-9) for e in engines]
    each = "; ".join(f"learner{j} training {a['train_s'] / max(a['up_s'], 1e-9):.0%} of its {a['up_s']:.0f} s "
                     f"(exports {a['export_s']:.1f} s, checkpoints {a['checkpoint_s']:.1f} s)"
                     for j, a in enumerate(learners))
    return (f"shared pool {pool} (since each actor last started): engines decoding "
            f"{', '.join(f'{d:.0%}' for d in decoding)} of their {max(e['up_s'] for e in engines):.0f} s (adapter "
            f"loads {sum(e['adapter_s'] for e in engines):.1f} s, {sum(e['served_calls'] for e in engines)} "
            f"rollouts, at most {max(e['max_in_flight'] for e in engines)} at once); {each}")


def _place(pool: str, cfg: TrialConfig) -> Pool:
    """The pool's placement group, placed (RuntimeError when it is not within the setup timeout)."""
    group = placement_group(pool_bundles(cfg), strategy="PACK")
    if not group.wait(timeout_seconds=cfg.timeouts.setup):
        remove_placement_group(group)
        raise RuntimeError(f"shared pool {pool}: its placement group ({pool_bundles(cfg)}) was not placed within "
                           f"{cfg.timeouts.setup:g} s")
    return Pool(pool, group)


def _build(pool: Pool, cfg: TrialConfig, start_policy: bool = False) -> None:
    """Start the pool's actors in its placed group (not waited on here); `start_policy`: its engines also serve
    base-model requests (a trial of the pool sets rollout.difficulty_samples)."""
    from orchestrator.pool.actors import pool_engine_actor, pool_learner_actor
    from orchestrator.pool.slots import SlotRegistry

    slots, r, k, n = cfg.resources.shared_base.slots, cfg.resources, pool_engines(cfg), pool_learners(cfg)

    def bundle(i: int) -> dict:
        return {"scheduling_strategy": PlacementGroupSchedulingStrategy(placement_group=pool.group,
                                                                        placement_group_bundle_index=i)}

    model_cfg, settings = cfg.model.model_dump(), dataclasses.replace(rollout_settings(cfg), start_policy=start_policy)
    # the pool's temp files in one folder: a restarted actor removes its dead predecessor's, `stop` the rest
    pool.scratch = scratch_root(cfg.resources.scratch_dir, POOL, f"{pool.id}:{cfg.output_dir or cfg.name}")
    engine_actor = pool_engine_actor()
    # shared_base.batch_invariant: in the engine process's environment before it imports vLLM (Ray merges these
    # env_vars with the job's: VLLM_CPU_KVCACHE_SPACE and the others still reach it)
    env = engine_env(cfg)
    pool.engines = [engine_actor.options(name=engine_name(pool.id, i), max_concurrency=slots + 2,
                                         num_cpus=r.worker_cpus, num_gpus=r.worker_gpus, max_restarts=RESTARTS,
                                         **({"runtime_env": {"env_vars": env}} if env else {}),
                                         **bundle(i)).remote(model_cfg, slots, settings, pool.scratch)
                    for i in range(k)]
    learner_actor = pool_learner_actor(slots)
    pool.learners = [learner_actor.options(name=learner_name(pool.id, j), num_cpus=r.learner_cpus,
                                           num_gpus=r.learner_gpus, max_restarts=RESTARTS,
                                           **bundle(k + j)).remote(model_cfg, slots, pool.scratch, (j, n))
                     for j in range(n)]
    # its table's file: one per pool start (a restarted registry reads it back; a new campaign run starts empty)
    state = f"{pool.scratch}/slots-{uuid.uuid4().hex[:8]}.json"
    pool.registry = SlotRegistry.options(name=slots_name(pool.id), max_restarts=RESTARTS, max_task_retries=RESTARTS,
                                         **bundle(k)).remote(slots, k, state, n)


def start_pools(cfgs: list[TrialConfig]) -> list[Pool]:
    """One pool per pool id among `cfgs` (trials without shared_base need none), each built for the first trial of
    its group (its trials agree on what matters here: orchestrator/campaign/shared.py), all ready when this
    returns; when one fails to start, every one started is stopped and the error raised."""
    every = pool_groups(cfgs)
    groups = {pid: group[0] for pid, group in every.items()}
    if not groups:
        return []
    unresolved = [c.name for c in groups.values() if c.resources.shared_base.shape is not None]
    if unresolved:  # `run` resolves it before launch (orchestrator/tune/launch.py:shaped); a caller that did not
        raise ValueError("shared_base.shape auto reached the pools unresolved "
                         f"(trials {', '.join(unresolved)}): resolve it first (orchestrator/preflight/shape_choice.py)")
    pools: list[Pool] = []
    at = time.monotonic()
    try:
        for pid, cfg in groups.items():
            pools.append(_place(pid, cfg))
            _build(pools[-1], cfg, any(c.rollout.difficulty_samples for c in every[pid]))
        for pool in pools:
            cfg = groups[pool.id]
            left = max(cfg.timeouts.setup - (time.monotonic() - at), 1.0)
            ray.get([a.ready.remote() for a in [*pool.learners, *pool.engines]], timeout=left)
            pool.health(cfg.timeouts.health)
    except BaseException:
        stop_all(pools)
        raise
    for pool in pools:
        cfg = groups[pool.id]
        print(f"shared pool {pool.id}: {len(pool.engines)} engine(s) and {len(pool.learners)} learner(s) for "
              f"{cfg.resources.shared_base.slots} slots", flush=True)
    print(f"{len(pools)} shared pool(s) ready in {time.monotonic() - at:.0f} s", flush=True)
    return pools


@contextmanager
def running_pools(cfgs: list[TrialConfig], record: Callable[[dict], None] | None = None):
    """The pools of these trials while the block runs (none for separate trials): one per base model, watched by
    the supervisor (supervisor.py), whose events go to `record` (None: printed only)."""
    pools = start_pools(cfgs)
    try:
        with supervised(pools, cfgs, record or (lambda event: None)):
            yield pools
    finally:
        stop_all(pools)


@contextmanager
def supervised(pools: list[Pool], cfgs: list[TrialConfig], record: Callable[[dict], None]):
    """The supervisor watching every pool's engines and learners under its pool's `shared_base.supervisor` while
    the block runs (stopped before the pools are)."""
    from orchestrator.pool.supervisor import Supervisor, Watch

    settings = {pid: group[0].resources.shared_base.supervisor for pid, group in pool_groups(cfgs).items()}
    actors = [(Watch(p.id, f"engine{i}", "engine"), e, settings[p.id]) for p in pools for i, e in enumerate(p.engines)]
    actors += [(Watch(p.id, f"learner{j}", "learner"), a, settings[p.id]) for p in pools
               for j, a in enumerate(p.learners)]
    supervisor = Supervisor(actors, record).start() if actors else None
    try:
        yield supervisor
    finally:
        if supervisor is not None:
            supervisor.stop()


def stop_all(pools: list[Pool]) -> None:
    """Stop every pool, each even when stopping another raised (the first error is raised after)."""
    errors = []
    for pool in pools:
        try:
            pool.stop()
        except Exception as e:  # noqa: BLE001 - the others still stop
            errors.append(e)
    if errors:
        raise errors[0]
