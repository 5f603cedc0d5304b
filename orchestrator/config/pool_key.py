"""Which shared pool a trial of a shared-base campaign (`resources.shared_base`, orchestrator/pool/) runs on: the
pool built from its POOL_KEYS values. A campaign that sweeps base models gets one pool per model; every other pool
key is one value for the whole campaign (orchestrator/campaign/shared.py refuses the rest).

`pool_id(cfg)` is a pure function of the trial's config, so a trial finds its own pool by its config alone (a
retried trial, a re-submitted campaign) and the campaign starts exactly the pools its trials will look for."""

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
