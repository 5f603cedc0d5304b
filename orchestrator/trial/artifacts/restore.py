"""Restore a trial from its newest usable checkpoint: every `checkpoint_<n>` of the trial's Tune directory,
newest step first, verified against its manifest (orchestrator/storage.py: `seal_checkpoint`); a torn or damaged
one is skipped (said in the trial's events.jsonl), and a learner blob that would run code when unpickled is
refused outright."""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, field

from orchestrator.storage import (
    CHECKPOINT_MANIFEST,
    METRICS_FILE,
    SHARDS_DIR,
    STATE_FILE,
    append_line,
    sha256_hex,
)
from workers.checkpoint.blob import CheckpointError as CheckpointError  # re-exported: tune/launch.py names it
from workers.checkpoint.blob import CorruptCheckpoint, UnsafeCheckpoint

_CKPT_DIR = re.compile(r"^checkpoint_(\d+)$")


class _CheckpointDir:
    """A checkpoint directory on a pyarrow filesystem (Tune's `Checkpoint.filesystem` / `.path`)."""

    def __init__(self, fs, path: str):
        self.fs, self.path = fs, path.rstrip("/")

    def __str__(self) -> str:
        import pyarrow.fs

        return self.path if isinstance(self.fs, pyarrow.fs.LocalFileSystem) else f"{self.fs.type_name}://{self.path}"

    def read(self, name: str) -> bytes | None:
        import pyarrow.fs

        p = f"{self.path}/{name}"
        if self.fs.get_file_info(p).type != pyarrow.fs.FileType.File:
            return None
        with self.fs.open_input_stream(p) as f:
            return f.read()

    def step(self, state_file: str) -> float:
        """The step its state file names; +inf when unreadable (tried first, so its damage is reported)."""
        try:
            step = json.loads(self.read(state_file) or b"")["step"]
        except (ValueError, KeyError, TypeError):
            return float("inf")
        return step if isinstance(step, int) else float("inf")


def _checkpoint_dirs(fs, trial_path: str, state_file: str) -> list[_CheckpointDir]:
    """Every `checkpoint_<n>` directory of a trial, newest step first (index breaks ties: a fresh Tune run
    numbers its checkpoints from 0 again, so the index alone does not say which is newest)."""
    import pyarrow.fs

    infos = fs.get_file_info(pyarrow.fs.FileSelector(trial_path.rstrip("/"), allow_not_found=True))
    dirs = [(int(m.group(1)), _CheckpointDir(fs, i.path)) for i in infos
            if i.type == pyarrow.fs.FileType.Directory and (m := _CKPT_DIR.match(i.base_name))]
    return [ck for _, ck in sorted(dirs, key=lambda d: (d[1].step(state_file), d[0]), reverse=True)]


@dataclass
class RestoredCheckpoint:
    state: dict  # the trial state (step, adapter version, task cursor, SEPA controller, config)
    learner: bytes  # the learner's blob, verified to load with weights_only=True
    rows: list[dict]  # metrics rows up to and including the checkpoint's step
    location: str  # the checkpoint directory used
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (file, why) of newer unusable checkpoints
    checkpoint: object = None  # the `ray.tune.Checkpoint` used (`.as_directory()` for other files it holds)


def _verify(ck: _CheckpointDir, state_file: str, learner_file: str, metrics_file: str):
    """(state, learner blob, rows) of one checkpoint, or raise CheckpointError naming the bad file."""
    from workers.checkpoint.blob import load_blob

    blobs = {n: ck.read(n) for n in (state_file, learner_file, metrics_file)}
    # The learner blob is checked for code first, whatever the manifest says: a crafted file is refused, not
    # skipped. weights_only=True loading never runs code, so trying it on damaged bytes is harmless.
    load_error = None
    if blobs[learner_file] is not None:
        try:
            load_blob(blobs[learner_file], f"{ck}/{learner_file}")
        except CorruptCheckpoint as exc:  # reported after the manifest, which says more (sizes)
            load_error = exc
    raw_manifest = ck.read(CHECKPOINT_MANIFEST)
    if raw_manifest is not None:
        try:
            listed = json.loads(raw_manifest)["files"]
        except (ValueError, KeyError, TypeError):
            raise CorruptCheckpoint(f"{ck}/{CHECKPOINT_MANIFEST}: unreadable manifest") from None
        shards = {}
        for name, meta in listed.items():
            data = blobs[name] if name in blobs else ck.read(name)
            if name.startswith(SHARDS_DIR + "/") and data is not None:
                shards[name[len(SHARDS_DIR) + 1:]] = data
            if data is None:
                raise CorruptCheckpoint(f"{ck}/{name}: missing (listed in {CHECKPOINT_MANIFEST})")
            if len(data) != meta.get("bytes") or sha256_hex(data) != meta.get("sha256"):
                raise CorruptCheckpoint(f"{ck}/{name}: {len(data)} bytes, checksum does not match the manifest "
                                        f"({meta.get('bytes')} bytes): truncated or damaged")
        if shards:  # a sharded learner's DCP metadata is a pickle: vetted here, before any actor reads it
            from workers.checkpoint.shard_files import read_metadata

            read_metadata(shards, f"{ck}/{SHARDS_DIR}")
    for name, data in blobs.items():
        if data is None:
            raise CorruptCheckpoint(f"{ck}/{name}: missing")
    if load_error is not None:
        raise load_error
    try:
        state = json.loads(blobs[state_file])
    except ValueError:
        state = None
    if not (isinstance(state, dict) and isinstance(state.get("step"), int)):
        raise CorruptCheckpoint(f"{ck}/{state_file}: unreadable trial state")
    try:
        rows = [json.loads(ln) for ln in blobs[metrics_file].decode().splitlines() if ln.strip()]
    except ValueError:
        raise CorruptCheckpoint(f"{ck}/{metrics_file}: unreadable metrics rows") from None
    return state, blobs[learner_file], rows


def restore_checkpoint(fs, trial_path: str, *, recorded: bool, events: str | None = None,
                       state_file: str = STATE_FILE, learner_file: str = "learner.pt",
                       metrics_file: str = METRICS_FILE) -> RestoredCheckpoint | None:
    """The newest usable checkpoint of the trial whose Tune directory is `trial_path` on pyarrow filesystem `fs`,
    or None when it has none. Each skipped checkpoint is one `checkpoint_skipped` line in `events` (a jsonl
    location).

    `recorded`: Tune handed the trial a checkpoint (`tune.get_checkpoint()`). Then one of them must be usable:
    raises `CorruptCheckpoint` naming the newest checkpoint's bad file when none is, never restarting from step 0
    silently. Without it, damaged directories (a first checkpoint torn by a killed driver) are skipped and the
    trial starts from step 0. Raises `workers.checkpoint.blob.UnsafeCheckpoint` for a learner blob that would run code
    (never skipped).
    """

    candidates = _checkpoint_dirs(fs, trial_path, state_file)
    skipped: list[tuple[str, str]] = []
    for ck in candidates:
        try:
            state, blob, rows = _verify(ck, state_file, learner_file, metrics_file)
        except UnsafeCheckpoint as exc:
            if events is not None:
                append_line(events, {"event": "checkpoint_refused", "checkpoint": str(ck), "reason": str(exc),
                                     "time": time.time()})
            raise
        except CorruptCheckpoint as exc:
            skipped.append((str(ck), str(exc)))
            if events is not None:
                append_line(events, {"event": "checkpoint_skipped", "checkpoint": str(ck), "reason": str(exc),
                                     "time": time.time()})
            continue
        if skipped and events is not None:
            append_line(events, {"event": "checkpoint_fallback", "checkpoint": str(ck), "step": state["step"],
                                 "skipped": [s for s, _ in skipped], "time": time.time()})
        from ray import tune

        return RestoredCheckpoint(state, blob, rows, str(ck), skipped, tune.Checkpoint(ck.path, ck.fs))
    if not recorded:
        return None
    if not skipped:
        err = CorruptCheckpoint(f"{trial_path}: Tune recorded a checkpoint of this trial but none is there")
    else:
        first = skipped[0][1]
        err = CorruptCheckpoint(f"{first}; no older checkpoint is usable ({len(candidates)} kept)"
                                if len(candidates) > 1 else f"{first}; no older checkpoint was kept")
    if events is not None:
        append_line(events, {"event": "checkpoint_unusable", "reason": str(err), "time": time.time()})
    raise err


def checkpoint_steps(fs, trial_path: str, state_file: str = STATE_FILE) -> list[int]:
    """The steps of a trial's checkpoints whose state file reads (not verified), ascending."""
    return sorted({int(s) for s in (ck.step(state_file) for ck in _checkpoint_dirs(fs, trial_path, state_file))
                   if s != float("inf")})


def verified_checkpoint(fs, trial_path: str, step: int | None = None, *, state_file: str = STATE_FILE,
                        learner_file: str = "learner.pt",
                        metrics_file: str = METRICS_FILE) -> tuple[dict, dict[str, bytes], str]:
    """(trial state, every file of its manifest by name, location) of the checkpoint of `step` (default: the
    newest) in a trial's Tune directory, verified as a restore verifies it and sealed: `CorruptCheckpoint` when it
    is damaged or has no manifest (never another checkpoint in its place: an export says exactly what it read),
    `LookupError` when there is no checkpoint of that step."""
    candidates = _checkpoint_dirs(fs, trial_path, state_file)
    steps = sorted(int(s) for s in (ck.step(state_file) for ck in candidates) if s != float("inf"))
    if step is None and not candidates:
        raise LookupError(f"{trial_path}: no checkpoint")
    ck = candidates[0] if step is None else next((c for c in candidates if c.step(state_file) == step), None)
    if ck is None:
        raise LookupError(f"{trial_path}: no checkpoint of step {step}; checkpoints kept: "
                          + (", ".join(f"step {s}" for s in steps) or "none"))
    if ck.read(CHECKPOINT_MANIFEST) is None:
        raise CorruptCheckpoint(f"{ck}/{CHECKPOINT_MANIFEST}: missing, the checkpoint cannot be verified")
    state, _, _ = _verify(ck, state_file, learner_file, metrics_file)
    listed = json.loads(ck.read(CHECKPOINT_MANIFEST))["files"]
    return state, {name: ck.read(name) for name in listed}, str(ck)
