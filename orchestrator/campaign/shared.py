"""What a campaign on a shared base (`resources.shared_base`, orchestrator/pool/) refuses before launch: one line
naming the key, the trial and what is allowed (exit 2). Every trial of such a campaign is a LoRA adapter on the
engines and learner of its base model's pool (orchestrator/config/pool_key.py: one pool per `model`), so what else a
pool is built from (LoRA shape, engine settings, resources) must be the same in every trial."""

from __future__ import annotations

from typing import Any

from orchestrator.campaign.schema import CampaignConfig, ExpandedTrial
from orchestrator.config.errors import UserError
from orchestrator.config.pool_key import PER_POOL, POOL_KEYS, batch_invariant_refusal
from orchestrator.config.pool_key import get_path as _get


def _origin(cfg: CampaignConfig, trial: ExpandedTrial, path: str) -> str:
    """The campaign file's key a trial's `path` came from: a sweep, its condition's override, the campaign's
    `resources:`, or base."""
    for key in trial.sweep:
        if key == path or key.startswith(path + ".") or path.startswith(key + "."):
            return f"sweep.{key}"
    override = cfg.conditions[trial.condition]
    parts = path.split(".")
    for n in range(len(parts), 0, -1):
        if _get(override, ".".join(parts[:n])) is not None:
            return f"conditions.{trial.condition}.{path}"
    if parts[0] == "resources" and cfg.resources is not None:
        return path
    return f"base.{path}"


def _differs(a: Any, b: Any, path: str) -> str:
    """The first leaf key under `path` where `a` and `b` differ, and both values."""
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b)):
            if a.get(k) != b.get(k):
                return _differs(a.get(k), b.get(k), f"{path}.{k}")
    return f"{path} {a!r} vs {b!r}"


def check_shared_base(cfg: CampaignConfig, trials: list[ExpandedTrial], source: str) -> None:
    """Refuse a shared-base campaign the pool cannot serve; nothing to check when no trial shares."""
    shared = [t for t in trials if t.trial.resources.shared_base is not None]
    if not shared:
        return
    first = shared[0]
    for t in trials:
        c, where = t.trial, f"(trial {t.name})"
        if c.resources.shared_base is None:
            raise UserError(f"{source}: {_origin(cfg, first, 'resources.shared_base')}: every trial of a shared-base "
                            f"campaign shares it; trial {first.name} sets it, {t.name} does not: set it in base or the campaign's resources")
        if c.learner.mode != "lora":
            raise UserError(f"{source}: {_origin(cfg, t, 'learner.mode')}: resources.shared_base needs "
                            f"learner.mode 'lora' (full fine-tuning trains the base itself, which trials cannot "
                            f"share) {where}")
        if c.learner.cpu_offload:
            raise UserError(f"{source}: {_origin(cfg, t, 'learner.cpu_offload')}: resources.shared_base needs "
                            f"cpu_offload off (it shards the learner with FSDP; a slot is one unsharded learner) "
                            f"{where}")
        if c.resources.learner_ranks != 1:
            raise UserError(f"{source}: {_origin(cfg, t, 'resources.learner_ranks')}: resources.shared_base needs "
                            f"learner_ranks 1 (each learner process of the pool holds its slots unsharded) {where}")
        sb = c.resources.shared_base
        if sb.learners > sb.slots:
            raise UserError(f"{source}: {_origin(cfg, t, 'resources.shared_base.learners')}: {sb.learners} learners "
                            f"for {sb.slots} slots would leave a learner without a slot; at most {sb.slots} "
                            f"(the slots) {where}")
        if sb.engines is not None and sb.engines < c.rollout.num_workers:
            raise UserError(f"{source}: {_origin(cfg, t, 'resources.shared_base.engines')}: {sb.engines} engines "
                            f"for trials of rollout.num_workers {c.rollout.num_workers}, each sampling on that many "
                            f"of the pool's engines; at least {c.rollout.num_workers} (or unset: as many) {where}")
        if refused := batch_invariant_refusal(c):
            raise UserError(f"{source}: {_origin(cfg, t, refused[0])}: {refused[1]} {where}")
        if c.resources.placement != "separate":
            raise UserError(f"{source}: {_origin(cfg, t, 'resources.placement')}: resources.shared_base needs "
                            f"placement 'separate' (the pool's engines serve other trials while one trains) {where}")
        for key in (k for k in POOL_KEYS if k not in PER_POOL):  # a model sweep: one pool per model
            a, b = _get(first.config, key), _get(t.config, key)
            if a != b:
                raise UserError(f"{source}: {_origin(cfg, t, key)}: trials of a shared-base campaign must agree on "
                                f"{key} ({_differs(a, b, key)} in trials {first.name} and {t.name}); only the model "
                                f"may differ (one pool per base model); run one campaign per value")
