"""A trial's temporary files, on every node, in one folder of its own that goes when the trial does.

Each process of a trial (its driver, each rollout worker, each learner rank) makes `<root>/<role>-<pid>` its temp
dir before it builds anything: `TMPDIR` (inherited by the engine processes it starts: vLLM's `vllm_dist_*` file
store and its sockets) and Python's `tempfile` (the policy folder `rollout_policy_*` of workers/rollout/worker.py,
checkpoint staging). `<root>` is `<base>/co-scratch/<trial, 16 chars at most>-<hash of where it writes>`, the same
path for every attempt of the trial, so a crash leaves its files in one findable place, and the next process of
the trial to start on that node removes the folders of processes that are gone (a killed attempt's). A process
removes its own folder when it exits, and the driver the whole root when the trial ends or fails
(orchestrator/trial/loop.py); a shared pool's root goes when the campaign driver stops the pool.

Caches that every trial on a node shares stay in the node's temp dir (`node_temp_dir`): the locally built models
(workers/tiny/) and torch's compiled kernels. Following `TMPDIR` into a trial's folder, they would be rebuilt by
every process of every trial (a tiny model is about a CPU-minute, a kernel compile seconds).
"""

from __future__ import annotations

import atexit
import getpass
import hashlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

FOLDER = "co-scratch"
SOCKET_ROOM = 107 - 37  # vLLM's engine sockets are <temp dir>/<uuid4>, and a Unix socket path holds 107 bytes
NODE_TMP = "CO_NODE_TMPDIR"  # set by the first `enter_scratch` of a process, inherited by what it starts


def node_temp_dir() -> str:
    """This node's temp dir as it was before any trial's scratch folder replaced it (module docstring)."""
    return os.environ.get(NODE_TMP) or tempfile.gettempdir()


def scratch_root(base: str | None, trial: str, key: str) -> str:
    """The trial's scratch root under `base` (None: this node's temp dir); `key` tells trials of one name apart
    (the directory it writes to)."""
    digest = hashlib.sha256(f"{trial}\n{key}".encode()).hexdigest()[:8]
    return str(Path(base or tempfile.gettempdir()) / FOLDER / f"{trial[:16]}-{digest}")  # short: SOCKET_ROOM


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return True


def keep_node_caches() -> None:
    """Pin the caches every trial on the node shares (module docstring) to the node's temp dir, for this process
    and what it starts; call before this process's temp dir moves."""
    node = node_temp_dir()
    os.environ.setdefault(NODE_TMP, node)
    # torch's own default is <temp dir>/torchinductor_<user>
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(Path(node) / f"torchinductor_{getpass.getuser()}"))


def enter_scratch(root: str, role: str) -> Path:
    """This process's folder under `root`, made its temp dir (`TMPDIR` and `tempfile`); first the folders of
    this trial's processes that are gone are removed."""
    keep_node_caches()
    here = Path(root)
    here.mkdir(parents=True, exist_ok=True)
    for old in here.iterdir():
        pid = old.name.rsplit("-", 1)[-1]
        if pid.isdigit() and int(pid) != os.getpid() and not _alive(int(pid)):
            shutil.rmtree(old, ignore_errors=True)
    mine = here / f"{role}-{os.getpid()}"
    mine.mkdir(exist_ok=True)
    atexit.register(shutil.rmtree, mine, ignore_errors=True)  # a process that exits (not SIGKILLed) cleans up
    os.environ["TMPDIR"] = str(mine)
    tempfile.tempdir = str(mine)
    if len(str(mine)) > SOCKET_ROOM:  # a deep base: the engine's sockets (only them) in /tmp, as vLLM's default
        os.environ["VLLM_RPC_BASE_PATH"] = "/tmp"
    return mine


@contextmanager
def trial_scratch(root: str) -> Iterator[Path]:
    """The driver's side: its own temp files under `root` while the trial runs; `root` removed when it ends or
    fails (and its parent folder, once empty), this process's temp dir restored."""
    before = tempfile.tempdir, os.environ.get("TMPDIR")
    try:
        yield enter_scratch(root, "driver")
    finally:
        tempfile.tempdir = before[0]
        if before[1] is None:
            os.environ.pop("TMPDIR", None)
        else:
            os.environ["TMPDIR"] = before[1]
        remove_scratch(root)


def remove_scratch(root: str) -> None:
    """`root` and everything under it, then its parent folder (`FOLDER`) once no other root is in it."""
    shutil.rmtree(root, ignore_errors=True)
    try:
        Path(root).parent.rmdir()
    except OSError:  # another trial's or pool's root is there, or it is gone
        pass
