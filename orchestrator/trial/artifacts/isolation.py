"""A pool trial's isolation probe (workers/rollout/isolation.py), run once after its first step on its step-0
samples and written to trials/<trial>/isolation.json for the report (orchestrator/report/sections/isolation.py):
per engine, whether the slot's teacher-forced log-probs came out the same alone and in a batch mixed with the
other slots' adapters, and the largest difference."""

from __future__ import annotations

import json
import time

from orchestrator import storage as store
from orchestrator.storage import ISOLATION_FILE
from orchestrator.trial.actors.ports import EnginesPort
from orchestrator.trial.collect.rollouts import Rollouts

PROBE_SEQUENCES = 8  # the first sequence of each of the first groups: prompt + completion, a few dozen tokens each


def probe_sequences(roll: Rollouts, limit: int = PROBE_SEQUENCES) -> list[list[int]]:
    """Prompt + completion token ids of the first sequence of each group, at most `limit`."""
    return [list(p[0]) + list(r[0]) for p, r in zip(roll.prompt_ids, roll.response_ids, strict=True)
            if p and r][:limit]


def record_isolation(engines: EnginesPort, roll: Rollouts, out_dir: str) -> dict[str, object] | None:
    """Probe every engine of the trial's pool slot on `roll`'s sequences and write the record (None and nothing
    written for a trial's own engines, which no other trial shares)."""
    probes = [p.record() for p in engines.isolation(probe_sequences(roll))]
    if not probes:
        return None
    record = {"engines": probes, "identical": all(p["identical"] for p in probes),
              "max_abs_diff": max(p["max_abs_diff"] for p in probes), "tokens": sum(p["tokens"] for p in probes),
              # as each engine process reports itself (workers/rollout/isolation.py:engine_facts)
              "batch_invariant": all(p["batch_invariant"] for p in probes), "gpu": any(p["gpu"] for p in probes),
              "time": time.time()}
    store.write_text(store.join(out_dir, ISOLATION_FILE), json.dumps(record, indent=1))
    return record
