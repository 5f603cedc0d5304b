"""What a campaign's `schedule`, `budget` and `seeds.adaptive` hand Tune: a scheduler and a searcher (or neither:
Tune's FIFO over the grid, as before)."""

from __future__ import annotations

from dataclasses import dataclass

from orchestrator.campaign.schema import Campaign
from orchestrator.config.placement import bundles


@dataclass
class TuneScheduling:
    scheduler: object = None  # LockstepScheduler or None (FIFO)
    search_alg: object = None  # CampaignSearcher or None (grid over the trial names)
    max_concurrent: int | None = None  # what Tune's own limiter gets (lockstep counts slots itself)


def concurrency_limit(campaign: Campaign) -> int | None:
    """Trials running at once: `max_concurrent_trials`, and at most the shared pool's slots
    (`resources.shared_base`: a trial beyond them would wait for a slot while holding Tune's place)."""
    slots = [t.trial.resources.shared_base.slots for t in campaign.trials if t.trial.resources.shared_base]
    limits = [n for n in (campaign.config.max_concurrent_trials, *slots[:1]) if n is not None]
    return min(limits) if limits else None


def scheduling(campaign: Campaign) -> TuneScheduling:
    from orchestrator.tune.adaptive import CampaignSearcher
    from orchestrator.tune.lockstep import LockstepScheduler

    cfg = campaign.config
    if cfg.schedule.mode == "fifo" and cfg.adaptive is None:
        return TuneScheduling(max_concurrent=concurrency_limit(campaign))
    scheduler = None
    if cfg.schedule.mode == "lockstep":
        scheduler = LockstepScheduler(
            cfg.schedule.round_steps, {t.name: t.trial.steps for t in campaign.trials},
            {t.name: sum(b.get("GPU", 0) for b in bundles(t.trial)) for t in campaign.trials},
            campaign.directory, cfg.budget, slots=concurrency_limit(campaign),
            expected=None if cfg.adaptive is None else [t.name for t in campaign.trials
                                                          if t.seed < cfg.adaptive.start])
    # seed-major order: a look's seeds of every condition run before the next seed's
    order = [t.name for t in sorted(campaign.trials, key=lambda t: t.seed)]
    searcher = CampaignSearcher(order, {t.name: t.seed for t in campaign.trials},
                                {t.name: t.condition for t in campaign.trials}, campaign.directory,
                                cfg.adaptive, scheduler, interpolate=cfg.report.auc_interpolate)
    return TuneScheduling(scheduler, searcher, None if scheduler is not None else concurrency_limit(campaign))
