"""Run a campaign while a thread injects faults into it (the fault tests of this folder)."""

from __future__ import annotations

import threading
import time

from orchestrator.tune.launch import run_campaign


def run_with_injector(campaign, inject) -> tuple[int, list, list, float]:
    """`run_campaign(campaign)` while `inject(campaign, stop, done, errors)` runs on a thread (None: no faults);
    returns (the campaign's result, `done`, `errors`, seconds). The thread is stopped when the campaign ends."""
    stop, done, errors = threading.Event(), [], []
    injector = threading.Thread(target=inject, args=(campaign, stop, done, errors), daemon=True) if inject else None
    if injector is not None:
        injector.start()
    t0 = time.monotonic()
    try:
        result = run_campaign(campaign)
    finally:
        stop.set()
        if injector is not None:
            injector.join(timeout=10)
    return result, done, errors, time.monotonic() - t0
