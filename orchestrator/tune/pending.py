"""Trials waiting for the autoscaler: a Tune callback that says so on the driver and records since when in
`<campaign>/pending.json`, read back by `status`."""

from __future__ import annotations

import time

from ray.tune import Callback

from orchestrator import storage as store
from orchestrator.storage import PENDING_FILE


# ------------------------------------------------------------------------------------- pending on autoscaling
class PendingOnAutoscaling(Callback):
    """Says which trials wait for resources (nodes the autoscaler has yet to add) and for how long: a line every
    `every_s` seconds on the driver, and `<campaign>/pending.json` ({trial: unix time it became pending}) for
    `status`. Module level: Tune pickles it with the experiment, so a restored campaign keeps it."""

    def __init__(self, directory: str, every_s: float = 60.0):
        self.path = store.join(directory, PENDING_FILE)
        self.every_s = every_s
        self.since: dict[str, float] = {}
        self.last_print = 0.0

    def on_step_begin(self, iteration, trials, **info):
        now = time.time()
        pending = {t.config.get("trial", t.trial_id) for t in trials if t.status == "PENDING"}
        before = dict(self.since)
        self.since = {n: self.since.get(n, now) for n in pending}
        if self.since.keys() != before.keys():
            store.write_text(self.path, _dumps(self.since))
        if self.since and now - self.last_print >= self.every_s:
            self.last_print = now
            n = len(self.since)
            print(f"autoscaling: {n} trial{'s' if n > 1 else ''} pending for up to "
                  f"{_duration(now - min(self.since.values()))}"
                  f" (waiting for resources: {', '.join(sorted(self.since)[:4])}"
                  f"{'...' if len(self.since) > 4 else ''})", flush=True)

    def on_experiment_end(self, trials, **info):
        if self.since:
            self.since = {}
            store.write_text(self.path, _dumps({}))


def _dumps(data: dict) -> str:
    import json

    return json.dumps(data, indent=1, sort_keys=True)


def _duration(seconds: float) -> str:
    s = int(seconds)
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


def pending_since(directory: str) -> dict[str, float]:
    """Trial -> unix time it became pending, as the running driver last wrote it ({} when none)."""
    import json

    text = store.read_text(store.join(directory, PENDING_FILE))
    try:
        return {k: float(v) for k, v in json.loads(text).items()} if text else {}
    except (ValueError, AttributeError):
        return {}


def pending_label(directory: str, trial: str, now: float | None = None) -> str | None:
    """'PENDING 3m05s (waiting for resources / autoscaling)' for a trial the driver reports pending."""
    since = pending_since(directory).get(trial)
    if since is None:
        return None
    return f"PENDING {_duration((now or time.time()) - since)} (waiting for nodes)"
