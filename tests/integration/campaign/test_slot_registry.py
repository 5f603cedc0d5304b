"""The pool's slot registry survives its own process's death (orchestrator/pool/slots.py): SIGKILLed, Ray restarts
it and it reads its table back, so a held slot stays held and the next acquire gets a new epoch, never an old one."""

from __future__ import annotations

import os
import signal
import time

import pytest

from orchestrator.pool.slots import SlotRegistry

pytestmark = pytest.mark.integration


def test_a_sigkilled_registry_comes_back_with_its_table(ray_local, tmp_path):
    registry = SlotRegistry.options(max_restarts=1, max_task_retries=1).remote(2, 1, str(tmp_path / "slots.json"))
    a = ray_local.get(registry.acquire.remote("a", "d1"))
    ray_local.get(registry.acquire.remote("b", "d2"))
    assert ray_local.get(registry.release.remote("b")) == 1
    pid = ray_local.get(registry.__ray_call__.remote(lambda self: os.getpid()))
    os.kill(pid, signal.SIGKILL)
    deadline = time.time() + 60
    while True:  # the call is retried on the restarted actor (max_task_retries)
        try:
            held = ray_local.get(registry.held.remote(), timeout=30)
            break
        except Exception:  # noqa: BLE001 - the actor between death and restart
            assert time.time() < deadline, "the registry did not come back"
            time.sleep(0.5)
    assert ray_local.get(registry.__ray_call__.remote(lambda self: os.getpid())) != pid
    assert held == {"a": a.slot}
    c = ray_local.get(registry.acquire.remote("c", "d3"))
    assert (c.slot, c.epoch) == (1, 2)  # after b's epoch 1 (an empty table would hand out 1 again)
    again = ray_local.get(registry.acquire.remote("a", "d4"))
    assert (again.slot, again.epoch) == (a.slot, a.epoch + 1)
    ray_local.kill(registry)
