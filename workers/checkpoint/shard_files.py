"""Reading a sharded checkpoint's files safely (workers/checkpoint/sharded.py restores from them).

- Where the bytes come from (`CheckpointFiles`): a dict {name: bytes}, a source that fetches byte ranges on demand
  (the trial driver's object-store pieces, orchestrator/trial/actors/learner_group.py), or the files under a prefix (`Under`).
- DCP's `.metadata`, vetted before DCP sees it (`read_metadata`). DCP itself reads `.metadata` with plain
  `pickle.load`; here it is unpickled by `_MetadataUnpickler`, which resolves only DCP's metadata classes,
  `torch.Size`, torch dtypes and layouts, and `pathlib` paths. A metadata entry for a pickled Python object
  (`BytesStorageMetadata`), a shard name that is not a plain file name, or a stream transform is refused, so DCP's
  `weights_only=False` path is never reached. A refused file raises `UnsafeCheckpoint`, a damaged one
  `CorruptCheckpoint`: one line starting with `source` and naming the file.
"""

from __future__ import annotations

import io
import pickle
import re
from collections.abc import Mapping
from typing import Any, Protocol

import torch
from torch.distributed.checkpoint.filesystem import _StorageInfo
from torch.distributed.checkpoint.metadata import (
    BytesStorageMetadata,
    Metadata,
    MetadataIndex,
    TensorStorageMetadata,
)

from workers.checkpoint.blob import CorruptCheckpoint, UnsafeCheckpoint, one_line

METADATA_FILE = ".metadata"

_SHARD_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")  # a plain file name: no separators, no "..", no dotfile

# (module, name) pairs `.metadata` may name. Each is a class or a function whose call with any arguments only builds
# a value (a dataclass, an Enum member, a torch.Size, a layout looked up by name, a path object).
_DCP_CLASSES = ("Metadata", "MetadataIndex", "StorageMeta", "TensorProperties", "TensorStorageMetadata",
                "ChunkStorageMetadata", "BytesStorageMetadata", "_MEM_FORMAT_ENCODING")
_ALLOWED = {
    *(("torch.distributed.checkpoint.metadata", n) for n in _DCP_CLASSES),
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("torch", "Size"),
    ("torch.serialization", "_get_layout"),
    # StorageMeta.checkpoint_id is the writer's directory, a Path (module `pathlib._local` from Python 3.13)
    *((mod, n) for mod in ("pathlib", "pathlib._local") for n in ("PosixPath", "PurePosixPath")),
}


class _MetadataUnpickler(pickle.Unpickler):
    """`pickle.Unpickler` that resolves only `_ALLOWED` and torch dtypes; any other global is refused before it is
    imported or called."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _ALLOWED:
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        raise pickle.UnpicklingError(f"GLOBAL {module}.{name}")



class CheckpointFiles(Protocol):
    """Where a restore reads a checkpoint's files from: a dict {name: bytes} (`as_files` wraps it), or a source
    that fetches byte ranges on demand (the trial driver's object-store pieces: orchestrator/trial/actors/learner_group.py)."""

    def __contains__(self, name: object) -> bool: ...

    def size(self, name: str) -> int: ...

    def read(self, name: str, start: int = 0, end: int | None = None) -> bytes: ...


class _InMemory:
    def __init__(self, files: Mapping[str, bytes]) -> None:
        self.files = files

    def __contains__(self, name: object) -> bool:
        return name in self.files

    def size(self, name: str) -> int:
        return len(self.files[name])

    def read(self, name: str, start: int = 0, end: int | None = None) -> bytes:
        data = self.files[name]
        return data if start == 0 and end is None else data[start:end]


class Under:
    """The files of `files` under `prefix`, by their names there."""

    def __init__(self, files: CheckpointFiles, prefix: str) -> None:
        self.files, self.prefix = files, prefix

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and self.prefix + name in self.files

    def size(self, name: str) -> int:
        return self.files.size(self.prefix + name)

    def read(self, name: str, start: int = 0, end: int | None = None) -> bytes:
        return self.files.read(self.prefix + name, start, end)


def as_files(files: Mapping[str, bytes] | CheckpointFiles) -> CheckpointFiles:
    return files if hasattr(files, "read") and hasattr(files, "size") else _InMemory(files)


def read_metadata(files: Mapping[str, bytes] | CheckpointFiles, source: str, *, check_files: bool = True
                  ) -> Metadata:
    """The checkpoint's `.metadata`, unpickled with the allow list and checked: only tensor entries, every chunk
    in a plain-named file; and (`check_files`) every such file in `files` and each chunk within its size (a
    restoring rank checks only the files it reads: `check_shard_files`). Raises `UnsafeCheckpoint` or
    `CorruptCheckpoint` (one line, `source/.metadata` or the shard named)."""
    where = f"{source}/{METADATA_FILE}"
    files = as_files(files)
    if METADATA_FILE not in files:
        raise CorruptCheckpoint(f"{source}: not a sharded checkpoint (no {METADATA_FILE})")
    try:
        md = _MetadataUnpickler(io.BytesIO(files.read(METADATA_FILE))).load()
    except pickle.UnpicklingError as exc:
        if str(exc).startswith("GLOBAL "):
            raise UnsafeCheckpoint(f"{where}: refused: it would load {str(exc)[7:]}, which is not DCP metadata; it "
                                   "may have been crafted to run code. Delete it or replace it with a trusted copy"
                                   ) from None
        raise CorruptCheckpoint(f"{where}: unreadable metadata ({one_line(str(exc))})") from None
    except (EOFError, ValueError, TypeError, AttributeError, KeyError, IndexError, RuntimeError) as exc:
        raise CorruptCheckpoint(f"{where}: unreadable metadata ({type(exc).__name__}: {one_line(str(exc))})"
                                ) from None
    if not isinstance(md, Metadata) or not isinstance(md.state_dict_metadata, dict) \
            or not isinstance(md.storage_data, dict):
        raise CorruptCheckpoint(f"{where}: unreadable metadata (not DCP's Metadata)")
    for key, entry in md.state_dict_metadata.items():
        if isinstance(entry, BytesStorageMetadata):
            raise UnsafeCheckpoint(f"{where}: refused: {key} is a pickled Python object (sharded checkpoints hold "
                                   "tensors only; DCP would unpickle it with weights_only=False). Delete it or "
                                   "replace it with a trusted copy")
        if not isinstance(entry, TensorStorageMetadata):
            raise CorruptCheckpoint(f"{where}: unreadable metadata ({key}: {type(entry).__name__})")
    for index, info in md.storage_data.items():
        if not isinstance(index, MetadataIndex) or not isinstance(info, _StorageInfo):
            raise CorruptCheckpoint(f"{where}: unreadable metadata (storage entry {type(info).__name__})")
        name = info.relative_path
        if not isinstance(name, str) or not _SHARD_NAME.fullmatch(name) or ".." in name:
            raise UnsafeCheckpoint(f"{where}: refused: {index.fqn} points at {name!r}, not a "
                                   "file of the checkpoint directory")
        if info.transform_descriptors:
            raise CorruptCheckpoint(f"{where}: {index.fqn} uses stream transforms {info.transform_descriptors}, "
                                    "which these checkpoints never write")
        offset, length = info.offset, info.length
        if not (isinstance(offset, int) and isinstance(length, int) and offset >= 0 and length > 0):
            raise CorruptCheckpoint(f"{where}: {index.fqn}: bad offset/length {offset!r}/{length!r}")
    if check_files:
        check_shard_files(files, md, {info.relative_path for info in md.storage_data.values()}, source)
    return md


def check_shard_files(files: CheckpointFiles, md: Metadata, names: set[str], source: str) -> None:
    """Each of the shard files `names` is in `files` and holds every chunk the metadata puts in it."""
    sizes = {name: files.size(name) for name in names if name in files}
    for index, info in md.storage_data.items():
        name = info.relative_path
        if name not in names:
            continue
        if name not in sizes:
            raise CorruptCheckpoint(f"{source}/{name}: missing shard (the metadata needs it for {index.fqn})")
        if info.offset + info.length > sizes[name]:
            raise CorruptCheckpoint(f"{source}/{name}: truncated ({sizes[name]} bytes; {index.fqn} needs "
                                    f"bytes {info.offset}..{info.offset + info.length})")
