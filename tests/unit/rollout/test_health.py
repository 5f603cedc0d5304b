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
    # A fresh parent stands in for the worker: the pytest process itself may hold zombies of earlier tests' engines.
    parent = subprocess.Popen([sys.executable, "-c", _PARENT], stdout=subprocess.PIPE, text=True)
    try:
        child = int(parent.stdout.readline())
        first = process_health(parent.pid)
        assert first["pid"] == parent.pid and first["ok"], first
        assert child in [c["pid"] for c in first["children"]]
        os.kill(child, signal.SIGSTOP)
        while _state(child) != "T":  # the kernel stops it asynchronously
            time.sleep(0.01)
        sick = process_health(parent.pid)
        assert not sick["ok"] and f"process {child}" in sick["reason"] and "stopped" in sick["reason"], sick
        os.kill(child, signal.SIGCONT)
        while _state(child) == "T":
            time.sleep(0.01)
        assert process_health(parent.pid)["ok"]
    finally:
        parent.kill()
        parent.wait()


def test_the_default_is_this_process():
    assert process_health()["pid"] == os.getpid()


_PARENT = """
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
print(child.pid, flush=True)
try:
    time.sleep(60)
finally:
    child.kill()
"""
