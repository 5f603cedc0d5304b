"""Settings every test session shares."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from pathlib import Path

# Ray starts its worker processes at niceness 15 unless told otherwise. Beside the tests' own processes at 0 (the
# other xdist worker's in-process learners, the Makefile's background model builds) a Ray actor then gets a few
# percent of a core: an engine that starts in 30 s alone took over 10 minutes in a fresh-clone run and failed its
# fixture's 600 s limit. Equal niceness shares the 2 cores fairly. Inherited by every local Ray a test starts,
# in this process or in a subprocess (`python -m orchestrator run`, the benchmarks, the job round trip).
os.environ.setdefault("RAY_worker_niceness", "0")
# An idle local Ray burns ~5 CPU-seconds a minute (measured on the 2-core machine), half of it in the two worker
# processes it prestarts for the first driver (ray::IDLE, never used: every actor here asks for a process of its
# own) and in the metrics the processes export, which no test reads. The suite keeps 2-4 Ray instances up for
# its whole run, on 2 cores that are busy throughout. Off for every Ray a test starts (inherited as above):
# 5.2 -> 2.7 CPU-s a minute idle.
os.environ.setdefault("RAY_prestart_worker_first_driver", "0")
os.environ.setdefault("RAY_enable_metrics_collection", "0")
# One torch/OpenMP thread per process unless OMP_NUM_THREADS says otherwise, for this process, its xdist workers and
# every process a test starts (Ray leaves a set OMP_NUM_THREADS alone, so the suite's actors inherit it too; it
# would give an actor one per whole CPU it holds). With two on the 2-core machine, a process's second thread
# spin-waits after each parallel region: a vLLM-CPU engine's decode took 7.4 CPU-s against 3.75 for the same
# 3.75 s of wall, CPU the other pytest worker needed. Measured on two workers: the unit suite 130 -> 91 s,
# tests/integration/learner and rollout 217 -> 105 s (407 -> 167 CPU-s).
os.environ.setdefault("OMP_NUM_THREADS", "1")

SESSION_TMP, MARK = "CO_TEST_TMPDIR", ".co-test-session"


def _session_temp_dir() -> None:
    """Every temp file of the session in one folder of its own, removed when the session ends.

    Actors a test kills leave what they made (a worker's policy folder, vLLM's file store and sockets): a run
    left ~70 such entries in the temp dir, every run. Trials clean up through their scratch folders
    (workers/sync/scratch.py), but a test's own actors have none. So the session's first process (xdist's workers
    and whatever a test starts inherit TMPDIR) makes the session's folder the temp dir, keeping where they were
    what outlives a session: the tiny models and compiled kernels (caches), pytest's tmp_path folders (its last
    three sessions, for a look after a failure) and Ray's logs. A session killed before it could remove its folder
    has it removed by the next one (its pid, in MARK, gone). The name is short: a trial's scratch folder and its
    engine's sockets nest under it (SOCKET_ROOM there)."""
    if os.environ.get(SESSION_TMP):
        return
    import psutil

    from workers.sync.scratch import keep_node_caches

    node = tempfile.gettempdir()
    keep_node_caches()  # the tiny models and compiled kernels, as a trial's processes keep them
    os.environ.setdefault("PYTEST_DEBUG_TEMPROOT", node)
    os.environ.setdefault("RAY_TMPDIR", node)  # Ray's logs: <node>/ray/session_*
    for mark in Path(node).glob(f"cot*/{MARK}"):
        pid = mark.read_text().strip()
        if pid.isdigit() and not psutil.pid_exists(int(pid)):
            shutil.rmtree(mark.parent, ignore_errors=True)
    session = tempfile.mkdtemp(prefix="cot", dir=node)
    Path(session, MARK).write_text(str(os.getpid()))
    os.environ[SESSION_TMP] = os.environ["TMPDIR"] = tempfile.tempdir = session
    atexit.register(shutil.rmtree, session, ignore_errors=True)


_session_temp_dir()


def pytest_collection_finish(session) -> None:
    """The test modules are imported: the session collects at the default thresholds from here on (a test
    session runs for many minutes; workers/startup.py)."""
    from orchestrator import imports_done

    imports_done()
