"""Which shared pool a trial of a shared-base campaign (`resources.shared_base`, orchestrator/pool/) runs on: the
pool built from its POOL_KEYS values. A campaign that sweeps base models gets one pool per model; every other pool
key is one value for the whole campaign (orchestrator/campaign/shared.py refuses the rest).

`pool_id(cfg)` is a pure function of the trial's config, so a trial finds its own pool by its config alone (a
retried trial, a re-submitted campaign) and the campaign starts exactly the pools its trials will look for. The
pool's actors are named from it here (`learner_name`, `slots_name`, `engine_name`: the campaign's Ray namespace),
so that the pool that names them (orchestrator/pool/), the trials that find them (orchestrator/trial/actors/shared.py)
and the campaign driver that releases their slots (orchestrator/tune/slot_owner.py) agree without importing each
other.

The pool's shape (`resources.shared_base.learners` L, `.engines` E): `pool_learners` / `pool_engines` read it, and
which of them a slot uses is decided here only, by pure functions of the slot: `slot_learner` (slot s trains on
learner s mod L) and `slot_engines` (the w engines a trial of `rollout.num_workers` w samples on, among the E).

`shared_gpu_hours` is what a shared campaign costs: its pools' GPUs for as long as they are up, whatever their trials
do; `plan` charges it over the makespan (orchestrator/preflight/shared_plan.py), the lockstep budget over the wall
since the campaign's driver started its trials (orchestrator/tune/lockstep.py)."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable
from typing import Any

from orchestrator.config.placement import engines, shape_bundles
from orchestrator.config.trial import TrialConfig

# what a pool's engines and learner are built from; `model` may differ between pools, the rest is campaign-wide
POOL_KEYS = ("model", "learner.lora.rank", "learner.lora.alpha", "learner.lora.target_modules", "rollout.engine",
             "rollout.num_workers", "resources")
PER_POOL = ("model",)
POOL = "shared-base-pool"  # the prefix of every pool actor's name


def learner_name(pool: str, j: int) -> str:
    return f"{POOL}/{pool}/learner{j}"


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


def pool_learners(cfg: TrialConfig) -> int:
    """Learner actors of the trial's pool (`resources.shared_base.learners`; 1 for a trial without shared_base)."""
    shared = cfg.resources.shared_base
    return 1 if shared is None else shared.learners


def pool_engines(cfg: TrialConfig) -> int:
    """Engine actors of the trial's pool: `resources.shared_base.engines`, or (None, or no shared_base) the engines
    a separate trial of it would start (config/placement.py:engines)."""
    shared = cfg.resources.shared_base
    return engines(cfg) if shared is None or shared.engines is None else shared.engines


# CUDA compute capability by Ray's accelerator_type label (the labels of preflight/learner_memory.py:GPU_MEMORY_GIB);
# vLLM's batch-invariant kernels (VLLM_BATCH_INVARIANT=1) are written for 9.0 and later (Hopper, Blackwell)
COMPUTE_CAPABILITY = {"H100": (9, 0), "H200": (9, 0), "B200": (10, 0), "A100": (8, 0), "A100-80G": (8, 0),
                      "A100-40G": (8, 0), "L40S": (8, 9), "L4": (8, 9), "A10G": (8, 6), "V100": (7, 0),
                      "T4": (7, 5)}
BATCH_INVARIANT_CC = (9, 0)


def engine_env(cfg: TrialConfig) -> dict[str, str]:
    """The environment variables the trial's pool engines start with (their actors' runtime_env, set before the
    process imports vLLM, which reads VLLM_BATCH_INVARIANT at import): `shared_base.batch_invariant`."""
    shared = cfg.resources.shared_base
    return {"VLLM_BATCH_INVARIANT": "1"} if shared is not None and shared.batch_invariant else {}


def batch_invariant_refusal(cfg: TrialConfig) -> tuple[str, str] | None:
    """(key path, why) when the trial asks `shared_base.batch_invariant` where it cannot hold; None otherwise (also
    for a GPU model not in COMPUTE_CAPABILITY: nothing known to refuse)."""
    r = cfg.resources
    if r.shared_base is None or not r.shared_base.batch_invariant:
        return None
    if r.worker_gpus == 0:
        return ("resources.worker_gpus", "resources.shared_base.batch_invariant needs a CUDA GPU of compute "
                "capability 9.0+ (H100/H200 class) per engine, and worker_gpus is 0; on CPU it is not needed: the "
                "suite shows shared engines on CPU give each slot the same samples as a separate engine, bit for "
                "bit: unset batch_invariant")
    cc = COMPUTE_CAPABILITY.get(r.accelerator_type or "")
    if cc is not None and cc < BATCH_INVARIANT_CC:
        return ("resources.accelerator_type", f"resources.shared_base.batch_invariant needs a CUDA GPU of compute "
                f"capability 9.0+ (H100, H200, B200), and {r.accelerator_type} is {cc[0]}.{cc[1]}: pick such a GPU "
                f"or unset batch_invariant (the report's step-0 check then accepts a stated tolerance)")
    return None


def slot_learner(slot: int, learners: int) -> int:
    """The learner (its index, `learner_name(pool, j)`) slot `slot` trains on: slot mod learners."""
    if learners < 1 or slot < 0:
        raise ValueError(f"slot {slot} of a pool of {learners} learner(s)")
    return slot % learners


def slot_engines(slot: int, workers: int, engines: int) -> list[int]:
    """The engines (their indices, `engine_name(pool, i)`, in the order the trial splits its prompts over them)
    that a trial of `workers` rollout workers samples on in slot `slot` of a pool of `engines` engines: `workers`
    distinct consecutive ones (mod `engines`) from slot x workers, so the slots spread over the engines; the trial
    splits its prompts over them as a separate trial over its own `workers` engines (the same metrics)."""
    if not 0 <= workers <= engines or slot < 0:
        raise ValueError(f"a trial of {workers} rollout worker(s) in slot {slot} of a pool of {engines} engine(s)")
    return [(slot * workers + i) % engines for i in range(workers)]


def pool_bundles(cfg: TrialConfig) -> list[dict[str, float]]:
    """The pool's placement group: its engines' bundles (indices 0 .. E-1) then its learners' (E .. E+L-1)."""
    return shape_bundles(cfg, pool_engines(cfg), pool_learners(cfg))


def pool_gpus(cfg: TrialConfig) -> float:
    """GPUs one pool holds while it is up: its engines' (`pool_engines`) and learners' (`pool_learners`, each a
    separate trial's learner)."""
    return sum(b.get("GPU", 0.0) for b in pool_bundles(cfg))


def shared_gpus(cfgs: Iterable[TrialConfig]) -> float:
    """GPUs the pools of these trials hold together: each pool (one per pool id) its GPUs once. Whether the trials
    set shared_base is not read: `plan` asks it of the trials as separate ones."""
    pools = {pool_id(c): c for c in cfgs}
    return sum(pool_gpus(c) for c in pools.values())


def shared_gpu_hours(cfgs: Iterable[TrialConfig], wall_s: float) -> float:
    """GPU-hours the pools of these trials spend in `wall_s` seconds up, however many of their trials run, pause
    or wait meanwhile: what `plan` and the lockstep budget both charge a shared campaign."""
    return shared_gpus(cfgs) * wall_s / 3600.0
