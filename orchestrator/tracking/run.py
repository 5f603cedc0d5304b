"""W&B for one trial: one run per trial, grouped by campaign, resumed (same id) when the trial restores.

Logged from inside the trial (not from a Tune callback) so the W&B step is the training step itself. A restored
trial re-runs the steps after its last checkpoint and first replays the checkpoint's rows: steps an earlier attempt
already wrote are not logged again (no step appears twice) and steps it lost are filled in (no gaps). What "already wrote" means is read from where the data really is: the earlier offline
files (a SIGKILLed attempt loses whatever the SDK still buffered), or the server's `starting_step` online.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from orchestrator import storage as store
from orchestrator.config.trial import TrialConfig
from orchestrator.tracking.names import AUC_PREFIX, TRAIN_METRIC, logged_metrics, report_metric
from orchestrator.tracking.offline import last_step, offline_files


def logged_config(cfg: TrialConfig) -> dict[str, Any]:
    """The config a run shows: the full trial config plus condition, seed and swept keys at the top level.

    Never contains secrets: the API key is not part of any config, and the key file's path is dropped too.
    """
    data = cfg.model_dump(mode="json")
    data["wandb"] = {k: v for k, v in data["wandb"].items() if k != "api_key_file"}
    return {**data, **cfg.labels}


def as_table(rows: list[dict]):
    """A `wandb.Table` of rows that share their keys; lists and dicts (turns, planning spans) as JSON text."""
    import json

    import wandb

    columns = list(rows[0])
    return wandb.Table(columns=columns, data=[[json.dumps(r[c]) if isinstance(r[c], list | dict) else r[c]
                                               for c in columns] for r in rows])


def _api_key(cfg: TrialConfig) -> str | None:
    """The node's own key: $WANDB_API_KEY, else `wandb.api_key_file`, else the file $WANDB_API_KEY_FILE names (a
    mounted Secret); None lets wandb use its login (~/.netrc). Never from the job's runtime_env (jobs.py)."""
    if os.environ.get("WANDB_API_KEY"):
        return os.environ["WANDB_API_KEY"]
    if cfg.wandb.api_key_file:
        return Path(store.expand(cfg.wandb.api_key_file)).read_text().strip()
    node_file = Path(os.environ.get("WANDB_API_KEY_FILE") or "/nonexistent")  # an optional Secret may be absent
    return node_file.read_text().strip() if node_file.is_file() else None


class TrialTracker:
    """Wraps a wandb run for one trial; a no-op when `wandb.mode` is disabled."""

    def __init__(self, cfg: TrialConfig):
        self.run = None
        self._offline: tuple[Path, str] | None = None
        self.logged_through = -1
        self._known, self._unknown = logged_metrics(cfg), set()  # orchestrator/tracking/names.py
        self._curves: dict[str, dict[int, float]] = {report_metric(cfg): {}, TRAIN_METRIC: {}}  # -> auc/*
        w = cfg.wandb
        if w.mode == "disabled":
            return
        import wandb

        os.environ["WANDB_MODE"] = w.mode  # offline must be an env var, or wandb still asks for a key
        os.environ.setdefault("WANDB_SILENT", "true")
        key = _api_key(cfg) if w.mode == "online" else None
        root = Path(store.expand(w.dir or "~/orchestrator-wandb")).resolve()
        root.mkdir(parents=True, exist_ok=True)
        self._offline = (root, w.run_id) if w.mode == "offline" and w.run_id else None
        if self._offline:
            self.logged_through = last_step(offline_files(root, w.run_id))
        settings = wandb.Settings(api_key=key) if key else None
        self.run = wandb.init(
            project=w.project, entity=w.entity, group=w.group, job_type=w.job_type, name=cfg.name,
            id=w.run_id, resume="allow" if w.run_id else None, tags=list(w.tags), dir=str(root),
            config=logged_config(cfg), settings=settings, reinit="finish_previous",
        )
        if w.mode == "online":
            self.logged_through = max(self.logged_through, int(self.run.starting_step) - 1)

    def log(self, row: dict[str, Any], tables: dict[str, list[dict]] | None = None) -> None:
        """One step's row; `tables`: name -> rows (the step's samples, orchestrator/trial/artifacts/samples.py), each
        logged as a `wandb.Table` at the step."""
        step = int(row["step"])
        for name, curve in self._curves.items():
            if name in row:
                curve[step] = float(row[name])
        new = set(row) - self._known - self._unknown - {"step"}
        if new and self.run is not None:  # a metric nobody listed: no dashboard panel would show it
            print(f"warning: metrics {sorted(new)} are not in orchestrator/tracking/names.py", flush=True)
            self._unknown |= new
        if step <= self.logged_through:
            return  # logged before the restore; W&B keeps the first record of a step
        self.logged_through = step
        if self.run is not None:
            data = {k: v for k, v in row.items() if k != "step"}
            self.run.log({**data, **{name: as_table(rows) for name, rows in (tables or {}).items() if rows}},
                         step=step)

    def record_hang(self, event: dict) -> None:
        """A missed deadline (orchestrator/trial/actors/calls.py) in the run's summary (`hang/*`: phase, actors, step,
        why), written out at once: the trial fails right after."""
        if self.run is None:
            return
        self.run.summary.update({"hang/phase": event["phase"], "hang/step": event["step"],
                                 "hang/actors": ", ".join(event["frozen"] or event["late"]),
                                 "hang/reason": event["reason"]})
        self.finish()

    def auc_summary(self) -> dict[str, float]:
        """`auc/<metric>`: the normalized AUC over the whole run of the report's metric and the train correct
        rate (the dashboard's swept-value panels plot it); a metric with fewer than two points has none."""
        from orchestrator.stats.paired import normalized_auc

        out = {}
        for name, curve in self._curves.items():
            if len(curve) > 1:
                steps = sorted(curve)
                out[AUC_PREFIX + name] = normalized_auc(steps, [curve[s] for s in steps], (steps[0], steps[-1]))
        return out

    def finish(self, timeout_s: float = 60.0) -> None:
        """Finish the run and make its data durable before the trial function returns.

        The SDK writes through a service process that lives as long as the trial's worker process, and Tune may
        reuse or end that process right after the function returns: `teardown` waits for the service to flush
        and exit, and offline we also check that the file holds the last step."""
        if self.run is None:
            return
        import wandb

        self.run.summary.update(self.auc_summary())
        self.run.finish()
        self.run = None
        wandb.teardown()
        if self._offline:
            deadline = time.monotonic() + timeout_s
            while last_step(offline_files(*self._offline)) < self.logged_through:
                if time.monotonic() > deadline:
                    print(f"warning: W&B offline run {self._offline[1]} lacks steps after "
                          f"{last_step(offline_files(*self._offline))}", flush=True)
                    return
                time.sleep(0.2)
