"""What the cluster can grow to, and the pre-launch checks that depend on it.

A fresh autoscaling cluster (Ray cluster launcher, KubeRay) starts with no GPU workers: the autoscaler adds them
when a placement group asks. So a trial is checked against what the cluster *can* hold: the live nodes plus the
autoscaler's node types up to their `max_workers`. The autoscaler's config is read, first found wins, from
- Ray's cluster config in the GCS (`ray._private.state.state.get_cluster_config()`, set where the platform reports
  it),
- KubeRay: the RayCluster resource, through Ray's own KubeRay config reader (head pod, `RAY_CLUSTER_NAME`),
- the launcher YAML the head's autoscaler runs with (`--autoscaling-config` of the monitor process on this node,
  or `~/ray_bootstrap_config.yaml`, where the cluster launcher puts it on the head),
and when none is found the cluster is taken as it is now (no autoscaler). Inside a SLURM allocation
(orchestrator/preflight/slurm.py) the cluster is the allocation: its nodes, each with the job's GPUs and CPUs.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from orchestrator import storage as store
from orchestrator.config.errors import UserError
from orchestrator.preflight.slurm import Allocation, allocation

BOOTSTRAP = Path("~/ray_bootstrap_config.yaml")  # where `ray up` puts the autoscaler's config on the head


@dataclass(frozen=True)
class NodeType:
    name: str
    resources: dict[str, float]
    max_workers: int  # how many the autoscaler may add (0 for the head type)


@dataclass(frozen=True)
class Capacity:
    """The live nodes' total resources and, with an autoscaler, the node types it can add."""

    live: list[dict[str, float]]
    types: list[NodeType] = field(default_factory=list)
    max_workers: int = 0  # the autoscaler's cap on workers in all
    source: str = "live"  # where the node types came from
    allocation: Allocation | None = None  # the SLURM job's nodes: the most this cluster can ever be

    @property
    def autoscaling(self) -> bool:
        return self.max_workers > 0 and any(t.max_workers > 0 for t in self.types)

    def max_nodes(self) -> int:
        if self.allocation:
            return self.allocation.nodes
        return len(self.live) + (self.max_workers if self.autoscaling else 0)

    def can_hold(self, bundle: dict[str, float]) -> bool:
        """Whether one node, live or one the autoscaler can add (in an allocation: one of its nodes), holds the
        bundle."""
        if self.allocation:
            return self.allocation.holds(bundle)
        shapes = self.live + [t.resources for t in self.types if t.max_workers > 0]
        return any(_fits(bundle, shape) for shape in shapes)

    def total(self, key: str) -> float:
        """The most of `key` the cluster can ever have at once (live nodes + every addable worker)."""
        if self.allocation and self.allocation.total(key) is not None:
            return self.allocation.total(key)
        live = sum(n.get(key, 0.0) for n in self.live)
        if not self.autoscaling:
            return live
        per_node = sorted((t.resources.get(key, 0.0) for t in self.types for _ in range(t.max_workers)),
                          reverse=True)
        return live + sum(per_node[: self.max_workers])

    def describe(self) -> str:
        if self.allocation:
            return self.allocation.describe()
        if not self.autoscaling:
            return "no autoscaler"
        return ", ".join(f"{t.name} ({_fmt(t.resources)}) x {t.max_workers}" for t in self.types if t.max_workers)


def _fits(bundle: dict[str, float], shape: dict[str, float]) -> bool:
    return all(shape.get(k, 0.0) >= v for k, v in bundle.items() if v)


def _fmt(resources: dict[str, float]) -> str:
    return " ".join(f"{k}:{v:g}" for k, v in sorted(resources.items()) if k in ("CPU", "GPU") or v)


# ------------------------------------------------------------------------------------- the autoscaler's config
def types_from_launcher(config: dict) -> tuple[list[NodeType], int]:
    """Node types and the global worker cap of a cluster-launcher / autoscaler config (the head type adds none)."""
    head = config.get("head_node_type")
    types = [NodeType(name, {k: float(v) for k, v in (spec.get("resources") or {}).items()},
                      0 if name == head else int(spec.get("max_workers", config.get("max_workers", 0))))
             for name, spec in (config.get("available_node_types") or {}).items()]
    return types, int(config.get("max_workers", sum(t.max_workers for t in types)))


def _from_gcs() -> tuple[list[NodeType], int] | None:
    import ray._private.state as state

    config = state.state.get_cluster_config()
    if config is None or not config.node_group_configs:
        return None
    types = [NodeType(g.name, {k: float(v) for k, v in g.resources.items()},
                      10**6 if g.max_count == -1 else int(g.max_count)) for g in config.node_group_configs]
    return types, sum(t.max_workers for t in types)


def _from_kuberay() -> tuple[list[NodeType], int] | None:
    name = os.environ.get("RAY_CLUSTER_NAME")  # KubeRay sets it in every Ray container
    ns_file = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
    if not name or not ns_file.is_file():
        return None
    from ray.autoscaler._private.kuberay.autoscaling_config import AutoscalingConfigProducer

    return types_from_launcher(AutoscalingConfigProducer(name, ns_file.read_text().strip())())


def _monitor_config(gcs_address: str) -> Path | None:
    """The `--autoscaling-config` of the autoscaler monitor of this cluster, when it runs on this node."""
    import psutil

    port = gcs_address.rsplit(":", 1)[-1]
    for p in psutil.process_iter(["cmdline"]):
        cmd = p.info.get("cmdline") or []
        if not any(c.endswith("monitor.py") for c in cmd):
            continue
        if not any(c.startswith("--gcs-address=") and c.rsplit(":", 1)[-1] == port for c in cmd):
            continue
        for c in cmd:
            if c.startswith("--autoscaling-config="):
                return Path(c.split("=", 1)[1]).expanduser()
    return None


def _from_launcher_file(gcs_address: str) -> tuple[list[NodeType], int, str] | None:
    import yaml

    path = _monitor_config(gcs_address) or BOOTSTRAP.expanduser()
    if not path.is_file():
        return None
    config = yaml.safe_load(path.read_text()) or {}
    return (*types_from_launcher(config), str(path))


def capacity() -> Capacity:
    """The connected cluster's capacity (ray.init() done)."""
    import ray

    live = [{k: float(v) for k, v in n["Resources"].items()} for n in ray.nodes() if n.get("Alive")]
    slurm = allocation()
    if slurm:
        return Capacity(live, source="SLURM's job variables", allocation=slurm)
    gcs = ray.get_runtime_context().gcs_address
    for source, read in (("Ray's cluster config", _from_gcs), ("the RayCluster resource", _from_kuberay)):
        try:
            found = read()
        except Exception as exc:  # a platform that does not expose it, RBAC, ...: try the next source
            print(f"note: could not read the autoscaler's node types from {source} ({type(exc).__name__})",
                  flush=True)
            found = None
        if found:
            return Capacity(live, found[0], found[1], source)
    found = _from_launcher_file(gcs)
    if found:
        return Capacity(live, found[0], found[1], found[2])
    return Capacity(live)


# --------------------------------------------------------------------------------------------------- checks
def check_trials(campaign, cap: Capacity) -> list[str]:
    """Exit 2 for a trial no node type can hold; returns the trials that need nodes not up yet."""
    from orchestrator.config.placement import bundle_roles, bundles

    src = campaign.source
    waiting = []
    for t in campaign.trials:
        b = bundles(t.trial)
        for what, bundle in zip(bundle_roles(t.trial), b, strict=True):
            if not cap.can_hold(bundle) and cap.allocation:
                raise UserError(f"{src}: resources: trial {t.name}'s {what} bundle ({_fmt(bundle)}) fits on no node "
                                f"of the allocation ({cap.describe()}); lower worker_gpus/learner_gpus or the CPUs, "
                                "or ask SLURM for more per node (--gpus-per-node, --cpus-per-task)")
            if not cap.can_hold(bundle):
                adds = f"node types it can add: {cap.describe()}" if cap.autoscaling else "no autoscaler"
                raise UserError(f"{src}: resources: trial {t.name}'s {what} bundle ({_fmt(bundle)}) fits on no node "
                                f"of the cluster (nodes up: {'; '.join(_fmt(n) for n in cap.live)}; {adds}); lower "
                                "worker_gpus/learner_gpus or the CPUs, or add a node type that holds it")
        for key in ("GPU", "CPU"):
            need = sum(x.get(key, 0.0) for x in b)
            if need > cap.total(key) and cap.allocation:
                raise UserError(f"{src}: resources: trial {t.name} asks for {need:g} {key}s; the allocation "
                                f"({cap.describe()}) has {cap.total(key):g}; ask SLURM for more (--nodes, "
                                "--gpus-per-node) or lower the trial's resources")
            if need > cap.total(key):
                raise UserError(f"{src}: resources: trial {t.name} asks for {need:g} {key}s; the cluster can have "
                                f"at most {cap.total(key):g} ({cap.describe()})")
        if any(not any(_fits(x, n) for n in cap.live) for x in b) or \
                any(sum(x.get(k, 0.0) for x in b) > sum(n.get(k, 0.0) for n in cap.live) for k in ("GPU", "CPU")):
            waiting.append(t.name)
    return waiting


def check_pools(campaign, cap: Capacity) -> None:
    """Exit 2 for a shared-base campaign whose pools (one per base model, each holding its engines' and learners'
    bundles for the whole campaign: orchestrator/config/pool_key.py:pool_bundles) the cluster cannot hold at once."""
    from orchestrator.config.pool_key import pool_bundles, pool_groups

    pools = pool_groups(t.trial for t in campaign.trials)
    if not pools:
        return
    for key in ("GPU", "CPU"):
        need = sum(sum(b.get(key, 0.0) for b in pool_bundles(group[0])) for group in pools.values())
        if need > cap.total(key):
            raise UserError(f"{campaign.source}: resources.shared_base: {len(pools)} pools (one per base model: "
                            f"{', '.join(pools)}) hold {need:g} {key}s at once; the cluster can have at most "
                            f"{cap.total(key):g} ({cap.describe()}); run fewer models per campaign or lower "
                            "worker_gpus/learner_gpus")


def check_storage(campaign, cap: Capacity) -> None:
    """A node-local path is refused whenever the cluster has, or can add, more than one node."""
    if cap.max_nodes() > 1 and not store.is_uri(campaign.storage) and not campaign.config.storage_shared:
        now = f"a {len(cap.live)}-node cluster" + (f" that can grow to {cap.max_nodes()} nodes" if cap.autoscaling
                                                   else "")
        if cap.allocation:
            now = f"the allocation {cap.describe()}"
        raise UserError(f"{campaign.source}: storage: {campaign.storage} is a node-local path on {now}; a trial "
                        "retried on another node would not find its checkpoint. Use a URI (s3://, gs://) or a "
                        "shared filesystem path and set storage_shared: true")


def check_campaign(campaign) -> Capacity:
    """The pre-launch checks against the cluster; prints which trials wait for the autoscaler."""
    cap = capacity()
    waiting = check_trials(campaign, cap)
    check_pools(campaign, cap)
    check_storage(campaign, cap)
    if waiting and cap.allocation:
        print(f"slurm: {len(waiting)} of {len(campaign.trials)} trials need nodes of {cap.describe()} that have not "
              f"joined Ray ({len(cap.live)} have); they stay PENDING until they do (a node's `ray start` failed? "
              "see the job's log)", flush=True)
    elif waiting:
        print(f"autoscaling: {len(waiting)} of {len(campaign.trials)} trials need nodes that are not up yet; they "
              f"stay PENDING until the autoscaler adds them ({cap.describe()}; from {cap.source})", flush=True)
    return cap










