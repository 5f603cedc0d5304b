"""The NVIDIA driver check a rollout worker or learner makes when it starts on GPUs.

torch's CUDA wheels need a driver at least as new as their CUDA release (torch 2.14's default wheels: CUDA 13.0,
driver >= 580). On an older driver torch only says "CUDA unavailable" and the actor fails later, deep in vLLM or
PEFT; this fails at once with one line naming what is needed. A no-op when the actor has no GPU, or on a CPU build
of torch (logical GPUs on a CPU machine, as in the tests).
"""

from __future__ import annotations

import re
from pathlib import Path

# the oldest Linux driver each CUDA release runs on (NVIDIA's CUDA toolkit release notes, table 3)
MIN_DRIVER = {(13, 0): 580, (12, 9): 575, (12, 8): 570, (12, 6): 560, (12, 4): 550, (12, 1): 530}
DRIVER_FILE = Path("/proc/driver/nvidia/version")


def min_driver(cuda: str) -> int | None:
    """The minimum driver major for a CUDA version string such as '13.0' (None when unknown)."""
    major, minor = (int(x) for x in cuda.split(".")[:2])
    known = [v for (ma, mi), v in MIN_DRIVER.items() if (ma, mi) <= (major, minor) and ma == major]
    return max(known) if known else None


def driver_version(text: str | None = None) -> str | None:
    """The loaded kernel driver's version ('580.65.06'), from /proc/driver/nvidia/version; None without one."""
    if text is None:
        text = DRIVER_FILE.read_text() if DRIVER_FILE.is_file() else ""
    m = re.search(r"Kernel Module(?: for [\w-]+)?\s+(\d+\.\d+(?:\.\d+)?)", text)
    return m.group(1) if m else None


def runtime_problem(gpus: list, cuda: str | None, available: bool, driver: str | None) -> str | None:
    """Why CUDA cannot run here, as one line, or None. `gpus`: the GPU ids Ray gave the actor; `cuda`: torch's CUDA
    version (None on a CPU build); `available`: torch.cuda.is_available(); `driver`: the kernel driver version."""
    if not gpus or cuda is None or available:
        return None
    need = min_driver(cuda)
    want = f"an NVIDIA driver >= {need}" if need else f"an NVIDIA driver for CUDA {cuda}"
    if driver is None:
        return (f"this actor was given GPUs {gpus} but sees no NVIDIA driver; torch {cuda} needs {want} "
                "(GPU nodes need the driver and the NVIDIA container toolkit / device plugin)")
    return (f"this node's NVIDIA driver is {driver}; torch's CUDA {cuda} needs {want} "
            "(use a node image with a newer driver: docs/deploy.md, infra/docker/gpu.Dockerfile labels)")


def check_gpu_runtime() -> None:
    """Raise RuntimeError (one line) when the actor holds GPUs that CUDA cannot use."""
    import ray
    import torch

    gpus = ray.get_gpu_ids() if ray.is_initialized() else []
    if not gpus or torch.version.cuda is None:
        return
    problem = runtime_problem(gpus, torch.version.cuda, torch.cuda.is_available(), driver_version())
    if problem:
        raise RuntimeError(problem)
