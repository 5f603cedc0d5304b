"""A rollout worker's health answer on real processes: a stopped child (SIGSTOP, as a frozen vLLM engine core) is
reported by pid and state, a running one is ok."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from workers.rollout.worker import process_health


def _state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]


def test_a_stopped_child_process_makes_the_worker_unhealthy():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        first = process_health()
        assert first["pid"] == os.getpid() and first["ok"], first
        assert child.pid in [c["pid"] for c in first["children"]]
        os.kill(child.pid, signal.SIGSTOP)
        while _state(child.pid) != "T":  # the kernel stops it asynchronously
            time.sleep(0.01)
        sick = process_health()
        assert not sick["ok"] and f"process {child.pid}" in sick["reason"] and "stopped" in sick["reason"], sick
        os.kill(child.pid, signal.SIGCONT)
        while _state(child.pid) == "T":
            time.sleep(0.01)
        assert process_health()["ok"]
    finally:
        child.kill()
        child.wait()
