"""`learner.offload_between_steps`: between training steps the learner's optimizer state (and, under full fine-tuning,
its weights) waits in host memory, so a colocated engine awake on the same GPU has that memory (verl's
`offload_fsdp_optimizer` / `load_fsdp_optimizer` and OpenRLHF's `--deepspeed_enable_sleep` do the same).

`offload()` runs at the end of a training step, `reload()` at the start of the next; the gradients are dropped
(set to None: the next update zeroes them first anyway). The copies are `.to(host, non_blocking=True)`: from CUDA
that lands in pinned host memory (torch pins the destination of a non-blocking device-to-host copy), and the
copy back from pinned memory is asynchronous too; one synchronize ends each direction. Every tensor goes back to
the device it came from (AdamW's `step` counter stays on the CPU where it lives). On a CPU learner every copy is
a no-op (`.to("cpu")` returns the tensor itself), yet the same code runs and reports its bytes and seconds.

Whatever reads or writes the state between steps (the policy export under full mode, checkpoints, restores) asks
for it with `resident(...)`: brought back for the call and sent out again after it.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from torch import Tensor, nn

HOST = "cpu"
OPTIMIZER = "optimizer"  # the optimizers' state; the other groups are modules' weights (named by the learner)


def _local(t: Tensor) -> Tensor:
    """A DTensor's local shard (what this rank holds), or the tensor itself."""
    return t.to_local() if hasattr(t, "to_local") else t


def nbytes(t: Tensor) -> int:
    local = _local(t)
    return local.numel() * local.element_size()


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


@dataclass
class _Moved:
    """What one group sent to the host and the device each part came from: optimizer-state entries (state dict,
    key, device) or modules (module, device)."""

    entries: list[tuple[dict, str, torch.device]] = field(default_factory=list)
    modules: list[tuple[nn.Module, torch.device]] = field(default_factory=list)


class StateOffload:
    """The learner's state that leaves the device between steps: the `optimizers`' state (group OPTIMIZER) and
    each group of `weights` (group name -> modules whose parameters and buffers leave; under full mode the
    policy, and its reference and critic; none under LoRA, whose frozen base and adapter stay). The gradients of
    `grad_modules` are dropped."""

    def __init__(self, optimizers: list[torch.optim.Optimizer], weights: dict[str, list[nn.Module | None]],
                 grad_modules: list[nn.Module | None]) -> None:
        self.optimizers, self.grad_modules = optimizers, _unique(grad_modules)
        self.weights = {g: ms for g, m in weights.items() if (ms := _unique(m))}
        self.away: dict[str, _Moved] = {}  # what is in host memory now, by group
        self.offloads = 0  # how many times offload() ran (tests read it)

    @property
    def groups(self) -> list[str]:
        return [OPTIMIZER, *self.weights]

    def offload(self) -> dict[str, float]:
        """Gradients dropped, the optimizer state (and the weights) to host memory. Returns the step's metrics."""
        t0 = time.perf_counter()
        for m in self.grad_modules:
            m.zero_grad(set_to_none=True)
        for opt in self.optimizers:
            opt.zero_grad(set_to_none=True)
        moved = sum(self._send(g) for g in self.groups if g not in self.away)  # one already away stays as it is
        _sync()
        self.offloads += 1
        return {"memory/offloaded_bytes": float(moved), "time/offload_s": time.perf_counter() - t0}

    def reload(self) -> dict[str, float]:
        """Everything offloaded back on its device. Returns {"time/reload_s"} (0 when nothing was away)."""
        t0 = time.perf_counter()
        for group in list(self.away):
            self._bring(group)
        _sync()
        return {"time/reload_s": time.perf_counter() - t0}

    @contextmanager
    def resident(self, *groups: str):
        """`groups` (all when none is named) on the device for the body, and back in host memory after it if
        they were there before."""
        back = [g for g in (groups or self.groups) if g in self.away]
        for g in back:
            self._bring(g)
        _sync()
        try:
            yield
        finally:
            for g in back:
                self._send(g)
            _sync()

    # -- one group each way ------------------------------------------------------------------------
    def _send(self, group: str) -> int:
        """`group` to host memory (again when already there: a no-op copy). Returns its bytes."""
        moved, total = _Moved(), 0
        if group == OPTIMIZER:
            for opt in self.optimizers:
                for state in opt.state.values():
                    for key, value in state.items():
                        if isinstance(value, torch.Tensor):
                            moved.entries.append((state, key, value.device))
                            state[key] = value.to(HOST, non_blocking=True)
                            total += nbytes(value)
        else:
            for m in self.weights[group]:
                first = next(iter(m.parameters()), None)
                moved.modules.append((m, first.device if first is not None else torch.device(HOST)))
                total += sum(nbytes(p) for p in m.parameters()) + sum(nbytes(b) for b in m.buffers())
                m.to(HOST, non_blocking=True)
        self.away[group] = moved
        return total

    def _bring(self, group: str) -> None:
        moved = self.away.pop(group)
        for state, key, device in moved.entries:
            state[key] = state[key].to(device, non_blocking=True)
        for m, device in moved.modules:
            m.to(device, non_blocking=True)


def _unique(modules: list[nn.Module | None]) -> list[nn.Module]:
    seen, out = set(), []
    for m in modules:
        if m is not None and id(m) not in seen:
            seen.add(id(m))
            out.append(m)
    return out
