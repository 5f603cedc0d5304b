"""A trial's placement-group bundles: [driver, rollout worker x k, learner rank x N]. Pure: the trial loop,
the campaign's cluster check and the plan all read them without importing Ray actors or torch."""

from __future__ import annotations

from orchestrator.config.trial import TrialConfig


def bundle_roles(cfg: TrialConfig) -> list[str]:
    """What runs in each bundle of `bundles(cfg)`: driver, rollout worker x k, learner rank x N."""
    return ["driver"] + ["rollout worker"] * cfg.rollout.num_workers + ["learner rank"] * cfg.resources.learner_ranks


def bundles(cfg: TrialConfig) -> list[dict[str, float]]:
    """Placement-group bundles: [driver, worker x k, learner rank x N]."""
    r = cfg.resources

    # a GPU model is a resource Ray gives each node (accelerator_type:H100 = 1): a sliver of it pins the bundle
    model = {f"accelerator_type:{r.accelerator_type}": 0.001} if r.accelerator_type else {}

    def b(cpu: float, gpu: float) -> dict[str, float]:
        return {"CPU": cpu, **({"GPU": gpu, **model} if gpu else {})}

    return [b(r.driver_cpus, 0)] + [b(r.worker_cpus, r.worker_gpus)] * cfg.rollout.num_workers + [
        b(r.learner_cpus, r.learner_gpus)] * r.learner_ranks
