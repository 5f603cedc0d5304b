"""Campaign storage: one place that knows paths vs URIs and the layout of a campaign directory.

Layout of `<storage>/<campaign>/` (the Tune experiment directory, plus our own files):
    campaign.json                   expanded trial table, written on the first run, checked on every resume
    events.jsonl                    campaign decisions: lockstep rounds, budget stop, adaptive-seed looks
    trials/<trial>/metrics.jsonl    one row per step (rewritten whole each step: no gaps, no repeats)
    trials/<trial>/events.jsonl     one line per (re)start of the trial: {"event": "start", "from_step": k}
    trials/<trial>/placement.json   the placement group and GPUs each actor of the trial got
    wandb/                          offline W&B runs (when storage is a local path)
    report/                         `python -m orchestrator report` output
Local paths are written atomically; URIs (s3://, gs://, ...) go through pyarrow.fs, which Tune also uses.
"""

from __future__ import annotations

import json
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

LOCK_FILE = ".driver.lock"  # held by the campaign's driver (launch.driver_lock), probed by status
_VAR = re.compile(r"\$\{(\w+)(?::-([^}]*))?\}")


def is_uri(location: str) -> bool:
    return "://" in location


def expand(value: str) -> str:
    """`~` and `${VAR}` / `${VAR:-default}`; an unset variable without default raises KeyError(VAR)."""

    def sub(m: re.Match) -> str:
        if m.group(1) in os.environ:
            return os.environ[m.group(1)]
        if m.group(2) is None:
            raise KeyError(m.group(1))
        return m.group(2)

    return os.path.expanduser(_VAR.sub(sub, value))


def resolve(value: str, relative_to: Path) -> str:
    """A storage setting as an absolute path or a URI; relative paths are taken from `relative_to`."""
    value = expand(value)
    if is_uri(value):
        return value.rstrip("/")
    p = Path(value)
    return str((p if p.is_absolute() else relative_to / p).resolve())


def join(base: str, *parts: str) -> str:
    return "/".join([base.rstrip("/"), *parts])


def filesystem(location: str):
    """`(pyarrow filesystem, path)` of a local path or a URI."""
    import pyarrow.fs

    return pyarrow.fs.FileSystem.from_uri(location) if is_uri(location) else (pyarrow.fs.LocalFileSystem(), location)


def write_bytes(location: str, data: bytes) -> None:
    if not is_uri(location):
        p = Path(location)
        p.parent.mkdir(parents=True, exist_ok=True)
        tmp = p.with_name(f".{p.name}.tmp")
        tmp.write_bytes(data)
        os.replace(tmp, p)  # readers never see half a file
        return
    fs, path = filesystem(location)
    fs.create_dir(path.rsplit("/", 1)[0], recursive=True)
    with fs.open_output_stream(path) as f:
        f.write(data)


def write_text(location: str, text: str) -> None:
    write_bytes(location, text.encode())


def read_text(location: str) -> str | None:
    """The file's text, or None when it does not exist."""
    if not is_uri(location):
        p = Path(location)
        return p.read_text() if p.is_file() else None
    import pyarrow.fs

    fs, path = filesystem(location)
    if fs.get_file_info(path).type != pyarrow.fs.FileType.File:
        return None
    with fs.open_input_stream(path) as f:
        return f.read().decode()


def append_line(location: str, obj: dict) -> None:
    old = read_text(location) or ""
    write_text(location, old + json.dumps(obj) + "\n")


def read_jsonl(location: str) -> list[dict]:
    text = read_text(location) or ""
    return [json.loads(ln) for ln in text.splitlines() if ln.strip()]


def trial_dir(campaign_dir: str, trial: str) -> str:
    return join(campaign_dir, "trials", trial)


# ------------------------------------------------------------------------------------------------ checkpoints
# A trial checkpoint is a directory of our files plus MANIFEST (sha256 and size of each), written by
# `seal_checkpoint` just before the directory is handed to Tune. `restore_checkpoint` reads every `checkpoint_<n>`
# in the trial's Tune directory, newest step first, and takes the first that verifies: a torn or damaged one is
# skipped (said in the trial's events.jsonl), and a checkpoint Tune's experiment snapshot had not recorded yet
# (the driver was killed between a checkpoint and the next snapshot) is used all the same. A learner blob that
# would run code when unpickled is refused outright.
CHECKPOINT_MANIFEST = "manifest.json"
SHARDS_DIR = "learner_shards"  # a sharded learner's DCP files (workers/learner/state.py)
_CKPT_DIR = re.compile(r"^checkpoint_(\d+)$")


def _sha256(data: bytes) -> str:
    import hashlib

    return hashlib.sha256(data).hexdigest()


def seal_checkpoint(directory: str | Path) -> None:
    """Write the manifest of a checkpoint directory: every file's size and sha256."""
    d = Path(directory)
    files = {p.relative_to(d).as_posix(): p.read_bytes() for p in sorted(d.rglob("*"))
             if p.is_file() and p.name != CHECKPOINT_MANIFEST}
    manifest = {"version": 1, "files": {k: {"bytes": len(v), "sha256": _sha256(v)} for k, v in files.items()}}
    (d / CHECKPOINT_MANIFEST).write_text(json.dumps(manifest, indent=1))


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
    from workers.checkpoint.blob import CorruptCheckpoint, load_blob

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
            if len(data) != meta.get("bytes") or _sha256(data) != meta.get("sha256"):
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
                       state_file: str = "trial_state.json", learner_file: str = "learner.pt",
                       metrics_file: str = "metrics.jsonl") -> RestoredCheckpoint | None:
    """The newest usable checkpoint of the trial whose Tune directory is `trial_path` on pyarrow filesystem `fs`,
    or None when it has none. Each skipped checkpoint is one `checkpoint_skipped` line in `events` (a jsonl
    location).

    `recorded`: Tune handed the trial a checkpoint (`tune.get_checkpoint()`). Then one of them must be usable:
    raises `CorruptCheckpoint` naming the newest checkpoint's bad file when none is, never restarting from step 0
    silently. Without it, damaged directories (a first checkpoint torn by a killed driver) are skipped and the
    trial starts from step 0. Raises `workers.checkpoint.blob.UnsafeCheckpoint` for a learner blob that would run code
    (never skipped).
    """
    from workers.checkpoint.blob import CorruptCheckpoint, UnsafeCheckpoint

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
