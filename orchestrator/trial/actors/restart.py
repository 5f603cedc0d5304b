"""A shared pool's learner restarted under a trial (orchestrator/pool/: Ray restarts it in place, every slot empty):
how the trial's client tells that from an error of its own, and its bounded wait for the learner to be back.

What the client sees (measured on Ray 2.60): a call in flight when the process died raises `ActorUnavailableError`;
a call made while Ray restarts the actor waits and runs on the new process, which no longer holds the slot
(`SlotNotOpen`); once the pool's restart budget (`max_restarts`) is spent, every call raises `ActorDiedError`."""

from __future__ import annotations

import time
from collections.abc import Callable

import ray
from ray.exceptions import ActorDiedError, GetTimeoutError, RayActorError, RayTaskError

from workers.fence import SlotNotOpen

POLL_S = 0.5  # between two asks while the actor is unreachable


def learner_lost(error: BaseException) -> bool:
    """Whether `error` says the learner's process died (or was restarted) under the call, rather than that the
    call itself failed."""
    if isinstance(error, RayTaskError):
        return isinstance(error.cause, SlotNotOpen)
    return isinstance(error, RayActorError | SlotNotOpen)


def first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}"


def await_learner(ping: Callable[[float], object], timeout_s: float, what: str,
                  clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep) -> float:
    """Wait until `ping(seconds)` (the learner's `ready`, waited on for at most `seconds`) answers; returns the
    seconds waited. A learner dead for good (its restart budget spent: `ActorDiedError`) or not back within
    `timeout_s` raises a RuntimeError of one line naming `what`."""
    start = clock()
    while True:
        left = timeout_s - (clock() - start)
        if left <= 0:
            raise RuntimeError(f"{what}: the learner was not back from its restart in time (waited "
                               f"{clock() - start:.0f} s, the trial's setup deadline)")
        try:
            ping(left)
            return clock() - start
        except ActorDiedError as e:
            raise RuntimeError(f"{what}: the learner is dead for good, Ray will not restart it again (the pool's "
                               f"restart budget is spent): {first_line(e)}") from None
        except (RayActorError, GetTimeoutError):  # unavailable while Ray restarts it: ask again
            sleep(POLL_S)


def ready_within(learner, seconds: float) -> object:
    """The learner actor's `ready` answer, waited on for at most `seconds`."""
    return ray.get(learner.ready.remote(), timeout=seconds)
