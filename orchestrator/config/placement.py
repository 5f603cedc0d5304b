"""A trial's placement-group bundles. Separate: [driver, rollout worker x k, learner rank x N]; colocated:
[driver, (learner rank + rollout engine) x N], each GPU bundle shared by one rank and one engine. Pure: the trial
loop, the campaign's cluster check and the plan all read them without importing Ray actors or torch."""

from __future__ import annotations

from dataclasses import dataclass

from orchestrator.config.trial import TrialConfig

# Ray GPU fraction of a colocated bundle each of its two actors asks: both land on the bundle's one GPU (Ray hands
# both the same id); what bounds the engine's memory is rollout.engine.gpu_memory_utilization, not this number
COLOCATED_SHARE = 0.5


@dataclass(frozen=True)
class ActorSlot:
    """Where one actor of the trial goes: its bundle index and the CPUs / GPUs it asks inside that bundle."""

    bundle: int
    cpus: float
    gpus: float


def colocated(cfg: TrialConfig) -> bool:
    return cfg.resources.placement == "colocated"


def engines(cfg: TrialConfig) -> int:
    """Rollout engines the trial starts: none for a replay without held-out evaluation (it samples nothing:
    orchestrator/trial/artifacts/replay.py), else one per rollout worker (colocated: one beside each learner rank)."""
    if cfg.replay is not None and not cfg.eval.every:
        return 0
    return cfg.resources.learner_ranks if colocated(cfg) else cfg.rollout.num_workers


def bundle_roles(cfg: TrialConfig) -> list[str]:
    """What runs in each bundle of `bundles(cfg)`."""
    n = cfg.resources.learner_ranks
    if colocated(cfg):
        return ["driver"] + ["learner rank + rollout engine"] * n
    return ["driver"] + ["rollout worker"] * engines(cfg) + ["learner rank"] * n


def _bundle(cfg: TrialConfig, cpu: float, gpu: float) -> dict[str, float]:
    """One bundle of `cpu` CPUs and `gpu` GPUs (pinned to the trial's GPU model, if it names one)."""
    r = cfg.resources
    # a GPU model is a resource Ray gives each node (accelerator_type:H100 = 1): a sliver of it pins the bundle
    model = {f"accelerator_type:{r.accelerator_type}": 0.001} if r.accelerator_type else {}
    return {"CPU": cpu, **({"GPU": gpu, **model} if gpu else {})}


def bundles(cfg: TrialConfig) -> list[dict[str, float]]:
    """Placement-group bundles, in the order of `bundle_roles`."""
    r = cfg.resources

    def b(cpu: float, gpu: float) -> dict[str, float]:
        return _bundle(cfg, cpu, gpu)

    if colocated(cfg):
        return [b(r.driver_cpus, 0)] + [b(r.worker_cpus + r.learner_cpus, r.learner_gpus)] * r.learner_ranks
    return [b(r.driver_cpus, 0)] + [b(r.worker_cpus, r.worker_gpus)] * engines(cfg) + [
        b(r.learner_cpus, r.learner_gpus)] * r.learner_ranks


def tune_bundles(cfg: TrialConfig) -> list[dict[str, float]]:
    """What the trial asks Tune for: its placement group's bundles, or only its driver's when its engines and
    learner are the campaign's shared pool (`resources.shared_base`, orchestrator/pool/), which reserved them once."""
    return bundles(cfg)[:1] if cfg.resources.shared_base is not None else bundles(cfg)


def shape_bundles(cfg: TrialConfig, n_engines: int, n_learners: int) -> list[dict[str, float]]:
    """A shared-base pool's placement group (orchestrator/config/pool_key.py:pool_bundles): `n_engines` rollout
    worker bundles then `n_learners` learners' bundles, each a separate trial's (its learner_ranks bundles; no
    driver's: the trials ask Tune for theirs)."""
    r = cfg.resources
    return ([_bundle(cfg, r.worker_cpus, r.worker_gpus)] * n_engines
            + [_bundle(cfg, r.learner_cpus, r.learner_gpus)] * (n_learners * r.learner_ranks))


def worker_slots(cfg: TrialConfig) -> list[ActorSlot]:
    """Rollout worker i's slot: its own bundle (separate) or learner rank i's bundle (colocated)."""
    r = cfg.resources
    if colocated(cfg):
        return [ActorSlot(1 + i, r.worker_cpus, r.learner_gpus * COLOCATED_SHARE) for i in range(engines(cfg))]
    return [ActorSlot(1 + i, r.worker_cpus, r.worker_gpus) for i in range(engines(cfg))]


def learner_slots(cfg: TrialConfig) -> list[ActorSlot]:
    """Learner rank i's slot: after the workers' bundles (separate) or shared with engine i (colocated)."""
    r = cfg.resources
    if colocated(cfg):
        return [ActorSlot(1 + i, r.learner_cpus, r.learner_gpus * (1 - COLOCATED_SHARE))
                for i in range(r.learner_ranks)]
    k = engines(cfg)
    return [ActorSlot(1 + k + i, r.learner_cpus, r.learner_gpus) for i in range(r.learner_ranks)]


def trial_gpus(cfg: TrialConfig) -> float:
    """GPUs the trial's placement group holds."""
    return sum(b.get("GPU", 0.0) for b in bundles(cfg))


def with_placement(cfg: TrialConfig, placement: str) -> TrialConfig | None:
    """`cfg` under the other placement, for `plan --compare-placement`: colocated puts one engine beside each
    learner rank on its GPU; separate gives each of those engines a GPU of its own. None when the trial has no
    learner GPU to share (a CPU trial) or the other placement refuses it (one_step_off under colocated)."""
    if cfg.resources.placement == placement:
        return cfg
    data = cfg.model_dump(mode="json")
    r = data["resources"]
    if placement == "colocated":
        if cfg.resources.learner_gpus <= 0:
            return None
        r.update(placement="colocated", learner_gpus=1)
        data["rollout"]["num_workers"] = cfg.resources.learner_ranks
    else:
        r.update(placement="separate", worker_gpus=1)
    try:
        return TrialConfig.model_validate(data)
    except ValueError:
        return None
