"""Checkpoints are loaded with weights_only=True: a crafted pickle is refused (one line naming the file) and never
runs; a truncated or damaged latest checkpoint falls back to the previous one Tune kept, said in events.jsonl;
with none left the trial fails with one line naming the file."""

from __future__ import annotations

import io
import json
import os
import pickle
import shutil
from pathlib import Path

import pytest
import torch

from orchestrator import storage as store
from orchestrator.trial.artifacts.restore import restore_checkpoint
from workers.checkpoint.blob import CorruptCheckpoint, UnsafeCheckpoint, dump_blob, load_blob

STATE, LEARNER, METRICS = "trial_state.json", "learner.pt", "metrics.jsonl"


class _Payload:
    """Unpickling this runs `touch <marker>`: what an attacker with write access to the bucket would plant."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _malicious_blob(marker: Path) -> bytes:
    buf = io.BytesIO()
    torch.save({"adapter": {}, "optimizer": _Payload(marker)}, buf)
    return buf.getvalue()


def _restore(trial_dir: Path, *, recorded: bool = True, events: Path | None = None):
    """restore_checkpoint as a trial calls it: its Tune directory on a pyarrow filesystem."""
    import pyarrow.fs

    return restore_checkpoint(pyarrow.fs.LocalFileSystem(), str(trial_dir), recorded=recorded,
                                    events=None if events is None else str(events))


def _write_checkpoint(trial_dir: Path, index: int, step: int, *, seal: bool = True) -> Path:
    d = trial_dir / f"checkpoint_{index:06d}"
    d.mkdir(parents=True)
    (d / LEARNER).write_bytes(dump_blob({"adapter": {"w": torch.full((4, 4), float(step))},
                                         "torch_rng": torch.random.get_rng_state(), "step": step}))
    (d / METRICS).write_text("".join(json.dumps({"step": k, "x": k / 10}) + "\n" for k in range(step + 1)))
    (d / STATE).write_text(json.dumps({"step": step, "adapter_version": step + 1}))
    if seal:
        store.seal_checkpoint(d)
    return d


def _events(path: Path) -> list[dict]:
    return [json.loads(ln) for ln in path.read_text().splitlines()] if path.exists() else []


def test_a_crafted_pickle_is_refused_and_never_runs(tmp_path):
    marker = tmp_path / "PWNED"
    blob = _malicious_blob(marker)
    with pytest.raises(UnsafeCheckpoint) as e:
        load_blob(blob, "s3://bucket/c/t/checkpoint_000003/learner.pt")
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("s3://bucket/c/t/checkpoint_000003/learner.pt: refused")
    assert "it would load posix.system" in msg or "it would load os.system" in msg
    assert not marker.exists()
    # the same bytes would have run the payload under the old weights_only=False load
    torch.load(io.BytesIO(blob), weights_only=False)
    assert marker.exists()
    marker.unlink()

    # in a sealed checkpoint (the attacker rewrote the manifest too) and in a legacy one without manifest, with
    # an older good checkpoint present: refused, not skipped
    for seal in (True, False):
        trial = tmp_path / f"trial_{seal}"
        _write_checkpoint(trial, 1, 4)
        latest = _write_checkpoint(trial, 2, 9, seal=False)
        (latest / LEARNER).write_bytes(blob)
        if seal:
            store.seal_checkpoint(latest)
        events = tmp_path / f"events_{seal}.jsonl"
        with pytest.raises(UnsafeCheckpoint) as e:
            _restore(latest.parent, events=events)
        assert str(e.value).startswith(f"{latest}/{LEARNER}: refused: not a weights-only checkpoint")
        assert not marker.exists()
        assert [(e["event"], e["reason"]) for e in _events(events)] == [("checkpoint_refused", str(e.value))]


def test_a_truncated_latest_checkpoint_falls_back_to_the_previous_one(tmp_path):
    trial = tmp_path / "trial"
    _write_checkpoint(trial, 0, 4)
    _write_checkpoint(trial, 1, 9)
    latest = _write_checkpoint(trial, 2, 14)
    blob = (latest / LEARNER).read_bytes()
    (latest / LEARNER).write_bytes(blob[: len(blob) // 2])
    events = tmp_path / "events.jsonl"
    got = _restore(latest.parent, events=events)
    assert got.state["step"] == 9 and got.location == str(trial / "checkpoint_000001")
    with got.checkpoint.as_directory() as d:  # the chosen checkpoint's other files (e.g. a prefetched batch)
        assert json.loads((Path(d) / STATE).read_text())["step"] == 9
    assert [r["step"] for r in got.rows] == list(range(10))
    assert load_blob(got.learner, "x")["adapter"]["w"][0, 0] == 9.0
    ev = _events(events)
    assert [e["event"] for e in ev] == ["checkpoint_skipped", "checkpoint_fallback"]
    assert ev[0]["checkpoint"] == str(latest) and f"{latest}/{LEARNER}" in ev[0]["reason"]
    assert "truncated or damaged" in ev[0]["reason"]
    assert ev[1]["step"] == 9 and ev[1]["skipped"] == [str(latest)]


def test_damage_torch_would_not_notice_is_caught_by_the_manifest(tmp_path):
    trial = tmp_path / "trial"
    _write_checkpoint(trial, 4, 4)
    latest = _write_checkpoint(trial, 5, 9)
    data = bytearray((latest / LEARNER).read_bytes())
    # flip a byte inside the tensor data: torch.load still succeeds, with a wrong weight
    i = data.index(torch.full((4, 4), 9.0).numpy().tobytes())
    data[i + 2] ^= 0x40
    (latest / LEARNER).write_bytes(bytes(data))
    assert load_blob(bytes(data), "x")["adapter"]["w"][0, 0] != 9.0
    got = _restore(latest.parent)
    assert got.state["step"] == 4 and got.skipped[0][0] == str(latest)
    # a damaged state file or metrics file is caught the same way
    for name, junk in ((STATE, b'{"step": 9, "adapter_ver'), (METRICS, b"")):
        other = _write_checkpoint(tmp_path / f"t_{name}", 1, 2)
        _write_checkpoint(tmp_path / f"t_{name}", 0, 1)
        (other / name).write_bytes(junk)
        r = _restore(other.parent)
        assert r.state["step"] == 1 and f"{other}/{name}" in r.skipped[0][1]


def test_no_usable_checkpoint_is_one_line_naming_the_file_never_a_restart_from_zero(tmp_path):
    trial = tmp_path / "trial"
    only = _write_checkpoint(trial, 3, 14)
    (only / LEARNER).write_bytes(b"")
    events = tmp_path / "events.jsonl"
    with pytest.raises(CorruptCheckpoint) as e:
        _restore(only.parent, events=events)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(f"{only}/{LEARNER}: ") and "no older checkpoint was kept" in msg
    assert [x["event"] for x in _events(events)] == ["checkpoint_skipped", "checkpoint_unusable"]
    assert _events(events)[-1]["reason"] == msg
    # two kept, both damaged
    older = _write_checkpoint(trial, 2, 9)
    shutil.rmtree(older)
    older = _write_checkpoint(trial, 2, 9)
    (older / STATE).unlink()
    with pytest.raises(CorruptCheckpoint, match=r"no older checkpoint is usable \(2 kept\)"):
        _restore(only.parent)


def test_checkpoints_without_manifest_still_restore(tmp_path):
    latest = _write_checkpoint(tmp_path / "trial", 0, 3, seal=False)
    assert _restore(latest.parent).state["step"] == 3


def test_the_newest_step_on_disk_wins_whatever_tune_recorded(tmp_path):
    # A driver killed after a checkpoint but before Tune's next experiment snapshot: Tune hands back the older
    # one, the newer is on disk. A fresh Tune run (after a torn snapshot) numbers from 0 again: the index alone
    # does not order them, the step does.
    trial = tmp_path / "trial"
    _write_checkpoint(trial, 3, 5)
    _write_checkpoint(trial, 4, 8)
    newest = _write_checkpoint(trial, 0, 11)
    got = _restore(trial)
    assert got.state["step"] == 11 and got.location == str(newest) and not got.skipped
    with got.checkpoint.as_directory() as d:
        assert json.loads((Path(d) / STATE).read_text())["step"] == 11


def test_without_a_recorded_checkpoint_a_torn_first_one_means_step_zero(tmp_path):
    trial = tmp_path / "trial"
    assert _restore(trial, recorded=False) is None  # no directory at all: a fresh trial
    torn = _write_checkpoint(trial, 0, 1)
    (torn / LEARNER).write_bytes((torn / LEARNER).read_bytes()[:10])  # the driver died mid-upload
    events = tmp_path / "events.jsonl"
    assert _restore(trial, recorded=False, events=events) is None
    assert [e["event"] for e in _events(events)] == ["checkpoint_skipped"]
    # Tune recorded one that is not there at all: named, not a silent restart
    with pytest.raises(CorruptCheckpoint, match="Tune recorded a checkpoint of this trial but none is there"):
        _restore(tmp_path / "empty")


def test_learner_state_round_trips_through_weights_only_loading(tmp_path):
    from workers.credit import CreditConfig
    from workers.learner.config import LearnerConfig
    from workers.learner.inputs import LearnerBatch, RunSettings
    from workers.learner.learner import Learner
    from workers.models.loading import build_tiny_model

    model = str(build_tiny_model(tmp_path / "tiny", seed=0))
    cfg = LearnerConfig().model_dump()
    cfg["optim"]["lr"] = 1e-2

    def learner() -> Learner:
        return Learner(model, learner=LearnerConfig.model_validate(cfg), credit=CreditConfig(),
                       run=RunSettings(seed=0, total_steps=4))

    a = learner()
    tok = a.tokenizer
    prompt = tok("what is 3 + 4 ?")["input_ids"]
    responses = [tok(t)["input_ids"] + [tok.eos_token_id] for t in ("7", "8", "the answer is 7", "3")]
    a.train_step(LearnerBatch(prompt_ids=[prompt] * 4, response_ids=responses,
                              rollout_logprobs=[[-1.0] * len(r) for r in responses], rewards=[[1.0, 0.0, 1.0, 0.0]],
                              temperature=1.0, sepa_lambda=0.0, step=0))
    blob = a.state_dict()
    state = load_blob(blob, "learner.pt")  # weights_only=True accepts everything the learner saves
    assert state["optimizer"]["state"], "the optimizer has moments after a step"
    b = learner()
    b.load_state_dict(blob, "learner.pt")
    for (n1, p1), (n2, p2) in zip(a.model.named_parameters(), b.model.named_parameters(), strict=True):
        assert n1 == n2 and torch.equal(p1, p2), n1
    sa, sb = a.optimizer.state_dict()["state"], b.optimizer.state_dict()["state"]
    assert sa.keys() == sb.keys() and all(torch.equal(sa[k]["exp_avg"], sb[k]["exp_avg"]) for k in sa)
    assert a.scheduler.state_dict() == b.scheduler.state_dict()
    with pytest.raises(UnsafeCheckpoint, match="^learner.pt: refused"):
        b.load_state_dict(_malicious_blob(tmp_path / "PWNED"), "learner.pt")
    assert not (tmp_path / "PWNED").exists()


def test_a_trial_failing_on_its_checkpoint_is_reported_in_one_line_naming_the_file():
    from ray.exceptions import RayTaskError

    from orchestrator.tune.launch import failure_line

    msg = "/s/c/t/checkpoint_000002/learner.pt: unreadable checkpoint (EOFError: ); no older checkpoint was kept"
    wrapped = RayTaskError("train", "Traceback (most recent call last):\n  ...", CorruptCheckpoint(msg))
    assert failure_line(wrapped.as_instanceof_cause()) == msg
    other = RayTaskError("train", "Traceback ...", ValueError("boom\nsecond line")).as_instanceof_cause()
    assert failure_line(other) == "ValueError: boom"


def test_crafted_shard_metadata_is_refused_by_the_driver_before_any_actor_reads_it(tmp_path):
    """A sharded learner's DCP `.metadata` is a pickle: a sealed checkpoint whose metadata would call os.system
    is refused when the trial looks for its checkpoint (one line naming the file), not skipped, never run."""
    marker = tmp_path / "PWNED"
    trial = tmp_path / "trial"
    _write_checkpoint(trial, 1, 4)
    latest = _write_checkpoint(trial, 2, 9, seal=False)
    (latest / "learner_shards").mkdir()
    (latest / "learner_shards" / ".metadata").write_bytes(pickle.dumps(_Payload(marker)))
    (latest / "learner_shards" / "__0_0.distcp").write_bytes(b"\0" * 64)
    store.seal_checkpoint(latest)
    with pytest.raises(UnsafeCheckpoint) as e:
        _restore(trial)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(f"{latest}/learner_shards/.metadata: refused"), msg
    assert not marker.exists()
