"""One frozen base model in memory for every slot of the shared learner, and the process-global RNGs a slot owns.

`SharedBase.load` (what a slot's `Learner.load_base` calls) loads the base on the first call and then
hands each caller its own module tree (`copy.deepcopy` with a memo that maps every base parameter and buffer to
itself), so a slot's `Learner` builds its PEFT adapter, hooks, config and train/eval flags on its own modules while
every frozen tensor is the one copy. A slot's learner therefore runs the separate learner's code unchanged.

`SlotRng`: the global random streams a learner draws from (torch CPU and CUDA, python's `random`, numpy's), swapped
in for each call into a slot and out after it, so slots never see each other's draws and a slot's state is what a
separate learner's process would hold.
"""

from __future__ import annotations

import copy
import random
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from workers.learner.modules import checkpoint_activations, load_causal_lm


class SharedBase:
    """The base model at `model_path`, loaded once (in the dtype and device of the first slot that asks)."""

    def __init__(self, model_path: str) -> None:
        self.model_path = model_path
        self.model: nn.Module | None = None
        self._where: tuple[torch.dtype, str] | None = None

    def load(self, path: str, dtype: torch.dtype, device: str, gradient_checkpointing: bool = False) -> nn.Module:
        """A module tree of its own over the shared frozen tensors (see module docstring)."""
        if path != self.model_path:
            raise ValueError(f"the shared learner holds {self.model_path}, not {path}")
        if self.model is None:
            self.model, self._where = load_causal_lm(path, dtype, device), (dtype, device)
        elif self._where != (dtype, device):
            raise ValueError(f"the shared base is {self._where[0]} on {self._where[1]}; a slot asked for {dtype} "
                             f"on {device} (every trial of a pool must use the same dtype)")
        shared = {id(t): t for t in (*self.model.parameters(), *self.model.buffers())}
        tree = copy.deepcopy(self.model, memo=shared)
        if gradient_checkpointing:
            checkpoint_activations(tree)
        return tree

    def tensors(self) -> list[torch.Tensor]:
        """The shared frozen tensors (parameters and buffers), each once."""
        if self.model is None:
            return []
        return list({id(t): t for t in (*self.model.parameters(), *self.model.buffers())}.values())

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors())


@dataclass
class SlotRng:
    """A snapshot of the process-global random streams."""

    torch_cpu: torch.Tensor
    torch_cuda: list[torch.Tensor] | None
    python: tuple
    numpy: tuple

    @classmethod
    def capture(cls) -> SlotRng:
        cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
        return cls(torch.random.get_rng_state(), cuda, random.getstate(), np.random.get_state())

    def install(self) -> None:
        torch.random.set_rng_state(self.torch_cpu)
        if self.torch_cuda is not None:
            torch.cuda.set_rng_state_all(self.torch_cuda)
        random.setstate(self.python)
        np.random.set_state(self.numpy)


@contextmanager
def swapped_rng(slot: SlotRng | None):
    """Run the block on `slot`'s random streams (None: the process's as they are, e.g. a learner about to seed
    them); yields a holder whose `.state` is the streams as the block left them, also after an exception. The
    process's own streams are back afterwards."""
    outer = SlotRng.capture()
    holder = _Holder(slot)
    try:
        if slot is not None:
            slot.install()
        yield holder
    finally:
        holder.state = SlotRng.capture()
        outer.install()


@dataclass
class _Holder:
    state: SlotRng | None
