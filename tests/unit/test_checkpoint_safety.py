"""Checkpoints are loaded with weights_only=True: a crafted pickle is refused (one line naming the file) and never
runs; a truncated or damaged latest checkpoint falls back to the previous one Tune kept, said in events.jsonl;
with none left the trial fails with one line naming the file."""

from __future__ import annotations

import io
import json
import os
import shutil
from pathlib import Path

import pytest
import torch

from orchestrator import storage as store
from workers.checkpoint import CorruptCheckpoint, UnsafeCheckpoint, dump_blob, load_blob

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


class _Ckpt:
    """What restore_checkpoint reads from a `ray.tune.Checkpoint`: a pyarrow filesystem and a path."""

    def __init__(self, path: Path):
        import pyarrow.fs

        self.filesystem, self.path = pyarrow.fs.LocalFileSystem(), str(path)


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
            store.restore_checkpoint(_Ckpt(latest), events=str(events))
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
    got = store.restore_checkpoint(_Ckpt(latest), events=str(events))
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
    got = store.restore_checkpoint(_Ckpt(latest))
    assert got.state["step"] == 4 and got.skipped[0][0] == str(latest)
    # a damaged state file or metrics file is caught the same way
    for name, junk in ((STATE, b'{"step": 9, "adapter_ver'), (METRICS, b"")):
        other = _write_checkpoint(tmp_path / f"t_{name}", 1, 2)
        _write_checkpoint(tmp_path / f"t_{name}", 0, 1)
        (other / name).write_bytes(junk)
        r = store.restore_checkpoint(_Ckpt(other))
        assert r.state["step"] == 1 and f"{other}/{name}" in r.skipped[0][1]


def test_no_usable_checkpoint_is_one_line_naming_the_file_never_a_restart_from_zero(tmp_path):
    trial = tmp_path / "trial"
    only = _write_checkpoint(trial, 3, 14)
    (only / LEARNER).write_bytes(b"")
    events = tmp_path / "events.jsonl"
    with pytest.raises(CorruptCheckpoint) as e:
        store.restore_checkpoint(_Ckpt(only), events=str(events))
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
        store.restore_checkpoint(_Ckpt(only))


def test_checkpoints_without_manifest_still_restore(tmp_path):
    latest = _write_checkpoint(tmp_path / "trial", 0, 3, seal=False)
    assert store.restore_checkpoint(_Ckpt(latest)).state["step"] == 3


def test_tune_checkpoint_objects_work_as_they_are(tmp_path):
    from ray import tune

    d = _write_checkpoint(tmp_path / "trial", 7, 5)
    got = store.restore_checkpoint(tune.Checkpoint.from_directory(str(d)))
    assert got.state["step"] == 5 and got.location == str(d)


def test_learner_state_round_trips_through_weights_only_loading(tmp_path):
    from orchestrator.config import LearnerConfig
    from workers.credit import CreditConfig
    from workers.learner import Learner
    from workers.models import build_tiny_model

    model = str(build_tiny_model(tmp_path / "tiny", seed=0))
    cfg = LearnerConfig().model_dump()
    cfg["optim"]["lr"] = 1e-2

    def learner() -> Learner:
        return Learner(model, learner=cfg, credit=CreditConfig().model_dump(), seed=0, total_steps=4)

    a = learner()
    tok = a.tokenizer
    prompt = tok("what is 3 + 4 ?")["input_ids"]
    responses = [tok(t)["input_ids"] + [tok.eos_token_id] for t in ("7", "8", "the answer is 7", "3")]
    a.train_step({"prompt_ids": [prompt] * 4, "response_ids": responses,
                  "rollout_logprobs": [[-1.0] * len(r) for r in responses], "rewards": [[1.0, 0.0, 1.0, 0.0]],
                  "temperature": 1.0, "sepa_lambda": 0.0, "step": 0})
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

    from orchestrator.launch import failure_line

    msg = "/s/c/t/checkpoint_000002/learner.pt: unreadable checkpoint (EOFError: ); no older checkpoint was kept"
    wrapped = RayTaskError("train", "Traceback (most recent call last):\n  ...", CorruptCheckpoint(msg))
    assert failure_line(wrapped.as_instanceof_cause()) == msg
    other = RayTaskError("train", "Traceback ...", ValueError("boom\nsecond line")).as_instanceof_cause()
    assert failure_line(other) == "ValueError: boom"
