"""Every actor call of the trial loop waits here, under its phase's deadline (`timeouts:` in the trial config).

Without a deadline a frozen engine core or a learner rank stuck in a collective holds a trial's GPUs and its
campaign slot forever: the actor stays alive, so nothing fails and Tune never retries. Here each call names its
phase (generate, train, sync, checkpoint, eval, health, setup) and the actors it waits on; the deadline is the
phase's fixed value or a multiple of its recent median (`Deadlines`). When it passes, `Calls` asks the late actors'
`health` (which a frozen process does not answer), hands a `Hang` to its `on_hang` (the trial loop records it and
kills its actors: orchestrator/trial/loop.py) and raises `PhaseTimeout`, so Tune retries the trial from its newest
checkpoint. Scoring is no actor call (the task scores in the driver, each grader under its own per-completion
timeout: workers/tasks/), so it has no phase here; a learner's scoring pass is part of its `train` call.
"""

from __future__ import annotations

import statistics
import time
from collections import defaultdict, deque
from collections.abc import Callable
from dataclasses import dataclass, field

import ray

from orchestrator.config.sections import TimeoutsConfig

PHASES = ("setup", "health", "generate", "eval", "train", "sync", "checkpoint")
FIXED_ONLY = ("setup", "health")  # one fixed deadline each: no history to take a median of
PROBE_S = 5.0  # how long a late actor's health call may take before it counts as frozen


class PhaseTimeout(RuntimeError):
    """An actor call passed its phase's deadline; the trial's actors are gone and Tune retries the trial."""

    def __init__(self, hang: Hang):
        self.hang = hang
        super().__init__(hang.message())

    def __reduce__(self):
        # Tune copies a trial's exception (copy.copy) and Ray pickles it: both rebuild it from these arguments,
        # which must be the Hang, not the message the default reduce would pass
        return (PhaseTimeout, (self.hang,))


@dataclass
class Hang:
    """What missed a deadline: the phase, the late actors by name ("rollout[0]", "learner[1]"), which of them did
    not answer a health call either (the frozen ones), the deadline and the step."""

    phase: str
    late: list[str]
    frozen: list[str]
    deadline_s: float
    step: int | None = None
    health: dict = field(default_factory=dict)  # actor name -> its health answer (the ones that answered)
    reason: str = ""  # a health call's answer ("process 123 (VLLM::EngineCore) is stopped"); else the deadline

    def __post_init__(self):
        if not self.reason:
            self.reason = (f"no answer within the {self.deadline_s:g} s deadline; "
                           f"{'frozen (no health answer): ' + ', '.join(self.frozen) if self.frozen else 'busy'}")

    def message(self) -> str:
        at = "" if self.step is None else f" at step {self.step}"
        named = all(f"{n}: " in self.reason for n in self.late)  # the health answers name their actors already
        return f"hang in phase '{self.phase}'{at}: {'' if named else ', '.join(self.late) + ': '}{self.reason}"

    def event(self) -> dict:
        return {"event": "hang", "phase": self.phase, "late": self.late, "frozen": self.frozen,
                "deadline_s": self.deadline_s, "step": self.step, "reason": self.reason, "health": self.health,
                "time": time.time()}


class Deadlines:
    """Per-phase deadlines: the fixed value from `timeouts:` or max(min_s, multiple x median of the last `window`
    durations), `first_s` until `warmup` durations are known."""

    def __init__(self, cfg: TimeoutsConfig):
        self.cfg = cfg
        self.recent: dict[str, deque[float]] = defaultdict(lambda: deque(maxlen=cfg.window))

    def deadline(self, phase: str) -> float:
        if phase not in PHASES:
            raise ValueError(f"unknown phase {phase!r}; phases: {PHASES}")
        fixed = getattr(self.cfg, phase)
        if fixed is not None:
            return float(fixed)
        seen = self.recent[phase]
        if len(seen) < self.cfg.warmup:
            return self.cfg.first_s
        return max(self.cfg.min_s, self.cfg.multiple * statistics.median(seen))

    def record(self, phase: str, seconds: float) -> None:
        if phase not in FIXED_ONLY:
            self.recent[phase].append(seconds)


class Calls:
    """`get` = `ray.get` under a phase's deadline. `on_hang(hang)` runs before `PhaseTimeout` is raised (the trial
    loop's: record, kill the trial's actors). `step` is set by the loop so a hang names it."""

    def __init__(self, deadlines: Deadlines | None = None, on_hang: Callable[[Hang], None] | None = None,
                 clock: Callable[[], float] = time.monotonic):
        self.deadlines = deadlines or Deadlines(TimeoutsConfig())
        self.on_hang, self.clock = on_hang, clock
        self.step: int | None = None

    def get(self, refs, phase: str, actors: list[tuple[str, object]]):
        """The values of `refs` (one ref or a list; `actors[i]` = (name, handle) of the actor computing refs[i],
        or one pair for all of them), or `PhaseTimeout` once the phase's deadline passes."""
        many = isinstance(refs, list)
        refs = refs if many else [refs]
        owners = actors if len(actors) == len(refs) else actors * len(refs)
        limit = self.deadlines.deadline(phase)
        t0 = self.clock()
        ready, late = ray.wait(refs, num_returns=len(refs), timeout=limit)
        if late:
            names = list(dict.fromkeys(name for ref, (name, _) in zip(refs, owners, strict=True) if ref in late))
            self._hang(phase, names, {n: h for n, h in owners}, limit)
        values = ray.get(refs)  # all ready: returns at once, or raises the actor's own error
        self.deadlines.record(phase, self.clock() - t0)
        return values if many else values[0]

    def wait_each(self, refs: list, phase: str, actors: list[tuple[str, object]]):
        """Yield each ref's value as it arrives (the driver holds one at a time), the whole set under one deadline."""
        limit = self.deadlines.deadline(phase)
        t0, owner = self.clock(), dict(zip(refs, actors, strict=True))
        pending = list(refs)
        while pending:
            left = limit - (self.clock() - t0)
            done, pending = ray.wait(pending, num_returns=1, timeout=max(left, 0.0))
            if not done:
                names = list(dict.fromkeys(owner[r][0] for r in pending))
                self._hang(phase, names, dict(owner[r] for r in pending), limit)
            yield ray.get(done[0])
        self.deadlines.record(phase, self.clock() - t0)

    def _hang(self, phase: str, late: list[str], handles: dict[str, object], limit: float) -> None:
        health = probe(handles)
        frozen = [n for n in late if n not in health]
        sick = [f"{n}: {health[n]['reason']}" for n in late if health.get(n, {}).get("reason")]  # e.g. its engine
        hang = Hang(phase, late, frozen, limit, self.step, health, "; ".join(sick))
        if self.on_hang is not None:
            self.on_hang(hang)
        raise PhaseTimeout(hang)


def probe(handles: dict[str, object], timeout: float = PROBE_S) -> dict[str, dict]:
    """Each actor's `health` answer (name -> dict); a frozen process, or one busy without a health thread, is
    missing from the result."""
    refs = {name: h.health.remote() for name, h in handles.items() if hasattr(h, "health")}
    if not refs:
        return {}
    done, _ = ray.wait(list(refs.values()), num_returns=len(refs), timeout=timeout)
    out = {}
    for name, ref in refs.items():
        if ref in done:
            try:
                out[name] = ray.get(ref)
            except Exception as e:  # noqa: BLE001 - a dead actor answers with its error: it is not frozen
                out[name] = {"error": f"{type(e).__name__}: {e}"}
    return out


def check_health(calls: Calls, actors: list[tuple[str, object]]) -> list[dict]:
    """Before a long phase: every actor answers `health` within the health deadline and reports `ok` (a rollout
    worker's engine processes running: workers/rollout/worker.py). Otherwise the same path as a missed deadline."""
    return judge_health(calls, actors, calls.get([h.health.remote() for _, h in actors], "health", actors))


def judge_health(calls: Calls, actors: list[tuple[str, object]], answers: list[dict]) -> list[dict]:
    """`answers` (each actor's `health`, in order) all `ok`, or the same path as a missed deadline."""
    bad = [name for (name, _), a in zip(actors, answers, strict=True) if not a.get("ok", True)]
    if bad:
        by_name = {name: a for (name, _), a in zip(actors, answers, strict=True)}
        hang = Hang("health", bad, [], calls.deadlines.deadline("health"), calls.step, by_name,
                    "; ".join(f"{n}: {by_name[n].get('reason', 'not ok')}" for n in bad))
        if calls.on_hang is not None:
            calls.on_hang(hang)
        raise PhaseTimeout(hang)
    return answers
