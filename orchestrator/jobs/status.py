"""`python -m orchestrator status FILE`: each trial's state, step and latest key metrics, from storage alone.

State comes from Tune's experiment state (PENDING / RUNNING / TERMINATED / ERROR) when the experiment exists;
steps and metrics from each trial's metrics.jsonl, so it also works while the campaign runs elsewhere.
"""

from __future__ import annotations

import glob
import json
from pathlib import Path

from orchestrator import storage as store
from orchestrator.campaign.schema import Campaign

KEY_METRICS = ("train/correct_rate", "eval/pass@1", "credit/sepa_lambda")


def tune_states(directory: str) -> dict[str, str]:
    """Trial name -> Tune status, read from the newest experiment_state file (local storage only; {} when there is
    none or it is torn: a driver killed while Tune wrote it, which the next `run` sets aside)."""
    if store.is_uri(directory):
        return {}
    files = sorted(glob.glob(str(Path(directory) / "experiment_state-*.json")))
    if not files:
        return {}
    try:
        snapshot = json.loads(Path(files[-1]).read_text())
    except ValueError:
        return {}
    states = {}
    for entry in snapshot.get("trial_data", []):
        state = json.loads(entry[0]) if isinstance(entry, list | tuple) else entry
        name = (state.get("config") or {}).get("trial") or state.get("custom_trial_name")
        if name:
            states[name] = state.get("status", "?")
    return states


def driver_alive(directory: str) -> bool | None:
    """Whether a driver holds the campaign's lock (None: cannot tell, e.g. URI storage)."""
    import fcntl

    if store.is_uri(directory):
        return None
    path = Path(directory) / store.LOCK_FILE
    if not path.exists():
        return False
    with path.open("a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(f, fcntl.LOCK_UN)
        return False


def hang_label(hangs: list[dict], starts: list[dict]) -> str:
    """A trial that missed a deadline (orchestrator/trial/actors/calls.py): retrying (no start since its last hang) or
    resumed, with the phase and the actors of the last hang."""
    last = hangs[-1]
    who = ", ".join(last.get("frozen") or last.get("late") or [])
    retrying = not starts or starts[-1].get("time", 0) < last.get("time", 0)
    return (f"({'retrying' if retrying else 'resumed'} after a hang in {last.get('phase')}"
            f"{f' of {who}' if who else ''} at step {last.get('step')}; {len(hangs)} so far)")


def trial_rows(campaign: Campaign) -> list[dict]:
    from orchestrator.tune.pending import pending_label

    states = tune_states(campaign.directory)
    alive = driver_alive(campaign.directory)
    if alive is False:  # Tune's last snapshot says RUNNING, but nobody runs it
        states = {k: ("INTERRUPTED" if v == "RUNNING" else v) for k, v in states.items()}
    out = []
    for t in campaign.trials:
        tdir = store.trial_dir(campaign.directory, t.name)
        rows = store.read_jsonl(store.join(tdir, store.METRICS_FILE))
        events = store.read_jsonl(store.join(tdir, store.EVENTS_FILE))
        starts = [e for e in events if e.get("event") == "start"]
        hangs = [e for e in events if e.get("event") == "hang"]
        steps = t.config["steps"]
        last = rows[-1] if rows else {}
        state = states.get(t.name) or ("NOT STARTED" if not starts else "UNKNOWN")
        if state in ("PENDING", "NOT STARTED", "UNKNOWN") and alive is not False:  # the driver: waiting how long
            state = pending_label(campaign.directory, t.name) or state
        if hangs and state not in ("TERMINATED", "ERROR"):
            state = f"{state} {hang_label(hangs, starts)}"
        out.append({"trial": t.name, "state": state, "step": f"{len(rows)}/{steps}", "starts": len(starts),
                    **{k: last[k] for k in KEY_METRICS if k in last}})
    return out


def render(campaign: Campaign) -> str:
    rows = trial_rows(campaign)
    cols = ["trial", "state", "step", "starts", *[k for k in KEY_METRICS if any(k in r for r in rows)]]

    def cell(v) -> str:
        return f"{v:.3f}" if isinstance(v, float) else str(v)

    table = [cols] + [[cell(r.get(c, "-")) for c in cols] for r in rows]
    widths = [max(len(row[i]) for row in table) for i in range(len(cols))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in table]
    lines.insert(1, "  ".join("-" * w for w in widths))
    done = sum(r["state"] == "TERMINATED" for r in rows)
    waiting = sum(r["state"].startswith("PENDING ") for r in rows)
    alive = driver_alive(campaign.directory)
    driver = {True: "driver running", False: "no driver running (run the same command to resume)", None: ""}[alive]
    head = (f"campaign {campaign.config.name}: {done}/{len(rows)} trials finished ({campaign.directory})"
            + (f"; {driver}" if driver else "")
            + (f"; {waiting} pending on autoscaling (waiting for nodes to be added)" if waiting else ""))
    from orchestrator.storage import campaign_events

    extra = (schedule_lines(campaign, finished=done == len(rows)) + pool_lines(campaign_events(campaign.directory))
             + plan_vs_actual(campaign))
    return head + "".join(f"\n{x}" for x in extra) + "\n" + "\n".join(lines)


def schedule_lines(campaign: Campaign, finished: bool = False) -> list[str]:
    """Lockstep round, budget and adaptive-seed looks, from the campaign's events.jsonl."""
    from orchestrator.storage import campaign_events

    cfg, out = campaign.config, []
    events = campaign_events(campaign.directory)
    if cfg.schedule.mode == "lockstep":
        k = cfg.schedule.round_steps
        total = max(-(-t.trial.steps // k) for t in campaign.trials)
        rounds = [e for e in events if e.get("event") == "round"]
        done = rounds[-1]["round"] if rounds else 0
        spent = f"; {rounds[-1]['gpu_hours']:.3g} GPU-hours so far" if rounds else ""
        where = (f"all {total} rounds finished" if finished else
                 f"round {done} of {total} finished by every unfinished trial")
        out.append(f"lockstep: {where} ({k} steps a round){spent}")
    stop = next((e for e in events if e.get("event") == "budget_stop"), None)
    if stop:
        out.append(f"budget: ended after step {stop['step']} (round {stop['round']}): {stop['reason']}")
    for e in (e for e in events if e.get("event") == "look"):
        out.append(f"adaptive seeds: look {e['look']} at {e['seeds']} seeds: {e['contrast']} {e['measure']} "
                   f"delta {e['delta']:+.4g} [{e['lo']:.4g}, {e['hi']:.4g}] p {e['p']:.3g} (level "
                   f"{e['level']:.3g}): {e['decision']}")
    return out


POOL_EVENTS = ("pool_actor_killed", "pool_actor_died", "pool_actor_back")  # orchestrator/pool/supervisor.py


def pool_lines(events: list[dict]) -> list[str]:
    """One line per shared pool actor the supervisor killed or saw die: how often, and the last time's why."""
    by_actor: dict[tuple[str, str], list[dict]] = {}
    for e in events:
        if e.get("event") in POOL_EVENTS:
            by_actor.setdefault((e.get("pool", "?"), e.get("actor", "?")), []).append(e)
    out = []
    for (pool, actor), seen in by_actor.items():
        killed = [e for e in seen if e["event"] == "pool_actor_killed"]
        died = [e for e in seen if e["event"] == "pool_actor_died"]
        faults = [e for e in seen if e["event"] != "pool_actor_back"]
        if not faults:
            continue
        last = faults[-1]
        back = seen[-1]["event"] == "pool_actor_back"
        why = last.get("reason") or last.get("error", "")
        out.append(f"shared pool {pool} {actor}: killed by the supervisor {len(killed)}x, died {len(died)}x; last: "
                   f"{why} ({'back' if back else 'restarting'})")
    return out


def plan_vs_actual(campaign: Campaign) -> list[str]:
    """The plan's trial duration (cost model and modelled time outside the steps, orchestrator/preflight/plan.py)
    beside each finished trial's measured wall (events.jsonl, first start to end), as medians; the campaign's wall
    from its first trial start to its last end. Empty until a trial has finished."""
    import math
    import statistics

    from orchestrator.preflight.pilot import trial_wall
    from orchestrator.preflight.plan import Cluster, make_plan

    events = {t.name: store.read_jsonl(store.join(store.trial_dir(campaign.directory, t.name), store.EVENTS_FILE))
              for t in campaign.trials}
    walls = {name: w for name, ev in events.items() if (w := trial_wall(ev)) is not None}
    if not walls:
        return []
    plan = make_plan(campaign, cluster=Cluster(0.0, math.inf, "status"))
    planned = [t.hours * 3600 for t in plan.trials if t.trial.name in walls and math.isfinite(t.hours)]
    starts = [e["time"] for ev in events.values() for e in ev if e.get("event") == "start" and "time" in e]
    ends = [e["time"] for ev in events.values() for e in ev if e.get("event") == "end" and "time" in e]
    said = f"{statistics.median(planned) / 60:.1f} min" if planned else "unknown (model size not in its name)"
    return [f"plan vs actual: {len(walls)} finished trial(s) ran {statistics.median(walls.values()) / 60:.1f} min "
            f"each (median, events.jsonl); the plan said {said} (cost model; `plan --pilot` this campaign for "
            f"measured times); campaign wall so far {(max(ends) - min(starts)) / 60:.1f} min"]
