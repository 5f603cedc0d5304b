"""Run a campaign while a thread injects faults into it (the fault tests of this folder)."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

from orchestrator.storage import CHECKPOINT_MANIFEST
from orchestrator.tune.launch import run_campaign


def whole_checkpoint_step(trial_dir: Path) -> int:
    """The newest step among the trial's checkpoints whose every file is there at its manifest's size (-1: none).

    A fault meant to land "after step k's checkpoint" must wait for this, not for the manifest: Tune copies a
    checkpoint into the trial's directory file by file, on several threads, so the small manifest and state file
    can be there while the learner's blob is still being written. A kill then tears that checkpoint, the retry
    rightly skips it and restarts from the one before (seen on CI's 2-core machine). A file written front to back
    is whole once it has its full size; sizes only (a stat), since the injectors poll this many times a second."""
    steps = [-1]
    for d in Path(trial_dir).glob("checkpoint_*"):
        try:
            listed = json.loads((d / CHECKPOINT_MANIFEST).read_text())["files"]
            if all((d / f).stat().st_size == meta["bytes"] for f, meta in listed.items()):
                steps.append(json.loads((d / "trial_state.json").read_text())["step"])
        except (OSError, ValueError, KeyError):  # not there yet, or Tune removing an old one meanwhile
            continue
    return max(steps)


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
