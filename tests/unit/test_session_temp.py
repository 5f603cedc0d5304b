"""The test session's temp folder (tests/conftest.py): everything a session's processes leave in the temp dir goes
with the session; the caches that outlive it stay in the temp dir; a killed session's folder goes with the next."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

CONFTEST = Path(__file__).resolve().parents[1] / "conftest.py"
# a session's first process: enters the folder, leaves a file there and in a child process, says where things go
SESSION = f"""
import os, runpy, subprocess, sys, tempfile
runpy.run_path({str(CONFTEST)!r})
open(os.path.join(tempfile.gettempdir(), "left"), "w").close()
subprocess.run([sys.executable, "-c", "import tempfile; tempfile.mkdtemp(prefix='rollout_policy_')"], check=True)
print(tempfile.gettempdir(), os.environ["CO_NODE_TMPDIR"], os.environ["RAY_TMPDIR"],
      os.environ["PYTEST_DEBUG_TEMPROOT"])
"""


def _session(tmp: Path) -> list[str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("CO_TEST_TMPDIR", "CO_NODE_TMPDIR", "RAY_TMPDIR", "PYTEST_DEBUG_TEMPROOT",
                        "TORCHINDUCTOR_CACHE_DIR")}
    out = subprocess.run([sys.executable, "-c", SESSION], env={**env, "TMPDIR": str(tmp)}, capture_output=True,
                         text=True, check=True)
    return out.stdout.split()


def test_a_session_leaves_nothing_but_the_caches_and_a_killed_session_folder_goes_with_the_next(tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    for name, pid in (("cotkilled", dead.stdout.strip()), ("cotrunning", str(os.getpid()))):
        (tmp_path / name).mkdir()
        (tmp_path / name / ".co-test-session").write_text(pid)
    session, *kept = _session(tmp_path)
    assert Path(session).parent == tmp_path and Path(session).name.startswith("cot")
    assert kept == [str(tmp_path)] * 3  # the tiny models, Ray's logs, pytest's tmp_path folders
    # the killed session's folder is gone, the running one's kept, and this session's went when it ended
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cotrunning"]
