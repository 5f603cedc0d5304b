"""Start-up cost of a process that imports torch, vLLM, transformers and PEFT: Python's cyclic garbage collector.

Those imports create ~1M long-lived objects, and at the default thresholds the collector walks all of them again
each time the heap has grown by a quarter: ~4 of a rollout worker's ~20 CPU-seconds of imports, then vLLM's own
`gc.collect()` calls while it builds the engine walk them twice more (~2 s). Measured on the 2-core CPU machine,
one engine start: 29 -> 20 CPU-s (benchmarks/engine_start.py times a whole start).

So the collector runs rarely while a process imports (`begin_imports`, called when the `orchestrator` or `workers`
package is first imported), and once an actor or driver has its imports it freezes what it imported and goes back
to the default thresholds (`imports_done`): frozen objects are never scanned again but are still freed by
reference counting, so only cycles among them would outlive their use, and import-time objects live as long as
the process anyway. vLLM freezes its heap after its engine build the same way (`vllm/utils/gc_utils.py`)."""

from __future__ import annotations

import atexit
import gc

_IMPORTING = (100_000, 50, 100)  # young generation every 100k allocations; a full collection practically never
_default: tuple[int, int, int] | None = None  # the thresholds before begin_imports, restored by imports_done
# At exit the frozen objects go back to the collector, so the interpreter's shutdown frees them as usual (left
# frozen, extension modules that count their objects at shutdown report them as leaked: triton's nanobind).
atexit.register(gc.unfreeze)


def begin_imports() -> None:
    """Collect rarely until `imports_done` (a no-op once the process has called it, or a second time)."""
    global _default
    if _default is None and gc.get_threshold() != _IMPORTING:
        _default = gc.get_threshold()
        gc.set_threshold(*_IMPORTING)


def imports_done() -> None:
    """Freeze every object alive now (the imported modules, classes, functions) and restore the default
    thresholds. Called again later (after a model build) it freezes what is alive then; always cheap."""
    gc.freeze()
    if _default is not None and gc.get_threshold() == _IMPORTING:
        gc.set_threshold(*_default)
