"""The process-global random streams a learner draws from (torch CPU and CUDA, Python's `random`, NumPy's
legacy global generator), as checkpoint-safe values: tensors and numbers only, so a weights-only load reads them.
A resumed learner continues every stream where the checkpointed one stood, whichever of them a plugin uses."""

from __future__ import annotations

import random

import numpy as np
import torch


def capture_streams() -> dict:
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    return {"torch_rng": torch.random.get_rng_state(),
            "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
            "python_rng": random.getstate(),
            "numpy_rng": {"kind": kind, "keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos),
                          "has_gauss": int(has_gauss), "gauss": float(gauss)}}


def install_streams(state: dict) -> None:
    """Restore what `capture_streams` saved. A checkpoint from before a stream was saved leaves that stream as
    the learner seeded it; CUDA states are restored only onto as many devices as were saved."""
    torch.random.set_rng_state(state["torch_rng"])
    random.setstate(state["python_rng"])
    cuda = state.get("cuda_rng")
    if cuda is not None and torch.cuda.is_available() and len(cuda) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(cuda)
    n = state.get("numpy_rng")
    if n is not None:
        np.random.set_state((n["kind"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["gauss"]))
