"""The pool's rollout engine: ONE vLLM engine serving many trials' LoRA adapters, one adapter per slot
(`resources.shared_base`, issue 48). Same sampling as the trial's own worker (worker.py, sampling.py); what
differs is that calls from several trial drivers arrive at once and share the running batch (continuous batching, below).

- Slots: slot s holds at most one adapter, loaded by `load_policy(s, update)` under a fresh LoRA int id (ids are
  never reused: vLLM serves a cached old adapter for a reused id); its previous adapter is then evicted and its
  files deleted (workers/sync/adapter.py: one `AdapterSync` per slot, ids from one counter). Other slots are
  untouched, and an adapter that did not change is never re-read (the CPU LoRA cache has room for every slot's
  adapter plus the one being loaded). A slot with no adapter (never loaded, or `drop`ped) samples the base model
  and reports `adapter_version` None. A trial's client loads its initial adapter (B = 0) right after `drop`
  (orchestrator/trial/actors/shared.py:connect): at 4 slots a bare-base request batched with other slots'
  adapters was sampled with another adapter's weights, so a pool never serves one. Base-model requests
  (`SamplingRequest.base`: the starting policy, `rollout.difficulty_samples`) go under a zero adapter of their
  own (`settings.start_policy`), made from the first adapter a slot loads. A failed load breaks only its slot:
  that slot refuses to sample until a later load succeeds (no fallback to the old adapter, as worker.py).
- Fencing: a slot may be named by a `SlotLease` (workers/fence.py; the pool's calls always are): `drop` opens the
  slot under it, and a call under an older lease than the slot's opener is refused on the engine thread, in the
  slot's order, so a late call of the slot's previous holder never lands after the new holder's `drop`.
- Continuous batching: every engine call (build, step, add/remove adapter) runs on one thread of this object's
  own. `generate` queues its call and waits; the engine thread adds each waiting call's prompts to the running
  engine as requests (each under its slot's `LoRARequest` and its own `SamplingParams`, seeded per prompt, so its
  sampling does not depend on who shares the batch) and steps the engine (`LLMEngine.step`, one forward pass over
  every running request) until they finish, admitting calls that arrive meanwhile between two steps, then hands
  each caller exactly its own outputs. So a trial's rollout joins the batch already running instead of waiting for
  it to end, and a slot's adapter load runs between two steps while other slots decode.
- Order: each slot's calls run in arrival order: a load or drop of slot s waits until s's requests in flight have
  finished, and s's later calls wait behind it; other slots are not held up. A call of no slot (`hold`, the debug
  views) waits for every call queued before it to start; the isolation probe (isolation.py) also for the engine
  to drain (admission.py).
- `SharedRolloutActor`: the Ray actor, threaded (max_concurrency = slots + 2: every slot's call, health, a spare).
"""

from __future__ import annotations

import contextlib
import itertools
import shutil
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ray

from workers.fence import Fence, SlotLease, SlotNotOpen, StaleLease, slot_index
from workers.rollout.admission import admissible
from workers.rollout.isolation import IsolationProbe, probe
from workers.rollout.output import Generation
from workers.rollout.sampling import SamplingRequest, completions, sampling_params
from workers.rollout.worker import RolloutWorkerSettings, open_engine, process_health
from workers.sync.adapter import AdapterSync, shared_engine_args, zeroed
from workers.sync.policy import PolicyUpdate


@dataclass
class _EngineSlot:
    sync: AdapterSync
    version: int | None = None
    broken: str | None = None  # a failed load: this slot refuses to sample until a load succeeds


@dataclass
class _Call:
    """One queued engine call: a generate (`prompts` set) joins the running batch; anything else (`run`) runs alone
    on the engine thread between two steps. `slot` None: a call of no slot (it waits for all before it)."""

    future: Future = field(default_factory=Future)
    run: Callable[[], Any] | None = None
    slot: int | None = None
    drain: bool = False  # a call of no slot that runs only when no request is in flight (the isolation probe)
    lease: int | SlotLease | None = None  # how the caller named the slot (a lease is fenced: workers/fence.py)
    prompts: list = field(default_factory=list)
    params: list = field(default_factory=list)
    request: SamplingRequest | None = None
    action_ids: list[int] | None = None
    # while in flight: one RequestOutput per prompt as each finishes, and when the call was admitted
    outputs: list = field(default_factory=list)
    left: int = 0
    version: int | None = None
    started: float = 0.0


class SharedRolloutWorker:
    """One vllm.LLM with `slots` LoRA slots, driven from one thread; see the module docstring."""

    def __init__(self, model: str, slots: int, settings: RolloutWorkerSettings | None = None):
        if int(slots) < 1:
            raise ValueError(f"slots must be >= 1, got {slots}")
        s = settings or RolloutWorkerSettings()
        if not s.enable_lora or s.sleep_mode:
            raise ValueError("a shared engine serves LoRA adapters and never sleeps: "
                             "needs enable_lora=True and sleep_mode=False")
        self.slots = int(slots)
        self._root = Path(tempfile.mkdtemp(prefix="shared_rollout_"))
        ids = itertools.count(1)  # one counter for the whole engine: an id is never reused, across slots too
        self._slots = [_EngineSlot(AdapterSync(self._root / f"slot{i}", s.max_lora_rank, ids)) for i in range(self.slots)]
        # base-model requests (the starting policy: rollout.difficulty_samples) under a zero adapter of their own
        self._start = AdapterSync(self._root / "start", s.max_lora_rank, ids) if s.start_policy else None
        self.fence = Fence(self.slots)
        self._queue: deque[_Call] = deque()
        self._cond = threading.Condition()
        self._stats = {"admissions": 0, "served_calls": 0, "max_in_flight": 0, "engine_steps": 0,
                       "step_s": 0.0, "adapter_s": 0.0, "runs": 0}
        self._in_run = False  # the engine thread is inside a call of its own (an adapter load, a drop)
        self._born = time.perf_counter()
        self._running: dict[str, tuple[_Call, int]] = {}  # request id -> (its call, prompt index): in flight
        self._request_ids = itertools.count()
        self._llm = None
        self._gate = threading.Event()  # `hold` / `release`
        self.engine_kwargs: dict = {}
        self.in_process = False
        self._thread = threading.Thread(target=self._serve, name="shared-engine", daemon=True)
        self._thread.start()
        self._call(lambda: self._open(model, s))  # built on the engine thread: vLLM-CPU pins its threads there
        self._born = time.perf_counter()  # up_s counts from the engine built

    def _open(self, model: str, s: RolloutWorkerSettings) -> None:
        self._llm, self.engine_kwargs, self.in_process = open_engine(
            model, s, shared_engine_args(s.max_lora_rank, self.slots + (self._start is not None)))

    # ------------------------------------------------------------------------------------------------- calls
    def generate(self, slot: int | SlotLease, prompt_ids: list[list[int]], request: SamplingRequest) -> Generation:
        """`RolloutWorker.generate` under `slot`'s adapter (base model when the slot holds none): n `Completion`s
        per prompt, prompt i seeded `request.seed + i`, batched with whatever other slots' calls wait with it."""
        i = self._check(slot)
        if request.base and self._start is None:  # no trial of the pool sets rollout.difficulty_samples
            raise ValueError("this pool's engine samples its slots' adapters only (started without start_policy)")
        prompts, params, action_ids = sampling_params(prompt_ids, request)
        call = _Call(slot=i, lease=slot, prompts=prompts, params=params, request=request, action_ids=action_ids)
        return self._submit(call)

    def load_policy(self, slot: int | SlotLease, update: PolicyUpdate) -> int:
        """`update` (PEFT adapter files) as `slot`'s adapter under a fresh LoRA id, loaded eagerly (a bad adapter
        raises here and breaks only this slot); the slot's previous adapter is evicted and its files deleted.
        Returns update.version."""
        i = self._check(slot)
        if update.kind != AdapterSync.kind:
            raise ValueError(f"a shared engine takes adapter updates only, got kind {update.kind!r}")
        return self._call(lambda: self._load(slot, update), i)

    def drop(self, slot: int | SlotLease) -> None:
        """Evict `slot`'s adapter and delete its files (a finished trial's slot): the slot samples the base model
        again until its next `load_policy`. Other slots are untouched. Under a lease: the slot is opened under it
        (older leases refused from then on)."""
        i = self._check(slot)
        self._call(lambda: self._drop(slot), i)

    def isolation(self, slot: int | SlotLease, sequences: list[list[int]]) -> IsolationProbe:
        """`slot`'s teacher-forced log-probs of `sequences` alone vs in a batch mixed with every other adapter the
        engine holds (isolation.py), once no request is in flight."""
        i, cap = self._check(slot), self._llm.llm_engine.model_config.max_model_len - 1  # + the greedy token
        seqs = [list(s)[:cap] for s in sequences if len(s) >= 2]

        def run() -> IsolationProbe:
            self.fence.require(slot)
            own = self._slots[i].sync.lora_request()
            others = [sl.sync.lora_request() for j, sl in enumerate(self._slots) if j != i]
            others += [self._start.lora_request()] if self._start is not None else []
            return probe(self._llm.llm_engine, seqs, own, [lo for lo in others if lo is not None],
                         on_step=lambda: self._count("engine_steps", 1))
        return self._submit(_Call(run=run, drain=True))

    def adapter_version(self, slot: int | SlotLease) -> int | None:
        """The version `slot` samples with (None: the base model, or nothing after a failed load)."""
        return self._slots[self._check(slot)].version

    def broken(self, slot: int | SlotLease) -> str | None:
        """Why `slot` refuses to sample (a failed adapter load), or None."""
        return self._slots[self._check(slot)].broken

    def health(self) -> dict:
        """`RolloutWorker.health` (this process and the engine's), answered without waiting for the engine."""
        return process_health()

    def ready(self) -> bool:
        return self._llm is not None

    def settings(self) -> dict:
        """The `vllm.LLM` keyword arguments the engine was built with (model path and processors left out)."""
        return dict(self.engine_kwargs)

    def stats(self) -> dict:
        """admissions (calls admitted together count once), served_calls, max_in_flight (generate calls in the engine
        at once), engine_steps (forward passes) and step_s (their seconds: busy decoding), adapter_s, up_s."""
        with self._cond:
            return {**self._stats, "up_s": time.perf_counter() - self._born}

    def liveness(self) -> dict:
        """For the supervisor (orchestrator/pool/supervisor.py), without waiting for the engine thread: `progress`
        (engine steps + engine-thread calls finished) must advance while `pending` (requests in flight, calls queued,
        a call running) is above 0; `requests`: the requests in flight."""
        with self._cond:
            return {"progress": self._stats["engine_steps"] + self._stats["runs"], "requests": len(self._running),
                    "pending": len(self._running) + len(self._queue) + int(self._in_run)}

    def lora_state(self) -> dict:
        """Debug view: the adapter ids vLLM holds, and per slot its id and directories on disk."""
        return self._call(lambda: {
            "lora_ids": sorted(self._llm.llm_engine.list_loras()),
            "slots": [{"version": sl.version, "lora_id": getattr(sl.sync.lora_request(), "lora_int_id", None),
                       "dirs": sorted(p.name for p in sl.sync.root.iterdir()) if sl.sync.root.exists() else []}
                      for sl in self._slots]})

    def hold(self) -> None:
        """Block the engine thread until `release`: calls made meanwhile are admitted together (tests, benchmarks)."""
        self._gate = gate = threading.Event()
        started = threading.Event()
        call = _Call(run=lambda: (started.set(), gate.wait()))
        with self._cond:
            self._queue.append(call)
            self._cond.notify()
        started.wait()

    def release(self) -> None:
        self._gate.set()

    def waiting(self) -> int:  # calls queued for the engine thread
        with self._cond:
            return len(self._queue)

    def close(self) -> None:
        """Stop the engine thread after the queued calls and delete every slot's files."""
        with self._cond:
            self._queue.append(None)
            self._cond.notify()
        self._thread.join(timeout=60)
        shutil.rmtree(self._root, ignore_errors=True)

    def __del__(self):
        if hasattr(self, "_root"):  # a failed __init__ made none
            shutil.rmtree(self._root, ignore_errors=True)

    # ------------------------------------------------------------------------------------- the engine thread
    def _check(self, slot: int | SlotLease) -> int:
        i = slot_index(slot)
        if not (isinstance(i, int) and 0 <= i < self.slots):
            raise ValueError(f"slot must be an int in [0, {self.slots}), got {slot!r}")
        return i

    def _call(self, fn: Callable[[], Any], slot: int | None = None) -> Any:
        return self._submit(_Call(run=fn, slot=slot))

    def _submit(self, call: _Call) -> Any:
        if not self._thread.is_alive():
            raise RuntimeError("the shared engine's thread has stopped")
        with self._cond:
            self._queue.append(call)
            self._cond.notify()
        return call.future.result()

    def _serve(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._running:
                    self._cond.wait()
                admitted, stop = self._admissible()
            if stop:
                return
            runs = [c for c in admitted if c.run is not None]
            for c in runs:
                self._in_run = True
                try:
                    c.future.set_result(c.run())
                except BaseException as e:  # the caller raises it; the engine thread goes on
                    c.future.set_exception(e)
                finally:
                    with self._cond:
                        self._in_run = False
                        self._stats["runs"] += 1
            self._admit([c for c in admitted if c.run is None])
            if self._running:
                self._step()

    def _admissible(self) -> tuple[list[_Call], bool]:
        """The calls that may start now (admission.py), taken from the queue; called under the lock."""
        taken, self._queue, stop = admissible(self._queue, {c.slot for c, _ in self._running.values()},
                                              bool(self._running))
        return taken, stop

    def _admit(self, calls: list[_Call]) -> None:
        """Add each generate call's prompts to the engine under its slot's adapter (a broken slot's call refused)."""
        fresh = 0
        for c in calls:
            sl = self._slots[c.slot]
            try:
                self.fence.require(c.lease)  # here, in the slot's order: after any drop queued before it
            except (StaleLease, SlotNotOpen) as e:
                c.future.set_exception(e)
                continue
            base = c.request.base  # under the starting policy's zero adapter (None: not made yet, refused)
            lora, added = self._start.lora_request() if base else sl.sync.lora_request(), []
            if sl.broken is not None or (base and lora is None):
                c.future.set_exception(RuntimeError(f"slot {c.slot} unusable since a failed adapter load: {sl.broken}"
                                                    if sl.broken is not None else "the starting policy is not loaded "
                                                    "yet (made from the first adapter a slot loads)"))
                continue
            c.outputs, c.left, c.version, c.started = [None] * len(c.prompts), len(c.prompts), \
                None if base else sl.version, time.perf_counter()
            try:
                for i, (prompt, params) in enumerate(zip(c.prompts, c.params, strict=True)):
                    rid = f"r{next(self._request_ids)}"
                    self._llm.llm_engine.add_request(rid, prompt, params, lora_request=lora)
                    self._running[rid] = (c, i)
                    added.append(rid)
            except BaseException as e:  # a request the engine refuses: this call fails, the others run on
                self._abort(added)
                c.future.set_exception(e)
                continue
            if not c.prompts:
                self._finish(c)
            fresh += 1
        if fresh:
            with self._cond:
                self._stats["admissions"] += 1
                in_flight = len({id(c) for c, _ in self._running.values()})
                self._stats["max_in_flight"] = max(self._stats["max_in_flight"], in_flight)

    def _abort(self, request_ids: list[str]) -> None:
        for rid in request_ids:
            self._running.pop(rid, None)
        if request_ids:
            try:
                self._llm.llm_engine.abort_request(request_ids)
            except Exception:  # noqa: BLE001 - a request the engine never took has nothing to abort
                pass

    def _step(self) -> None:
        """One engine step; each call whose last request finished gets its Generation. A failed step fails every
        call in flight (the engine's state is unknown after it)."""
        t0 = time.perf_counter()
        try:
            outs = self._llm.llm_engine.step()
        except BaseException as e:
            calls = {id(c): c for c, _ in self._running.values()}
            self._abort(list(self._running))
            for c in calls.values():
                c.future.set_exception(e)
            return
        with self._cond:
            self._stats["engine_steps"] += 1
            self._stats["step_s"] += time.perf_counter() - t0
        for out in outs:
            if not out.finished or out.request_id not in self._running:
                continue
            c, i = self._running.pop(out.request_id)
            c.outputs[i], c.left = out, c.left - 1
            if c.left == 0:
                self._finish(c)

    def _finish(self, c: _Call) -> None:
        try:
            groups, num_tokens = completions(c.outputs, c.request.stop_token_ids, c.action_ids)
            c.future.set_result(Generation(c.version, groups, num_tokens, time.perf_counter() - c.started))
        except BaseException as e:
            c.future.set_exception(e)
        with self._cond:
            self._stats["served_calls"] += 1

    def _load(self, lease: int | SlotLease, update: PolicyUpdate) -> int:
        self.fence.require(lease)
        slot = slot_index(lease)
        sl, t0 = self._slots[slot], time.perf_counter()
        try:
            sl.sync.apply(self._llm, update)
        except BaseException as e:
            sl.broken = f"load_adapter(slot={slot}, version={update.version}) failed: {type(e).__name__}: {e}"
            sl.version = None
            raise
        finally:
            self._count("adapter_s", time.perf_counter() - t0)
        sl.version, sl.broken = int(update.version), None
        if self._start is not None and self._start.lora_request() is None:  # also after an engine restart
            with contextlib.suppress(Exception):  # base requests then fail with their own message
                self._start.apply(self._llm, zeroed(update))
        return sl.version

    def _drop(self, lease: int | SlotLease) -> None:
        self.fence.open(lease)
        sl, t0 = self._slots[slot_index(lease)], time.perf_counter()
        sl.sync.drop(self._llm)
        sl.version, sl.broken = None, None
        self._count("adapter_s", time.perf_counter() - t0)

    def _count(self, key: str, seconds: float) -> None:
        with self._cond:
            self._stats[key] += seconds


SharedRolloutActor = ray.remote(SharedRolloutWorker)


def shared_rollout_actor(slots: int, **options):
    """`SharedRolloutActor` threaded for `slots` slots: every slot's generate, health and one spare reach the
    object at once (the engine thread batches them). `.remote(model, slots, settings)` starts it."""
    return SharedRolloutActor.options(max_concurrency=int(slots) + 2, **options)
