"""Sharded learner checkpoints with `torch.distributed.checkpoint` (DCP): N ranks save in parallel, M ranks restore.

Layout (one flat directory, merged by the caller from every rank's `save_shards` dict; no shared filesystem needed):
- `__{rank}_{i}.distcp`: the tensors rank `rank` wrote (DCP names them so; unique per rank). Each tensor inside is
  its own `torch.save` record, located by (offset, length) in the metadata.
- `.metadata` (rank 0): DCP's pickled `Metadata`: every key's global shape, dtype and chunks, and for each chunk the
  shard file (by relative name), offset and length.
- `param_groups.pt` (rank 0, only when a part has an optimizer): the optimizers' hyperparameters (lr, betas, ...,
  parameter names) as a `workers.checkpoint.blob` weights-only blob.
Keys: `{part}.model.{fqn}` (parameters and persistent buffers; only `requires_grad` parameters when
`trainable_only`) and `{part}.optim.{fqn}.{exp_avg|exp_avg_sq|step|...}`. The shards hold tensors only: non-tensor
learner state (step counters, RNG, LR scheduler) belongs in the learner's weights-only blob.

N -> M rule: a checkpoint saved by N ranks restores on any M ranks, M = 1 included (a plain module, no process
group). The metadata keeps each tensor's global shape and the chunks each rank held; every loading rank asks DCP
for the slices its own sharding needs (the whole tensor when un-sharded), so the model and optimizer must have the
same parameter names and shapes, not the same sharding.

Safety (the same promise as `workers.checkpoint.blob.load_blob`: loading cannot run code): `.metadata` is unpickled
through an allow list and checked before DCP sees it (`workers.checkpoint.shard_files.read_metadata`); tensors are read by DCP
with `torch.load(weights_only=True)`; `param_groups.pt` with `load_blob`. A refused file raises `UnsafeCheckpoint`;
missing, truncated or damaged files raise `CorruptCheckpoint`; both are one line starting with `source` and naming
the file.
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
from typing import Any, NoReturn

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.filesystem import FileSystemReader, FileSystemWriter
from torch.distributed.checkpoint.metadata import (
    Metadata,
    StorageMeta,
)
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_model_state_dict,
    set_state_dict,
)

from workers.checkpoint.blob import (
    CheckpointError,
    CorruptCheckpoint,
    UnsafeCheckpoint,
    dump_blob,
    load_blob,
    one_line,
)
from workers.checkpoint.shard_files import (
    METADATA_FILE,
    CheckpointFiles,
    as_files,
    check_shard_files,
    read_metadata,
)

# (module, optimizer | None) or (module, optimizer | None, keep): `keep(fqn)` names the module's tensors this part
# holds, when another part holds the rest (a LoRA critic's adapter on a fully trained policy: the base is the
# policy part's)
Part = tuple[nn.Module, torch.optim.Optimizer | None] | tuple[nn.Module, torch.optim.Optimizer | None, Callable]

PARAM_GROUPS_FILE = "param_groups.pt"
_PICKLE_OPCODES = {op.code.encode("latin-1")[0] for op in pickletools.opcodes}


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
                             f"{one_line(lines[-1] if lines else '')})")


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
    check_shard_files(files, md, set(chunks), source)
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
