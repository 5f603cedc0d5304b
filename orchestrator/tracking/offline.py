"""Read W&B offline `.wandb` files (the SDK's own reader is gone in wandb 0.31).

Used by the tracker to learn which steps earlier attempts of a trial really wrote (a killed process loses what
the SDK still buffered), and by tests to check runs.

Format: a 7-byte header (`:W&B`, uint16 version, uint8 magic), then 32 KiB blocks of chunks, each
`<crc32 u32><length u16><type u8>` + payload; types 1 full, 2 first, 3 middle, 4 last; a record is a
`wandb_internal_pb2.Record` split over one or more chunks.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

BLOCK, HEADER, CHUNK_HEADER = 32 * 1024, 7, 7


def records(path: Path) -> list:
    from wandb.proto import wandb_internal_pb2

    data = Path(path).read_bytes()
    if data[:4] != b":W&B":
        return []  # empty or not a W&B file
    out, pending, pos = [], b"", HEADER
    while pos + CHUNK_HEADER <= len(data):
        left = BLOCK - pos % BLOCK
        if left < CHUNK_HEADER:  # block trailer padding
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + CHUNK_HEADER])
        if pos + CHUNK_HEADER + length > len(data):
            break  # the tail of a file whose writer was killed
        payload = data[pos + CHUNK_HEADER:pos + CHUNK_HEADER + length]
        pos += CHUNK_HEADER + length
        if kind == 0 and length == 0:
            pos += BLOCK - pos % BLOCK if pos % BLOCK else 0
            continue
        if kind == 1:
            pending = payload
        elif kind == 2:
            pending = payload
            continue
        elif kind == 3:
            pending += payload
            continue
        elif kind == 4:
            pending += payload
        rec = wandb_internal_pb2.Record()
        try:
            rec.ParseFromString(pending)
        except Exception:  # a torn record at the end of a killed writer's file
            break
        out.append(rec)
        pending = b""
    return out


def offline_files(root: Path, run_id: str) -> list[Path]:
    """Every offline file of `run_id` under a W&B dir (one per attempt of a trial), oldest first."""
    return sorted(Path(root).glob(f"wandb/offline-run-*-{run_id}/run-{run_id}.wandb"))


def last_step(files: list[Path]) -> int:
    """The highest history step the files hold (-1: none)."""
    steps = [rec.history.step.num for f in files for rec in records(f)
             if rec.WhichOneof("record_type") == "history" and rec.history.HasField("step")]
    return max(steps, default=-1)


def read_run(path: Path) -> dict:
    """{"run_id", "group", "job_type", "config": {...}, "history": [{"_step": int, key: value}],
    "summary": {key: value}} (the summary as the last summary records left it)"""
    run: dict = {"history": [], "config": {}, "summary": {}}
    for rec in records(path):
        kind = rec.WhichOneof("record_type")
        if kind == "run":
            r = rec.run
            run.update(run_id=r.run_id, group=r.run_group, job_type=r.job_type, tags=list(r.tags))
            for item in r.config.update:
                run["config"][item.key] = json.loads(item.value_json)
        elif kind == "config":
            for item in rec.config.update:
                run["config"][item.key] = json.loads(item.value_json)
        elif kind == "history":
            row = {}
            for item in rec.history.item:
                key = item.key or "/".join(item.nested_key)
                row[key] = json.loads(item.value_json)
            if rec.history.HasField("step"):
                row.setdefault("_step", rec.history.step.num)
            run["history"].append(row)
        elif kind == "summary":
            for item in rec.summary.update:
                run["summary"][item.key or "/".join(item.nested_key)] = json.loads(item.value_json)
    return run
