"""Which shared pool a trial of a shared-base campaign (`resources.shared_base`, orchestrator/pool/) runs on: the
pool built from its POOL_KEYS values. A campaign that sweeps base models gets one pool per model; every other pool
key is one value for the whole campaign (orchestrator/campaign/shared.py refuses the rest).

`pool_id(cfg)` is a pure function of the trial's config, so a trial finds its own pool by its config alone (a
retried trial, a re-submitted campaign) and the campaign starts exactly the pools its trials will look for. The
pool's actors are named from it here (`learner_name`, `slots_name`, `engine_name`: the campaign's Ray namespace),
so that the pool that names them (orchestrator/pool/), the trials that find them (orchestrator/trial/actors/shared.py)
and the campaign driver that releases their slots (orchestrator/tune/slot_owner.py) agree without importing each
other.

`shared_gpu_hours` is what a shared campaign costs: its pools' GPUs for as long as they are up, whatever their trials
do; `plan` charges it over the makespan (orchestrator/preflight/shared_plan.py), the lockstep budget over the wall
since the campaign's driver started its trials (orchestrator/tune/lockstep.py)."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable
from typing import Any

from orchestrator.config.trial import TrialConfig

# what a pool's engines and learner are built from; `model` may differ between pools, the rest is campaign-wide
POOL_KEYS = ("model", "learner.lora.rank", "learner.lora.alpha", "learner.lora.target_modules", "rollout.engine",
             "rollout.num_workers", "resources")
PER_POOL = ("model",)
POOL = "shared-base-pool"  # the prefix of every pool actor's name


def learner_name(pool: str) -> str:
    return f"{POOL}/{pool}/learner"


def slots_name(pool: str) -> str:
    return f"{POOL}/{pool}/slots"


def engine_name(pool: str, i: int) -> str:
    return f"{POOL}/{pool}/engine{i}"


def get_path(data: dict, path: str) -> Any:
    for part in path.split("."):
        data = data.get(part) if isinstance(data, dict) else None
    return data


def pool_id(cfg: TrialConfig) -> str:
    """A short readable id: the model's name as a slug (its last path part) and a hash of every pool key's value,
    e.g. `tiny-reasoner-3fa9c2d1`. Equal pool keys give equal ids; any difference gives another."""
    data = cfg.model_dump(mode="json")
    key = json.dumps({k: get_path(data, k) for k in POOL_KEYS}, sort_keys=True)
    slug = re.sub(r"[^a-z0-9.]+", "-", cfg.model.name.rstrip("/").rsplit("/", 1)[-1].lower()).strip("-.")
    return f"{slug[:24] or 'model'}-{hashlib.sha256(key.encode()).hexdigest()[:8]}"


def pool_groups(cfgs: Iterable[TrialConfig]) -> dict[str, list[TrialConfig]]:
    """The shared trials by pool id, in the order their pools first appear (trials without shared_base left out)."""
    groups: dict[str, list[TrialConfig]] = {}
    for c in cfgs:
        if c.resources.shared_base is not None:
            groups.setdefault(pool_id(c), []).append(c)
    return groups


def pool_gpus(cfg: TrialConfig) -> float:
    """GPUs one pool holds while it is up: a separate trial's engines and learner (its bundles less its driver's)."""
    r = cfg.resources
    return r.learner_gpus * r.learner_ranks + cfg.rollout.num_workers * r.worker_gpus


def shared_gpus(cfgs: Iterable[TrialConfig]) -> float:
    """GPUs the pools of these trials hold together: each pool (one per pool id) its GPUs once. Whether the trials
    set shared_base is not read: `plan` asks it of the trials as separate ones."""
    pools = {pool_id(c): c for c in cfgs}
    return sum(pool_gpus(c) for c in pools.values())


def shared_gpu_hours(cfgs: Iterable[TrialConfig], wall_s: float) -> float:
    """GPU-hours the pools of these trials spend in `wall_s` seconds up, however many of their trials run, pause
    or wait meanwhile: what `plan` and the lockstep budget both charge a shared campaign."""
    return shared_gpus(cfgs) * wall_s / 3600.0
