"""Settings every test session shares."""

from __future__ import annotations

import os

# Ray starts its worker processes at niceness 15 unless told otherwise. Beside the tests' own processes at 0 (the
# other xdist worker's in-process learners, the Makefile's background model builds) a Ray actor then gets a few
# percent of a core: an engine that starts in 30 s alone took over 10 minutes in a fresh-clone run and failed its
# fixture's 600 s limit. Equal niceness shares the 2 cores fairly. Inherited by every local Ray a test starts,
# in this process or in a subprocess (`python -m orchestrator run`, the benchmarks, the job round trip).
os.environ.setdefault("RAY_worker_niceness", "0")


def pytest_collection_finish(session) -> None:
    """The test modules are imported: the session collects at the default thresholds from here on (a test
    session runs for many minutes; workers/startup.py)."""
    from orchestrator import imports_done

    imports_done()
