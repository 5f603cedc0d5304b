"""The campaign driver's watch over its shared pools: a thread that probes every pool actor (engines, learner) under
deadlines (`resources.shared_base.supervisor`), on the actors' control threads (actors.py), and kills with
`ray.kill(actor, no_restart=False)` the one that misses them, so that Ray restarts it in its bundle
(lifecycle.py). Missed means: no answer to a probe within `answer_s` (a stopped or frozen process); an engine child
process stopped or dead; an engine whose engine thread finished no step or call for `engine_stall_s` while it had
work (workers/rollout/shared.py:liveness); a learner call running longer than `learner_call_s`. Each kill, each
death the supervisor did not cause, and each actor back after either, is an event handed to `record` (the
campaign's events.jsonl: orchestrator/tune/launch.py; `status` prints them). A restarting actor is not judged
until it answers again, except that a probe sent `answer_s` or more after it went down that goes unanswered for
`answer_s` is its new process frozen (a restarting actor refuses calls at once), killed again.

`judge` is the decision, pure over a `Watch` (what was seen of one actor) and what its probe gave; `Supervisor`
the thread around it."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import ray
from ray.exceptions import RayActorError

from orchestrator.config.sections import SupervisorConfig
from orchestrator.pool.probe import ProbeAnswer


@dataclass(frozen=True)
class NoAnswer:
    """The probe sent at `sent` did not answer within `answer_s`."""

    sent: float = 0.0


@dataclass(frozen=True)
class Down:
    """The probe failed because the actor died (Ray restarts it, or has given up on it)."""

    error: str


Seen = ProbeAnswer | NoAnswer | Down


@dataclass
class Watch:
    """What the supervisor knows of one pool actor."""

    pool: str
    name: str  # "engine0", "learner"
    kind: str  # "engine" | "learner"
    progress: int | None = None  # the engine's progress counter at `since`
    busy: bool = False  # the engine had work pending at `since`
    since: float = 0.0  # when the engine's progress last moved, or its work began
    down_since: float | None = None  # killed or seen dead, not answering since


@dataclass(frozen=True)
class Verdict:
    kill: bool = False
    event: dict | None = None  # an events.jsonl line (without its time)


def judge(w: Watch, seen: Seen, now: float, cfg: SupervisorConfig) -> Verdict:
    """What to do about actor `w` after its probe gave `seen` at `now`; updates `w`."""
    head = {"pool": w.pool, "actor": w.name}
    if w.down_since is not None:  # restarting: only its coming back counts, or its new process frozen
        if isinstance(seen, NoAnswer) and seen.sent - w.down_since >= cfg.answer_s:
            # a restarting actor refuses calls at once (Ray's ActorUnavailableError); one that holds a probe sent
            # well after it went down is its new process, alive and not answering (stopped right after it came back)
            w.down_since = now
            return Verdict(kill=True, event={"event": "pool_actor_killed", **head, "reason": (
                f"no answer to a probe within {cfg.answer_s:g} s after its restart (a stopped or frozen process)")})
        if not isinstance(seen, ProbeAnswer):
            return Verdict()
        down_s, w.down_since = now - w.down_since, None
        w.progress, w.busy, w.since = seen.progress, bool(seen.pending), now  # the new process's baseline
        return Verdict(event={"event": "pool_actor_back", **head, "down_s": round(down_s, 3), "pid": seen.pid})
    if isinstance(seen, Down):
        w.down_since = now
        return Verdict(event={"event": "pool_actor_died", **head, "error": seen.error})
    reason = _missed(w, seen, now, cfg)
    if reason is None:
        return Verdict()
    w.down_since = now
    return Verdict(kill=True, event={"event": "pool_actor_killed", **head, "reason": reason})


def _missed(w: Watch, seen: ProbeAnswer | NoAnswer, now: float, cfg: SupervisorConfig) -> str | None:
    """Which deadline `w` missed, or None."""
    if isinstance(seen, NoAnswer):
        return f"no answer to a probe within {cfg.answer_s:g} s (a stopped or frozen process)"
    if not seen.ok:
        return seen.reason or "a child process is stopped or dead"
    if w.kind == "learner":
        if seen.call_s > cfg.learner_call_s:
            return f"its call {seen.call} has run {seen.call_s:.0f} s, over {cfg.learner_call_s:g} s"
        return None
    if not (seen.pending and w.busy) or seen.progress != w.progress:
        # idle, its work just begun, or moving: the stall clock starts again
        w.progress, w.since, w.busy = seen.progress, now, bool(seen.pending)
        return None
    if now - w.since > cfg.engine_stall_s:
        return (f"its engine made no progress for {now - w.since:.0f} s with {seen.pending} request(s) or call(s) "
                f"pending (over {cfg.engine_stall_s:g} s)")
    return None


@dataclass
class Watched:
    watch: Watch
    actor: object
    cfg: SupervisorConfig
    probe: object = None  # the probe in flight (a restarting actor's waits until it is back)
    sent: float = 0.0


class Supervisor:
    """Probes `actors` (Watch, Ray actor handle, its pool's settings) every `every_s` (the smallest pool's) on a
    daemon thread until `stop`; `record(event)` gets every event with its time."""

    def __init__(self, actors: list[tuple[Watch, object, SupervisorConfig]], record: Callable[[dict], None],
                 clock: Callable[[], float] = time.monotonic):
        self.items = [Watched(w, a, c) for w, a, c in actors]
        self.record, self.clock = record, clock
        self.every = min((c.every_s for _, _, c in actors), default=10.0)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="pool-supervisor", daemon=True)

    def start(self) -> Supervisor:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=60)

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            try:
                self.tick()
            except Exception as e:  # noqa: BLE001 - the watch goes on; a campaign is not ended by its supervisor
                print(f"pool supervisor: {type(e).__name__}: {e}", flush=True)

    def tick(self) -> None:
        """One round: a probe to every actor without one in flight, every probe waited on up to its deadline."""
        if not self.items:
            return
        now = self.clock()
        for it in self.items:
            if it.probe is None:
                it.probe, it.sent = it.actor.probe.remote(), now
        wait = max(min(it.sent + it.cfg.answer_s for it in self.items) - now, 0.0)
        ray.wait([it.probe for it in self.items], num_returns=len(self.items), timeout=wait)
        for it in self.items:
            self._judge(it, self._seen(it))

    def _seen(self, it: Watched) -> Seen | None:
        """What `it`'s probe gave; None: still waiting within its deadline."""
        done, _ = ray.wait([it.probe], timeout=0)
        if not done:
            if self.clock() - it.sent < it.cfg.answer_s:
                return None
            it.probe = None  # given up on: the next round sends a fresh one (to the new process after a kill)
            return NoAnswer(it.sent)
        ref, it.probe = it.probe, None
        try:
            return ray.get(ref)
        except RayActorError as e:
            return Down(f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")

    def _judge(self, it: Watched, seen: Seen | None) -> None:
        if seen is None:
            return
        verdict = judge(it.watch, seen, self.clock(), it.cfg)
        if verdict.kill:
            ray.kill(it.actor, no_restart=False)
        if verdict.event is not None:
            self.record({**verdict.event, "time": time.time()})
            print(f"pool supervisor: {_line(verdict.event)}", flush=True)


def _line(event: dict) -> str:
    what = {"pool_actor_killed": f"killed ({event.get('reason')}); Ray restarts it",
            "pool_actor_died": f"died ({event.get('error')}); Ray restarts it",
            "pool_actor_back": f"back after {event.get('down_s')} s (pid {event.get('pid')})"}[event["event"]]
    return f"pool {event['pool']} {event['actor']}: {what}"
