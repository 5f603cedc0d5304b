"""The learner's per-token uncertainty before / after the token stages, one file per trained step (the report's
mechanistic histogram): trials/<trial>/uncertainty/step_<s>.npz."""

from __future__ import annotations

import io

import numpy as np

from orchestrator import storage as store
from orchestrator.storage import UNCERTAINTY_DIR


def write_uncertainty(out_dir: str, step: int, samples: dict[str, list[float]]) -> None:
    """Per-token uncertainty before/after the token stages (the report's mechanistic histogram)."""
    buf = io.BytesIO()
    np.savez_compressed(buf, **{k: np.asarray(v, dtype=np.float32) for k, v in samples.items()})
    store.write_bytes(store.join(out_dir, UNCERTAINTY_DIR, f"step_{step}.npz"), buf.getvalue())
