"""A pilot campaign's measurements for `plan` (orchestrator/preflight/plan.py) and `status`: each trial's metrics
rows, Tune's per-step wall times and its whole wall from events.jsonl, and the medians the plan takes from them."""

from __future__ import annotations

import json
import os
import statistics

from orchestrator import storage as store
from orchestrator.campaign.expand import load_campaign
from orchestrator.config.errors import UserError


def campaign_dir(pilot: str) -> str:
    if pilot.endswith((".yaml", ".yml")):
        return load_campaign(pilot).directory
    return pilot if store.is_uri(pilot) else os.path.abspath(os.path.expanduser(pilot))


def pilot_runs(pilot: str) -> list[dict]:
    """The pilot's trials: name, condition, seed, metrics rows and Tune's per-step wall times."""
    directory = campaign_dir(pilot)
    text = store.read_text(store.join(directory, store.CAMPAIGN_FILE))
    if text is None:
        raise UserError(f"--pilot: {directory} is not a campaign directory that ran (no campaign.json)")
    runs = []
    for t in json.loads(text)["trials"]:
        rows = store.read_jsonl(store.join(store.trial_dir(directory, t["name"]), store.METRICS_FILE))
        tune_rows = store.read_jsonl(store.join(directory, t["name"], "result.json"))
        events = store.read_jsonl(store.join(store.trial_dir(directory, t["name"]), store.EVENTS_FILE))
        runs.append({"name": t["name"], "condition": t["condition"], "seed": t["seed"], "rows": rows,
                     "wall": [r["time_this_iter_s"] for r in tune_rows[1:] if "time_this_iter_s" in r],
                     "trial_s": trial_wall(events)})
    return runs


def trial_wall(events: list[dict]) -> float | None:
    """A finished trial's wall seconds from its events.jsonl: its first start to its end (retries and resumes
    included); None when it has not ended."""
    starts = [e["time"] for e in events if e.get("event") == "start" and "time" in e]
    ends = [e["time"] for e in events if e.get("event") == "end" and "time" in e]
    return max(ends) - min(starts) if starts and ends else None


def pilot_overhead_s(runs: list[dict], condition: str, step_s: float) -> float | None:
    """Median of the pilot trials' wall outside their steps (measured wall - steps x the step time), the
    condition's own trials first, else all; None without finished trials."""
    def outside(r):
        return r["trial_s"] - len(r["rows"]) * step_s

    mine = [outside(r) for r in runs if r["condition"] == condition and r["trial_s"] is not None]
    every = [outside(r) for r in runs if r["trial_s"] is not None]
    return max(statistics.median(mine or every), 0.0) if (mine or every) else None


def pilot_step_s(runs: list[dict], condition: str) -> float | None:
    """Median step wall time (steps after each trial's first) of the condition's pilot trials, else of all."""
    mine = [w for r in runs if r["condition"] == condition for w in r["wall"]]
    every = [w for r in runs for w in r["wall"]]
    if not mine and not every:  # no Tune result files: the sum of the logged time/* parts
        parts = [sum(v for k, v in row.items() if k.startswith("time/") and k != "time/prefetch_s")
                 for r in runs for row in r["rows"][1:]]
        return statistics.median(parts) if parts else None
    return statistics.median(mine or every)
