"""Campaign storage: one place that knows paths vs URIs and the layout of a campaign directory.

Layout of `<storage>/<campaign>/` (the Tune experiment directory, plus our own files):
    campaign.json                   expanded trial table, written on the first run, checked on every resume
    events.jsonl                    campaign decisions: lockstep rounds, budget stop, adaptive-seed looks
    trials/<trial>/metrics.jsonl    one row per step (rewritten whole each step: no gaps, no repeats)
    trials/<trial>/events.jsonl     one line per (re)start of the trial: {"event": "start", "from_step": k}
    trials/<trial>/placement.json   the placement group and GPUs each actor of the trial got
    trials/<trial>/samples/         sampled text: step_<s>.jsonl.gz, eval_step_<s>.jsonl.gz (trial/samples.py)
    trials/<trial>/batches/         each step's training batch, step_<s>.npz (logging.batches; trial/batches.py)
    trials/<trial>/eval/<set>.csv   `python -m orchestrator eval`: checkpoints on held-out sets (evaluate/offline.py),
                                    and their generations, <set>_checkpoint_<s>.jsonl.gz
    wandb/                          offline W&B runs (when storage is a local path)
    report/                         `python -m orchestrator report` output
Local paths are written atomically; URIs (s3://, gs://, ...) go through pyarrow.fs, which Tune also uses.
"""

from __future__ import annotations

import json
import os
import re
import threading
from pathlib import Path

LOCK_FILE = ".driver.lock"  # held by the campaign's driver (tune/launch.py: driver_lock), probed by status
# the layout's names: every module reads and writes them through these constants
CAMPAIGN_FILE = "campaign.json"
EVENTS_FILE = "events.jsonl"  # the campaign's, and each trial's own
PENDING_FILE = "pending.json"  # trials waiting for the autoscaler, since when (tune/pending.py, read by status)
TRIALS_DIR = "trials"
REPORT_DIR = "report"
METRICS_FILE = "metrics.jsonl"
STATE_FILE = "trial_state.json"  # inside a checkpoint: step, policy version, task cursor, SEPA controller
PLACEMENT_FILE = "placement.json"
ISOLATION_FILE = "isolation.json"  # a pool trial's isolation probe at step 0 (trial/artifacts/isolation.py)
UNCERTAINTY_DIR = "uncertainty"  # trials/<trial>/uncertainty/step_<k>.npz
SAMPLES_DIR = "samples"  # trials/<trial>/samples/{step,eval_step}_<k>.jsonl.gz
BATCHES_DIR = "batches"  # trials/<trial>/batches/step_<k>.npz (logging.batches; `trial --replay` reads them)
EVAL_DIR = "eval"  # trials/<trial>/eval/<set>.csv: offline evaluation of the trial's checkpoints
TRIAL_CONFIG_FILE = "trial_config.json"  # `python -m orchestrator trial`: the config a single trial ran with
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


def read_bytes(location: str) -> bytes | None:
    """The file's bytes, or None when it does not exist."""
    if not is_uri(location):
        p = Path(location)
        return p.read_bytes() if p.is_file() else None
    import pyarrow.fs

    fs, path = filesystem(location)
    if fs.get_file_info(path).type != pyarrow.fs.FileType.File:
        return None
    with fs.open_input_stream(path) as f:
        return f.read()


def read_text(location: str) -> str | None:
    """The file's text, or None when it does not exist."""
    data = read_bytes(location)
    return None if data is None else data.decode()


def file_sizes(location: str) -> dict[str, int]:
    """Name -> size in bytes of the files directly in a folder (empty when it does not exist)."""
    import pyarrow.fs

    fs, path = filesystem(location)
    infos = fs.get_file_info(pyarrow.fs.FileSelector(path, allow_not_found=True))
    return {i.base_name: i.size for i in infos if i.type == pyarrow.fs.FileType.File}


_APPENDING = threading.Lock()  # a read and a rewrite: two threads of one process (Tune's, the pool supervisor's)


def append_line(location: str, obj: dict) -> None:
    with _APPENDING:
        old = read_text(location) or ""
        write_text(location, old + json.dumps(obj) + "\n")


def read_jsonl(location: str) -> list[dict]:
    text = read_text(location) or ""
    return [json.loads(ln) for ln in text.splitlines() if ln.strip()]


def read_csv(location: str) -> list[dict]:
    """The rows of a CSV file with a header, as text; [] when it does not exist."""
    import csv
    import io

    text = read_text(location)
    return list(csv.DictReader(io.StringIO(text))) if text else []


def samples_file(step: int, split: str) -> str:
    """The name of a trial's samples file of `step` ("train" or "eval") in its SAMPLES_DIR."""
    return f"{'eval_' if split == 'eval' else ''}step_{step}.jsonl.gz"


def gzip_jsonl(rows: list[dict]) -> bytes:
    """jsonl, gzip-compressed with no timestamp (the same rows give the same bytes)."""
    import gzip

    return gzip.compress("".join(json.dumps(r) + "\n" for r in rows).encode(), mtime=0)


def parse_gzip_jsonl(data: bytes) -> list[dict]:
    """The rows of `gzip_jsonl`'s bytes."""
    import gzip

    return [json.loads(ln) for ln in gzip.decompress(data).decode().splitlines() if ln.strip()]


def read_gzip_jsonl(location: str) -> list[dict] | None:
    """The rows of a `gzip_jsonl` file, or None when it does not exist."""
    data = read_bytes(location)
    return None if data is None else parse_gzip_jsonl(data)


def batch_file(step: int) -> str:
    """The name of a trial's saved training batch of `step` in its BATCHES_DIR."""
    return f"step_{step}.npz"
def eval_file(trial_dir: str, eval_set: str) -> str:
    """Where `python -m orchestrator eval` keeps a trial's results on held-out set `eval_set`."""
    return join(trial_dir, EVAL_DIR, f"{eval_set}.csv")


def eval_samples_name(eval_set: str, checkpoint_step: int) -> str:
    """The name, in a trial's EVAL_DIR, of the generations of that evaluation (rows as in the samples files)."""
    return f"{eval_set}_checkpoint_{checkpoint_step}.jsonl.gz"


def trial_dir(campaign_dir: str, trial: str) -> str:
    return join(campaign_dir, TRIALS_DIR, trial)


# ------------------------------------------------------------------------------------------------ checkpoints
# A trial checkpoint is a directory of our files plus its manifest (sha256 and size of each), written by
# `seal_checkpoint` just before the directory is handed to Tune; orchestrator/trial/artifacts/restore.py verifies it.
CHECKPOINT_MANIFEST = "manifest.json"
SHARDS_DIR = "learner_shards"  # a sharded learner's DCP files (workers/learner/state.py)


def sha256_hex(data: bytes) -> str:
    import hashlib

    return hashlib.sha256(data).hexdigest()


def seal_checkpoint(directory: str | Path) -> None:
    """Write the manifest of a checkpoint directory: every file's size and sha256."""
    d = Path(directory)
    files = {p.relative_to(d).as_posix(): p.read_bytes() for p in sorted(d.rglob("*"))
             if p.is_file() and p.name != CHECKPOINT_MANIFEST}
    manifest = {"version": 1, "files": {k: {"bytes": len(v), "sha256": sha256_hex(v)} for k, v in files.items()}}
    (d / CHECKPOINT_MANIFEST).write_text(json.dumps(manifest, indent=1))


def campaign_events(directory: str) -> list[dict]:
    """The campaign-level events (lockstep rounds, budget, adaptive-seed looks), oldest first."""
    return read_jsonl(join(directory, EVENTS_FILE))
