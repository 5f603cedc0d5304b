"""A trial's scratch folder (workers/sync/scratch.py): each process's temp files under it, a gone process's folder
removed by the next one to start, the whole folder removed when the trial ends or fails."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from workers.sync.scratch import (
    FOLDER,
    SOCKET_ROOM,
    enter_scratch,
    remove_scratch,
    scratch_root,
    trial_scratch,
)


def test_the_root_is_the_same_for_every_attempt_and_apart_for_trials_of_one_name(tmp_path):
    a = scratch_root(str(tmp_path), "C1_s0", "/runs/x/trials/C1_s0")
    assert a == scratch_root(str(tmp_path), "C1_s0", "/runs/x/trials/C1_s0")
    assert a != scratch_root(str(tmp_path), "C1_s0", "/runs/y/trials/C1_s0")
    assert Path(a).parent == tmp_path / FOLDER and Path(a).name.startswith("C1_s0-")
    assert Path(scratch_root(None, "t", "k")).parent.parent == Path(tempfile.gettempdir())
    deepest = Path(scratch_root("/tmp", "a_long_trial_name_" * 3, "k")) / f"learner12-{2**22}"
    assert len(str(deepest)) <= SOCKET_ROOM  # room for vLLM's sockets under the default base


def test_a_base_too_deep_for_the_engine_sockets_puts_only_them_in_tmp(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", tempfile.tempdir)
    monkeypatch.setenv("TMPDIR", os.environ.get("TMPDIR", "/tmp"))
    monkeypatch.delenv("VLLM_RPC_BASE_PATH", raising=False)
    short = tempfile.mkdtemp(prefix="s", dir="/tmp")
    try:
        enter_scratch(scratch_root(short, "t", "k"), "rollout")
        assert "VLLM_RPC_BASE_PATH" not in os.environ
    finally:
        shutil.rmtree(short)
    deep = tmp_path / ("d" * 60)
    mine = enter_scratch(scratch_root(str(deep), "t", "k"), "rollout")
    assert os.environ["VLLM_RPC_BASE_PATH"] == "/tmp" and tempfile.gettempdir() == str(mine)


def test_a_process_temp_files_go_under_the_trial_and_a_gone_process_folder_is_removed(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", tempfile.tempdir)
    monkeypatch.setenv("TMPDIR", os.environ.get("TMPDIR", "/tmp"))
    root = tmp_path / "root"
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    (root / f"rollout-{gone.stdout.strip()}" / "rollout_policy_x").mkdir(parents=True)  # a killed attempt's
    (root / f"learner0-{os.getppid()}").mkdir()  # a live process's: kept
    mine = enter_scratch(str(root), "rollout")
    assert mine == root / f"rollout-{os.getpid()}" and os.environ["TMPDIR"] == str(mine)
    assert Path(tempfile.mkdtemp(prefix="rollout_policy_")).parent == mine
    assert sorted(p.name for p in root.iterdir()) == sorted([mine.name, f"learner0-{os.getppid()}"])
    child = subprocess.run([sys.executable, "-c", "import tempfile; print(tempfile.gettempdir())"],
                           capture_output=True, text=True)
    assert child.stdout.strip() == str(mine)  # an engine process it starts writes there too


@pytest.mark.parametrize("fails", [False, True])
def test_the_driver_removes_the_trial_folder_when_it_ends_or_fails(tmp_path, fails):
    before = tempfile.gettempdir(), os.environ.get("TMPDIR")
    root = scratch_root(str(tmp_path), "t", "k")
    with pytest.raises(RuntimeError) if fails else contextlib.nullcontext():
        with trial_scratch(root) as mine:
            Path(tempfile.mkdtemp(prefix="x")).joinpath("f").write_text("x")
            (Path(root) / "rollout-1").mkdir()  # an actor's folder on this node
            assert mine.parent == Path(root)
            if fails:
                raise RuntimeError("step failed")
    assert list(tmp_path.iterdir()) == []  # the root and its parent folder are gone
    assert (tempfile.gettempdir(), os.environ.get("TMPDIR")) == before


def test_a_pool_root_removed_beside_a_running_trial_keeps_the_trial_root_and_the_last_takes_the_folder(tmp_path):
    pool, trial = scratch_root(str(tmp_path), "pool", "p"), scratch_root(str(tmp_path), "t", "k")
    for root in (pool, trial):
        (Path(root) / "pool-engine-1").mkdir(parents=True)
    remove_scratch(pool)
    assert [p.name for p in (tmp_path / FOLDER).iterdir()] == [Path(trial).name]
    remove_scratch(trial)
    assert list(tmp_path.iterdir()) == []
    remove_scratch(trial)  # gone already: nothing to do


def test_caches_every_trial_shares_stay_in_the_node_temp_dir(tmp_path):
    """The tiny models and torch's compiled kernels are found where they were before a process entered a trial's
    scratch folder, in that process and in what it starts (nested scratch too): otherwise every process of every
    trial rebuilds them (a fresh process: the environment is the test's to change)."""
    code = """
import os, subprocess, sys, tempfile
from torch._inductor.runtime.cache_dir_utils import cache_dir
from workers.sync.scratch import enter_scratch, scratch_root
from workers.tiny.local import local_model_path
from workers.tiny.reasoner import reasoner_dir
import workers.tiny.local as local
seen = lambda: (str(reasoner_dir(0)), cache_dir())
before = seen()
enter_scratch(scratch_root(None, "t", "k"), "driver")
assert tempfile.gettempdir() != os.path.dirname(before[0])  # the temp dir did move
inner = enter_scratch(scratch_root(None, "t", "k2"), "rollout")  # a worker's root under the driver's temp dir
print(before == seen(), end=" ")
sys.stdout.flush()
subprocess.run([sys.executable, "-c", "from workers.tiny.reasoner import reasoner_dir; "
                "from torch._inductor.runtime.cache_dir_utils import cache_dir; "
                f"print((str(reasoner_dir(0)), cache_dir()) == {before!r})"], check=True)
"""
    env = {k: v for k, v in os.environ.items() if k not in ("CO_NODE_TMPDIR", "TORCHINDUCTOR_CACHE_DIR")}
    env["TMPDIR"] = str(tmp_path)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["True", "True"], out.stderr
