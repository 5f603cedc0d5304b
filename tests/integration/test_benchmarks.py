"""Every script in benchmarks/ runs end to end at its smallest size, so none rots unnoticed when the code it
drives changes (a benchmark is only run by hand otherwise).

Each runs in a subprocess of its own session, as a user would run it: it must exit 0, print its ratio of ours
to the reference as the last line ("ratio A/B ...: <number> ..."), and leave no process behind. The scripts
that use Ray join the session's local Ray through `RAY_ADDRESS`, as they would join a running cluster (a Ray
start each is 8-10 CPU-seconds; without `RAY_ADDRESS` each starts a private one).
Timings are not checked: at these sizes they mean nothing.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parents[2]
RATIO_LINE = re.compile(r"^ratio [^:]*/[^:]*: .*\d")
TINY = ["--prompts", "2", "--n", "2", "--max-tokens", "4"]  # the engine scripts' smallest batch
LEARNER = ["--groups", "1", "--group", "2", "--prompt-len", "8", "--response-len", "8", "--reps", "1"]

SCRIPTS = {  # name: (script, smallest flags that still reach every part of it)
    "credit": ("credit.py", ["--groups", "2", "--group", "4", "--tokens", "64", "--repeats", "1"]),
    "envs": ("envs.py", ["--levels", "10"]),
    "learner": ("learner.py", LEARNER),
    "learner_ranks": ("learner.py", [*LEARNER, "--ranks", "2"]),
    "rollout": ("rollout.py", [*TINY, "--reps", "1"]),
    "engine_start": ("engine_start.py", [*TINY, "--reps", "1"]),
    "step": ("step.py", [*TINY, "--reps", "2", "--warmup", "0"]),  # 2 reps: both orders, an adapter load
    "async": ("async.py", [*TINY, "--steps", "1", "--blocks", "1", "--ks", "0", "2"]),  # k = 2: a queue of two
    "colocate": ("colocate.py", [*TINY, "--steps", "1", "--blocks", "1"]),
    # one pool of 1 slot vs 1 separate trial, one step: two processes of ~10 CPU-s each, no Ray
    "shared": ("shared.py", ["--ks", "1", "--steps", "1", "--prompts", "2", "--n", "2", "--max-tokens", "4"]),
    "shared_learner": ("shared_learner.py", ["--k", "2", *LEARNER]),
    # the demo's first trial's worker and learner actors (its model, task and CPUs: --campaign): 1, 2, 4 sequences
    # decoding, a 2 x 2 learner batch, one trial step, the lengths recorded (the --model path's trial: a unit test)
    "calibrate": ("calibrate.py", ["--quick", "--campaign", str(ROOT / "campaigns/demo.yaml"), "--out",
                                   "calibration.yaml"]),
}


CLAIMS = {  # lines a script prints that the suite holds it to
    # vLLM in the actor's process and vLLM in its own processes sample the same tokens with the same log-probs (a
    # one_step_off trial's CPU default is the second: orchestrator/trial/actors/start.py:rollout_engine)
    "engine_start": ["same tokens from both engines: True, their log-probs within 1e-05: True"],
    # the demo's trial measured as the demo runs it: its lengths go into the file plan reads
    "calibrate": ["lengths (tiny-reasoner on chain): ", "wrote calibration.yaml"],
}


def _session_processes(sid: int) -> list[str]:
    """Processes (pid and command) still in session `sid`."""
    out = subprocess.run(["ps", "-eo", "pid=,sid=,args="], capture_output=True, text=True, check=True).stdout
    rows = [line.split(None, 2) for line in out.splitlines()]
    return [f"{r[0]} {r[2] if len(r) > 2 else ''}" for r in rows if len(r) >= 2 and r[1] == str(sid)]


@pytest.mark.parametrize("name", list(SCRIPTS))
def test_benchmark_runs_at_its_smallest_size(name, ray_local, tmp_path):
    script, flags = SCRIPTS[name]
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
           "VLLM_CPU_KVCACHE_SPACE": "1", "TOKENIZERS_PARALLELISM": "false", "RAY_USAGE_STATS_ENABLED": "0",
           "RAY_ADDRESS": ray_local.get_runtime_context().gcs_address}
    proc = subprocess.Popen([sys.executable, str(ROOT / "benchmarks" / script), *flags], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace",
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=840)
        deadline = time.monotonic() + 30  # Ray's processes take a moment to exit after ray.shutdown()
        while (left := _session_processes(proc.pid)) and time.monotonic() < deadline:
            time.sleep(0.5)
    finally:
        if proc.poll() is None:
            proc.kill()
        leaked = _session_processes(proc.pid)
        if leaked:
            os.killpg(proc.pid, signal.SIGKILL)
    lines = [line for line in out.splitlines() if line.strip()]
    assert proc.returncode == 0, "\n".join(lines[-40:])
    assert lines and RATIO_LINE.match(lines[-1]), "\n".join(lines[-10:])
    for claim in CLAIMS.get(name, ()):  # what a script checks beside its timing
        assert claim in out, "\n".join(lines[-10:])
    assert not left, f"{script} left processes behind: {left}"
