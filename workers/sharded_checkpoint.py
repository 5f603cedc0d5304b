"""Sharded learner checkpoints with `torch.distributed.checkpoint` (DCP): N ranks save in parallel, M ranks restore.

Layout (one flat directory, merged by the caller from every rank's `save_shards` dict; no shared filesystem needed):
- `__{rank}_{i}.distcp`: the tensors rank `rank` wrote (DCP names them so; unique per rank). Each tensor inside is
  its own `torch.save` record, located by (offset, length) in the metadata.
- `.metadata` (rank 0): DCP's pickled `Metadata`: every key's global shape, dtype and chunks, and for each chunk the
  shard file (by relative name), offset and length.
- `param_groups.pt` (rank 0, only when a part has an optimizer): the optimizers' hyperparameters (lr, betas, ...,
  parameter names) as a `workers.checkpoint` weights-only blob.
Keys: `{part}.model.{fqn}` (parameters and persistent buffers; only `requires_grad` parameters when
`trainable_only`) and `{part}.optim.{fqn}.{exp_avg|exp_avg_sq|step|...}`. The shards hold tensors only: non-tensor
learner state (step counters, RNG, LR scheduler) belongs in the learner's weights-only blob.

N -> M rule: a checkpoint saved by N ranks restores on any M ranks, M = 1 included (a plain module, no process
group). The metadata keeps each tensor's global shape and the chunks each rank held; every loading rank asks DCP
for the slices its own sharding needs (the whole tensor when un-sharded), so the model and optimizer must have the
same parameter names and shapes, not the same sharding.

Safety (the same promise as `workers.checkpoint.load_blob`: loading cannot run code). DCP itself reads `.metadata`
with plain `pickle.load` and non-tensor items with `torch.load(weights_only=False)`; here:
- `.metadata` is unpickled by `_MetadataUnpickler`, which resolves only DCP's metadata classes, `torch.Size`, torch
  dtypes and layouts, and `pathlib` paths; DCP is handed that object and never unpickles the file itself.
- A metadata entry for a pickled Python object (`BytesStorageMetadata`), a shard name that is not a plain file
  name, or a stream transform is refused, so DCP's `weights_only=False` path is never reached.
- Tensors are read by DCP with `torch.load(weights_only=True)`; `param_groups.pt` with `load_blob`.
A refused file raises `UnsafeCheckpoint`; missing, truncated or damaged files raise `CorruptCheckpoint`; both are one
line starting with `source` and naming the file.
"""

from __future__ import annotations

import contextlib
import io
import pickle
import pickletools
import re
import tempfile
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, NoReturn, Protocol

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.filesystem import FileSystemReader, FileSystemWriter, _StorageInfo
from torch.distributed.checkpoint.metadata import (
    BytesStorageMetadata,
    Metadata,
    MetadataIndex,
    StorageMeta,
    TensorStorageMetadata,
)
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_model_state_dict,
    set_state_dict,
)

from workers.checkpoint import (
    CheckpointError,
    CorruptCheckpoint,
    UnsafeCheckpoint,
    _one_line,
    dump_blob,
    load_blob,
)

# (module, optimizer | None) or (module, optimizer | None, keep): `keep(fqn)` names the module's tensors this part
# holds, when another part holds the rest (a LoRA critic's adapter on a fully trained policy: the base is the
# policy part's)
Part = tuple[nn.Module, torch.optim.Optimizer | None] | tuple[nn.Module, torch.optim.Optimizer | None, Callable]

METADATA_FILE = ".metadata"
PARAM_GROUPS_FILE = "param_groups.pt"

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
_PICKLE_OPCODES = {op.code.encode("latin-1")[0] for op in pickletools.opcodes}


class _MetadataUnpickler(pickle.Unpickler):
    """`pickle.Unpickler` that resolves only `_ALLOWED` and torch dtypes; any other global is refused before it is
    imported or called."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _ALLOWED:
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        raise pickle.UnpicklingError(f"GLOBAL {module}.{name}")


def _rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def _no_dist() -> bool:
    return not (dist.is_available() and dist.is_initialized())


@contextlib.contextmanager
def _single_process_quiet():
    """DCP warns on every call without a process group; a 1-process learner is intended here."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled, unavailable or uninitialized")
        yield


def _state(parts: dict[str, Part], trainable_only: bool) -> tuple[dict[str, dict], dict[str, list]]:
    """This rank's view of every part: ({part: {"model": msd, "optim": osd["state"]}}, {part: param_groups}).

    Tensors are this rank's DTensor shards under FSDP2, whole tensors for a plain module; an optimizer with no
    state yet gets it initialised (a zero-gradient step at lr 0, torch's `_init_optim_state`), so a fresh optimizer
    has tensors for DCP to load into."""
    options = StateDictOptions(ignore_frozen_params=trainable_only)
    state, groups = {}, {}
    for name, (model, optim, *keep) in parts.items():
        if optim is None:
            state[name] = {"model": _kept(get_model_state_dict(model, options=options), keep)}
            continue
        msd, osd = get_state_dict(model, optim, options=options)
        msd = _kept(msd, keep)
        for fqn, per_param in osd["state"].items():
            for key, value in per_param.items():
                if not isinstance(value, torch.Tensor):
                    raise TypeError(f"{name}: optimizer state {fqn}.{key} is a {type(value).__name__}, not a "
                                    "tensor; sharded checkpoints hold tensors only")
        state[name] = {"model": msd, "optim": osd["state"]}
        groups[name] = osd["param_groups"]
    return state, groups


def _kept(msd: dict, keep: list) -> dict:
    return {k: v for k, v in msd.items() if keep[0](k)} if keep else msd


def _flat(state: dict[str, dict]) -> dict[str, torch.Tensor]:
    """DCP's key for every tensor of `_state`: `{part}.model.{fqn}`, `{part}.optim.{fqn}.{key}`."""
    flat = {}
    for name, sub in state.items():
        flat.update({f"{name}.model.{fqn}": t for fqn, t in sub["model"].items()})
        for fqn, per_param in sub.get("optim", {}).items():
            flat.update({f"{name}.optim.{fqn}.{key}": t for key, t in per_param.items()})
    return flat


def save_shards(parts: dict[str, Part], *, trainable_only: bool) -> dict[str, bytes]:
    """Save every part's model (and optimizer) state; collective on every rank of the default group, a plain call
    without one. `parts`: {"policy": (module, optimizer | None), ...}. `trainable_only`: only parameters with
    `requires_grad` (e.g. LoRA adapters) and their optimizer state. Returns the files this rank wrote,
    {name: bytes}: its `__{rank}_*.distcp` shards, plus `.metadata` and `param_groups.pt` on rank 0. Every rank's
    dict merged into one directory is the checkpoint (names never collide)."""
    state, groups = _state(parts, trainable_only)
    with tempfile.TemporaryDirectory(prefix="dcp-save-") as tmp:
        # fsync is wasted on a directory read back at once and deleted
        with _single_process_quiet():
            dcp.save(state, storage_writer=FileSystemWriter(tmp, sync_files=False), no_dist=_no_dist())
        files = {p.name: p.read_bytes() for p in Path(tmp).iterdir() if p.is_file()}
    if _rank() == 0 and groups:
        files[PARAM_GROUPS_FILE] = dump_blob({"param_groups": groups})
    return files


class CheckpointFiles(Protocol):
    """Where a restore reads a checkpoint's files from: a dict {name: bytes} (`as_files` wraps it), or a source
    that fetches byte ranges on demand (the trial driver's object-store pieces: orchestrator/learner_group.py)."""

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
    restoring rank checks only the files it reads: `_check_files`). Raises `UnsafeCheckpoint` or
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
        raise CorruptCheckpoint(f"{where}: unreadable metadata ({_one_line(str(exc))})") from None
    except (EOFError, ValueError, TypeError, AttributeError, KeyError, IndexError, RuntimeError) as exc:
        raise CorruptCheckpoint(f"{where}: unreadable metadata ({type(exc).__name__}: {_one_line(str(exc))})"
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
        _check_files(files, md, {info.relative_path for info in md.storage_data.values()}, source)
    return md


def _check_files(files: CheckpointFiles, md: Metadata, names: set[str], source: str) -> None:
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


def chunks_to_read(md: Metadata, flat: dict[str, torch.Tensor]) -> dict[str, list[tuple[int, int]]]:
    """{shard file: [(offset, length), ...] sorted} of the saved chunks that overlap this rank's part of some
    tensor of `flat` (DCP's own load plan). A group restoring with the sharding it saved with reads about its own
    share of the checkpoint plus the replicated scalars (optimizer steps), which DCP saved once, in any rank's
    file."""
    from torch.distributed.checkpoint.default_planner import create_default_local_load_plan

    plan = create_default_local_load_plan(flat, md, strict=False)
    chunks: dict[str, set[tuple[int, int]]] = {}
    for item in plan.items:
        info = md.storage_data[item.storage_index]
        chunks.setdefault(info.relative_path, set()).add((info.offset, info.length))
    return {name: sorted(c) for name, c in chunks.items()}


class _VettedReader(FileSystemReader):
    """DCP's file reader handed the already-vetted metadata: it never unpickles `.metadata` itself."""

    def __init__(self, path: str, metadata: Metadata) -> None:
        super().__init__(path)
        self._vetted = metadata

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        if self._vetted.storage_meta is None:
            self._vetted.storage_meta = StorageMeta()
        self._vetted.storage_meta.load_id = self.load_id
        return self._vetted


def _check_keys(md: Metadata, flat: dict[str, torch.Tensor], source: str) -> None:
    """Every tensor the model and optimizers need is in the checkpoint with the same global shape."""
    for key, t in flat.items():
        entry = md.state_dict_metadata.get(key)
        if entry is None:
            raise CorruptCheckpoint(f"{source}/{METADATA_FILE}: no {key} (saved from another model, or with another "
                                    "trainable_only / learner mode)")
        if tuple(entry.size) != tuple(t.shape):  # a DTensor's shape is the global one
            raise CorruptCheckpoint(f"{source}/{METADATA_FILE}: {key} has shape {list(entry.size)}, the model "
                                    f"{list(t.shape)}")


def _classify(err: BaseException, where: str) -> CheckpointError:
    """A weights-only refusal that names a global, or a valid pickle opcode outside the weights-only set, is
    `UnsafeCheckpoint`; anything else (a bad zip, a non-opcode byte, a wrong size) `CorruptCheckpoint`."""
    text = str(err)
    glob, op = re.search(r"GLOBAL ([\w.]+)", text), re.search(r"Unsupported operand (\d+)", text)
    if isinstance(err, pickle.UnpicklingError) and (glob or (op and int(op.group(1)) in _PICKLE_OPCODES)):
        detail = f"it would load {glob.group(1)}" if glob else f"it uses pickle opcode {op.group(1)}"
        return UnsafeCheckpoint(f"{where}: refused: not a weights-only shard ({detail}); it may have been crafted "
                                "to run code. Delete it or replace it with a trusted copy")
    lines = [ln for ln in text.splitlines() if ln.strip()]
    return CorruptCheckpoint(f"{where}: unreadable shard ({type(err).__name__}: "
                             f"{_one_line(lines[-1] if lines else '')})")


def _raise_from(exc: CheckpointException, files: CheckpointFiles, chunks: dict[str, list[tuple[int, int]]],
                source: str) -> NoReturn:
    """Raise one line for a failed `dcp.load`. DCP reports every rank's exception but not the file, so on this
    (rare) path each chunk this rank read is re-read weights-only, as DCP reads it, to name the first bad shard."""
    for name, offset, length in sorted((n, o, ln) for n, c in chunks.items() for o, ln in c):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                torch.load(io.BytesIO(files.read(name, offset, offset + length)), weights_only=True,
                           map_location="cpu")
        except Exception as err:  # any failure here is the diagnosis
            raise _classify(err, f"{source}/{name}") from None
    failures = [pair[0] if isinstance(pair, tuple) else pair for pair in exc.failures.values()]
    raise _classify(failures[0] if failures else exc, source) from None


def _read_into(files: CheckpointFiles, md: Metadata, parts: dict[str, Part], trainable_only: bool,
               source: str) -> tuple[dict[str, dict], dict[str, list]]:
    """The checkpoint read into this rank's state dicts of `parts` (in place: they share the parameters'
    storage); returns them and the saved param groups. Only the shard files this rank's part needs are read."""
    state, groups = _state(parts, trainable_only)
    flat = _flat(state)
    _check_keys(md, flat, source)
    chunks = chunks_to_read(md, flat)
    _check_files(files, md, set(chunks), source)
    saved_groups: dict[str, list] = {}
    if groups:
        if PARAM_GROUPS_FILE not in files:
            raise CorruptCheckpoint(f"{source}: missing {PARAM_GROUPS_FILE} (the optimizers' hyperparameters)")
        where = f"{source}/{PARAM_GROUPS_FILE}"
        saved_groups = load_blob(files.read(PARAM_GROUPS_FILE), where).get("param_groups", {})
        for name, mine in groups.items():
            theirs = saved_groups.get(name) if isinstance(saved_groups, dict) else None
            if not isinstance(theirs, list) or [g.get("params") for g in theirs if isinstance(g, dict)] != \
                    [g["params"] for g in mine]:
                raise CorruptCheckpoint(f"{where}: {name}'s parameter groups do not match the optimizer's")

    with tempfile.TemporaryDirectory(prefix="dcp-load-") as tmp:
        for name, wanted in chunks.items():  # the vetted, plain-named shards: only the chunks this rank reads
            with open(Path(tmp) / name, "wb") as f:  # a sparse file: DCP seeks to each chunk it reads
                for offset, length in wanted:
                    f.seek(offset)
                    f.write(files.read(name, offset, offset + length))
                f.truncate(files.size(name))
        try:
            with _single_process_quiet():
                dcp.load(state, storage_reader=_VettedReader(tmp, md), no_dist=_no_dist())
        except CheckpointException as exc:  # DCP gathers every rank's failure, so all ranks raise alike
            _raise_from(exc, files, chunks, source)
    return state, saved_groups


def load_shards(files: Mapping[str, bytes] | CheckpointFiles, parts: dict[str, Part], *, trainable_only: bool,
                source: str) -> None:
    """Restore `save_shards`' checkpoint into `parts` (same names; any sharding: FSDP2 over M ranks or a plain
    module). Collective on every rank of the default group, a plain call without one; every rank passes the
    merged checkpoint's files, {name: bytes} or a `CheckpointFiles` that fetches byte ranges on demand: only
    `.metadata`, `param_groups.pt` and the chunks this rank's part overlaps are read. `trainable_only` as when saved; `source` names the checkpoint in
    errors, which are `UnsafeCheckpoint` / `CorruptCheckpoint` (one line).

    A refused metadata, a missing or truncated shard, or a key or shape the parts need and the checkpoint lacks
    is found before any parameter changes. Bytes damaged inside a shard are found while DCP reads, when earlier
    tensors may already be in the parts: after `CorruptCheckpoint`, load another checkpoint or rebuild them.
    An optimizer without state stays so after an error (its state is initialised to be loaded into)."""
    files = as_files(files)
    md = read_metadata(files, source, check_files=False)
    fresh = [optim for _, optim, *_ in parts.values() if optim is not None and not optim.state]
    try:
        state, saved_groups = _read_into(files, md, parts, trainable_only, source)
    except CheckpointError:
        for optim in fresh:
            optim.state.clear()  # undo get_state_dict's zero-gradient step: a fresh start must stay at step 0
        raise
    for name, (model, optim, *keep) in parts.items():
        options = StateDictOptions(ignore_frozen_params=trainable_only, strict=not (trainable_only or keep))
        if optim is None:
            set_model_state_dict(model, state[name]["model"], options=options)
        else:
            osd = {"state": state[name]["optim"], "param_groups": saved_groups[name]}
            set_state_dict(model, optim, model_state_dict=state[name]["model"], optim_state_dict=osd, options=options)
