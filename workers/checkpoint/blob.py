"""The learner's checkpoint blob: `torch.save` of plain containers and tensors, read back only with
`torch.load(weights_only=True)`, so a checkpoint cannot run code when it is loaded (a shared bucket is writable
by more people than the code that resumes from it).

`load_blob` sorts failures in two kinds, which callers treat differently:
- `UnsafeCheckpoint`: the bytes are a pickle that needs more than weights (it names a global such as
  `os.system`). Never loaded, never skipped silently: the trial stops with one line naming the file.
- `CorruptCheckpoint`: truncated or damaged bytes. The trial may fall back to an older checkpoint.
"""

from __future__ import annotations

import io
import pickle
import re
import warnings
import zipfile
from typing import Any

import torch


class CheckpointError(Exception):
    """A checkpoint that cannot be used; `str(err)` is one line naming the file."""


class UnsafeCheckpoint(CheckpointError):
    """A pickle that would import or call more than tensors and plain containers."""


class CorruptCheckpoint(CheckpointError):
    """Bytes that are not a complete checkpoint (truncated, damaged, wrong format)."""


_GLOBAL = re.compile(r"GLOBAL ([\w.]+)")
_OPCODE = re.compile(r"Unsupported operand (\d+)")


def one_line(text: str, limit: int = 160) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def dump_blob(state: dict[str, Any]) -> bytes:
    """Serialise `state` (tensors, numbers, strings, bools, None, lists, tuples, dicts) for `load_blob`."""
    buf = io.BytesIO()
    torch.save(state, buf)
    return buf.getvalue()


def load_blob(blob: bytes, source: str) -> dict[str, Any]:
    """`torch.load(weights_only=True)` of a checkpoint blob, onto the CPU. Raises `UnsafeCheckpoint` or
    `CorruptCheckpoint` with a one-line message that starts with `source` (the file it came from)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # e.g. "Detected pickle protocol 4": the load refuses it anyway
            state = torch.load(io.BytesIO(blob), weights_only=True, map_location="cpu")
    except pickle.UnpicklingError as exc:
        glob, op = _GLOBAL.search(str(exc)), _OPCODE.search(str(exc))
        detail = (f"it would load {glob.group(1)}" if glob else f"it uses pickle opcode {op.group(1)}" if op
                  else one_line(str(exc).splitlines()[0] if str(exc) else type(exc).__name__))
        raise UnsafeCheckpoint(f"{source}: refused: not a weights-only checkpoint ({detail}); it may have been "
                               "crafted to run code. Delete it or replace it with a trusted copy") from None
    except (RuntimeError, EOFError, ValueError, OSError, zipfile.BadZipFile, KeyError, IndexError) as exc:
        raise CorruptCheckpoint(f"{source}: unreadable checkpoint ({type(exc).__name__}: "
                                f"{one_line(str(exc).splitlines()[0] if str(exc) else '')})") from None
    if not isinstance(state, dict):
        raise CorruptCheckpoint(f"{source}: unreadable checkpoint (expected a mapping, got {type(state).__name__})")
    return state
