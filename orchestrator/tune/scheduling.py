"""What a campaign's `schedule`, `budget` and `seeds.adaptive` hand Tune: a scheduler and a searcher (or neither:
Tune's FIFO over the grid, as before)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from orchestrator.campaign.schema import Campaign
from orchestrator.config.placement import bundles
from orchestrator.config.pool_key import pool_groups, pool_id
from orchestrator.tune.slot_cap import SlotCap

if TYPE_CHECKING:
    from orchestrator.tune.lockstep import GpuCharge
    from orchestrator.tune.slot_owner import SlotOwner


@dataclass
class TuneScheduling:
    scheduler: object = None  # LockstepScheduler or None (FIFO)
    search_alg: object = None  # CampaignSearcher or None (grid over the trial names)
    max_concurrent: int | None = None  # what Tune's own limiter gets (a scheduler with a searcher counts itself)
    owner: SlotOwner | None = None  # a shared campaign's: the Tune callback that gives back a trial's slot


def _pools(campaign: Campaign) -> dict[str, str]:
    """Shared trial name -> its pool id (one pool per base model: orchestrator/config/pool_key.py)."""
    return {t.name: pool_id(t.trial) for t in campaign.trials if t.trial.resources.shared_base is not None}


def concurrency_limit(campaign: Campaign) -> int | None:
    """Trials running at once: `max_concurrent_trials`, and at most every shared pool's slots together
    (`resources.shared_base`: a trial beyond them would wait for a slot while holding Tune's place; each pool's
    own cap: `slot_cap`)."""
    pools = _pools(campaign)
    slots = [t.trial.resources.shared_base.slots for t in campaign.trials if t.trial.resources.shared_base]
    total = [slots[0] * len(set(pools.values()))] if slots else []
    limits = [n for n in (campaign.config.max_concurrent_trials, *total) if n is not None]
    return min(limits) if limits else None


def slot_cap(campaign: Campaign) -> SlotCap:
    """The limit in all and, on a shared base, each pool's slots (orchestrator/tune/slot_cap.py)."""
    shared = campaign.trials[0].trial.resources.shared_base
    return SlotCap(concurrency_limit(campaign), shared.slots if shared else None, _pools(campaign))


def slot_owner(campaign: Campaign) -> SlotOwner | None:
    """The campaign driver's hand on its pools' slots (orchestrator/tune/slot_owner.py), or None (no shared base)."""
    from orchestrator.tune.slot_owner import SlotOwner

    pools = _pools(campaign)
    return SlotOwner(pools, campaign.directory) if pools else None


def gpu_charge(campaign: Campaign) -> GpuCharge:
    """What the lockstep budget charges: a separate trial its placement group's GPUs over its steps; the shared
    trials their pools' GPUs over the wall, once (orchestrator/config/pool_key.py:shared_gpu_hours, as plan)."""
    from orchestrator.tune.lockstep import GpuCharge

    pools = pool_groups(t.trial for t in campaign.trials)
    return GpuCharge({t.name: sum(b.get("GPU", 0) for b in bundles(t.trial)) for t in campaign.trials
                      if t.trial.resources.shared_base is None}, tuple(g[0] for g in pools.values()))


def scheduling(campaign: Campaign) -> TuneScheduling:
    """FIFO over the grid with Tune's limiter (one pool or none), else the campaign searcher with a scheduler that
    counts each pool's running trials (several pools: orchestrator/tune/slot_cap.py; lockstep rounds; adaptive
    seeds)."""
    from orchestrator.tune.adaptive import CampaignSearcher
    from orchestrator.tune.lockstep import LockstepScheduler
    from orchestrator.tune.pool_fifo import PoolFifo

    cfg = campaign.config
    several = len(set(_pools(campaign).values())) > 1
    owner = slot_owner(campaign)
    if cfg.schedule.mode == "fifo" and cfg.adaptive is None and not several:
        return TuneScheduling(max_concurrent=concurrency_limit(campaign), owner=owner)
    scheduler = PoolFifo(slot_cap(campaign)) if several else None
    if cfg.schedule.mode == "lockstep":
        scheduler = LockstepScheduler(
            cfg.schedule.round_steps, {t.name: t.trial.steps for t in campaign.trials}, gpu_charge(campaign),
            campaign.directory, cfg.budget, slots=slot_cap(campaign),
            expected=None if cfg.adaptive is None else [t.name for t in campaign.trials
                                                          if t.seed < cfg.adaptive.start])
    # seed-major order: a look's seeds of every condition run before the next seed's
    order = [t.name for t in sorted(campaign.trials, key=lambda t: t.seed)]
    searcher = CampaignSearcher(order, {t.name: t.seed for t in campaign.trials},
                                {t.name: t.condition for t in campaign.trials}, campaign.directory,
                                cfg.adaptive, scheduler, interpolate=cfg.report.auc_interpolate)
    return TuneScheduling(scheduler, searcher, None if scheduler is not None else concurrency_limit(campaign), owner)
