"""The SLURM allocation a campaign runs in, from the variables SLURM sets in every job (infra/slurm/campaign.sbatch
starts Ray on exactly these nodes, GPUs and CPUs: the cluster can never grow beyond them)."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class Allocation:
    job_id: str
    nodes: int
    gpus: float  # per node
    cpus: float | None  # per node; None where SLURM does not say

    def shape(self) -> dict[str, float]:
        """One node's resources as Ray sees them (the sbatch passes them to `ray start`)."""
        return {"GPU": self.gpus, **({"CPU": self.cpus} if self.cpus is not None else {})}

    def holds(self, bundle: dict[str, float]) -> bool:
        """Whether one node of the allocation holds the bundle (resources SLURM does not count are not judged)."""
        shape = self.shape()
        return all(v <= shape[k] for k, v in bundle.items() if v and k in shape)

    def total(self, key: str) -> float | None:
        per = self.shape().get(key)
        return None if per is None else per * self.nodes

    def describe(self) -> str:
        cpus = "" if self.cpus is None else f", {self.cpus:g} CPUs"
        return f"SLURM job {self.job_id}: {self.nodes} node{'s' * (self.nodes != 1)} x {self.gpus:g} GPUs{cpus}"


def _count(value: str | None) -> float | None:
    """`8`, `a100:8`, `gpu:a100:8`, `64(x2)`, `64,32`: the first node's count (SLURM's per-node lists start with this node's
    kind in a homogeneous allocation)."""
    if not value:
        return None
    m = re.search(r"(\d+)(?:\(x\d+\))?$", value.split(",")[0].strip())
    return float(m.group(1)) if m else None


def allocation(env: Mapping[str, str] | None = None) -> Allocation | None:
    """The allocation this process runs in, or None outside SLURM. GPUs per node: SLURM_GPUS_ON_NODE, else the ids
    in SLURM_JOB_GPUS, else SLURM_GPUS_PER_NODE (0 when none is set: a CPU allocation)."""
    env = os.environ if env is None else env
    job = env.get("SLURM_JOB_ID")
    nodes = _count(env.get("SLURM_JOB_NUM_NODES") or env.get("SLURM_NNODES"))
    if not job or not nodes:
        return None
    gpus = _count(env.get("SLURM_GPUS_ON_NODE"))
    if gpus is None and env.get("SLURM_JOB_GPUS"):
        gpus = float(len([g for g in env["SLURM_JOB_GPUS"].split(",") if g.strip()]))
    if gpus is None:
        gpus = _count(env.get("SLURM_GPUS_PER_NODE")) or 0.0
    cpus = _count(env.get("SLURM_CPUS_ON_NODE") or env.get("SLURM_JOB_CPUS_PER_NODE"))
    return Allocation(job, int(nodes), gpus, cpus)
