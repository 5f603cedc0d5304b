"""The cluster path end to end: a Ray head of our own (`ray start --head`, token auth, free ports, a temp dir),
`python -m orchestrator submit` runs a campaign as a Ray job (its one trial trains the countdown example, a task
plugin that reaches the job's processes through plugins.paths), a second submit while it runs starts nothing, the
job is stopped mid-run, a re-submit resumes it, and the trial ends with each step exactly once. The campaign runs on
a shared base (`resources.shared_base`): the stop takes its pool down and the re-submitted campaign starts a new
pool, on which the trial resumes. (One trial: the campaign driver resumes each trial the same way, and
test_campaign.py resumes a killed campaign of two separate trials.)

Only the processes this test started are stopped (never a machine-wide `ray stop`: other Ray clusters may be
running on the same machine).
"""

from __future__ import annotations

import gzip
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest

ROOT = Path(__file__).resolve().parents[3]
CAMPAIGN = "tests/integration/campaign/job_roundtrip.yaml"
STEPS = 24  # base.steps in job_roundtrip.yaml: steps take ~0.2 s, the stop must land before the end
TRIALS = ("countdown_s0",)

pytestmark = pytest.mark.timeout(1500)  # generous: vLLM engine starts slow on a busy 2-core machine


def _free_ports(n: int) -> list[int]:
    socks = []
    for _ in range(n):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        socks.append(s)
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(ln) for ln in path.read_text().splitlines() if ln.strip()] if path.exists() else []


def _stop_tree(pgid: int) -> None:
    """Terminate the process group `ray start` left behind and every descendant (Ray workers call setsid)."""
    procs: dict[int, psutil.Process] = {}
    for p in psutil.process_iter():
        try:
            if os.getpgid(p.pid) == pgid:
                procs[p.pid] = p
                procs.update({c.pid: c for c in p.children(recursive=True)})
        except (ProcessLookupError, psutil.Error):
            continue
    for p in procs.values():
        try:
            p.send_signal(signal.SIGTERM)
        except psutil.Error:
            pass
    _, alive = psutil.wait_procs(list(procs.values()), timeout=15)
    for p in alive:
        try:
            p.kill()
        except psutil.Error:
            pass


@pytest.fixture
def ray_head():
    """A private Ray head with token auth and the dashboard on localhost; yields (address, env)."""
    tmp = Path(tempfile.mkdtemp(prefix="rt-", dir="/tmp"))  # short: Ray's socket paths must stay < 108 chars
    token = tmp / "auth_token"
    token.write_text(secrets.token_hex(32))
    gcs, dash, client, agent, agent_grpc, env_agent, metrics = _free_ports(7)
    env = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",  # the job's `python`
           "TOKENIZERS_PARALLELISM": "false", "VLLM_CPU_KVCACHE_SPACE": "1", "ROUNDTRIP_STORAGE": str(tmp / "store"),
           "RAY_USAGE_STATS_ENABLED": "0"}
    env.pop("RAY_ADDRESS", None)
    env.pop("RAY_AUTH_TOKEN", None)
    ray_bin = str(Path(sys.executable).parent / "ray")
    start = subprocess.Popen(
        [ray_bin, "start", "--head", f"--port={gcs}", "--dashboard-host=127.0.0.1", f"--dashboard-port={dash}",
         f"--ray-client-server-port={client}", f"--dashboard-agent-listen-port={agent}",
         f"--dashboard-agent-grpc-port={agent_grpc}", f"--runtime-env-agent-port={env_agent}",
         f"--metrics-export-port={metrics}", f"--temp-dir={tmp / 'ray'}", "--num-cpus=6", "--num-gpus=0",
         "--disable-usage-stats"],
        env=env, cwd=tmp, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace",
        start_new_session=True)
    try:
        out, _ = start.communicate(timeout=120)
        assert start.returncode == 0, out[-3000:]
        yield f"http://127.0.0.1:{dash}", env, tmp
    finally:
        if start.poll() is None:
            start.kill()
        _stop_tree(start.pid)  # start_new_session: the pgid is `ray start`'s pid; its daemons keep it
        shutil.rmtree(tmp, ignore_errors=True)


def _submit(env: dict, address: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "orchestrator", "submit", CAMPAIGN, "--address", address],
                          cwd=cwd, env=env, capture_output=True, text=True, errors="replace", timeout=180)


def _snapshot(dest: Path) -> Path:
    """The checkout as the jobs upload it, frozen: both submissions must ship the same code and campaign (an
    edit to the tree between them would be a different campaign, which `run` rightly refuses to resume)."""
    shutil.copytree(ROOT, dest, ignore=shutil.ignore_patterns(
        ".git", ".venv", "results", "__pycache__", "*.egg-info", ".pytest_cache", ".hypothesis", ".ruff_cache",
        "wandb", "build"))
    return dest


def test_job_stop_and_resubmit_resumes_every_trial_exactly_once(ray_head, monkeypatch):
    address, env, tmp = ray_head
    for key in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN_PATH"):
        monkeypatch.setenv(key, env[key])
    monkeypatch.delenv("RAY_AUTH_TOKEN", raising=False)
    from ray.job_submission import JobStatus, JobSubmissionClient

    # the token as an explicit header: Ray caches the token it loaded first in a process, and earlier tests in the
    # same pytest process may have loaded another (or none)
    token = Path(env["RAY_AUTH_TOKEN_PATH"]).read_text().strip()
    client = JobSubmissionClient(address, headers={"Authorization": f"Bearer {token}"})
    repo = _snapshot(tmp / "repo")
    trials = tmp / "store" / "job_roundtrip" / "trials"

    # token auth is on: a wrong token is refused with a one-line error, and nothing is submitted
    wrong = _submit({**env, "RAY_AUTH_TOKEN": "0" * 64, "RAY_AUTH_TOKEN_PATH": ""}, address, repo)
    assert wrong.returncode == 2 and wrong.stderr.startswith("error: "), wrong.stdout + wrong.stderr
    assert client.list_jobs() == []

    first = _submit(env, address, repo)
    assert first.returncode == 0, first.stdout + first.stderr
    jobs = client.list_jobs()
    assert len(jobs) == 1, jobs
    sid = jobs[0].submission_id
    assert sid in first.stdout
    # the countdown plugin travels in the uploaded working dir, named on the job's PYTHONPATH (plugins.paths)
    assert jobs[0].runtime_env["env_vars"]["PYTHONPATH"].startswith("examples/countdown:"), jobs[0].runtime_env

    # a second submit while the job is pending/running names that job and starts nothing
    again = _submit(env, address, repo)
    assert again.returncode == 0 and f"already running as job {sid}" in again.stdout, again.stdout + again.stderr
    assert [j.submission_id for j in client.list_jobs()] == [sid]

    deadline = time.time() + 600
    while max(len(_jsonl(trials / t / "metrics.jsonl")) for t in TRIALS) < 3:  # a step past the first checkpoint (step 1)
        status = client.get_job_status(sid)
        assert status in (JobStatus.PENDING, JobStatus.RUNNING) and time.time() < deadline, \
            f"{status}: {client.get_job_logs(sid)[-3000:]}"
        time.sleep(0.2)
    assert client.stop_job(sid)
    while client.get_job_status(sid) not in (JobStatus.STOPPED, JobStatus.FAILED, JobStatus.SUCCEEDED):
        assert time.time() < deadline
        time.sleep(0.5)
    assert client.get_job_status(sid) == JobStatus.STOPPED
    done_at_stop = {t: len(_jsonl(trials / t / "metrics.jsonl")) for t in TRIALS}
    pools_at_stop = {t: json.loads((trials / t / "placement.json").read_text())["pool"] for t in TRIALS}
    assert min(done_at_stop.values()) < STEPS, "the job finished before the stop; the test needs slower steps"

    second = _submit(env, address, repo)
    assert second.returncode == 0 and "submitted campaign job_roundtrip" in second.stdout, second.stdout + second.stderr
    sid2 = next(j.submission_id for j in client.list_jobs() if j.submission_id != sid)
    deadline = time.time() + 600
    while (status := client.get_job_status(sid2)) not in (JobStatus.STOPPED, JobStatus.FAILED, JobStatus.SUCCEEDED):
        assert time.time() < deadline, client.get_job_logs(sid2)[-3000:]
        time.sleep(1)
    logs = client.get_job_logs(sid2)
    assert status == JobStatus.SUCCEEDED, logs[-3000:]
    assert "resuming campaign job_roundtrip" in logs and "1/1 trials finished" in logs, logs[-3000:]
    assert sorted(j.submission_id for j in client.list_jobs()) == sorted([sid, sid2])

    resumed = 0
    for t in TRIALS:
        assert [r["step"] for r in _jsonl(trials / t / "metrics.jsonl")] == list(range(STEPS)), t  # once each
        events = _jsonl(trials / t / "events.jsonl")
        starts = [e["from_step"] for e in events if e["event"] == "start"]
        assert [e["step"] for e in events if e["event"] == "end"] == [STEPS - 1], (t, events)
        assert starts[0] == 0 and all(s <= done_at_stop[t] for s in starts), (t, starts, done_at_stop)
        resumed += any(s > 0 for s in starts[1:])
    assert resumed >= 1, "no trial resumed from a checkpoint after the stop"
    # the campaign runs on a shared base (job_roundtrip.yaml): the stop took its pool down, the re-submitted
    # campaign started a new one (the same pool id, new actors and processes) and the trial resumed on it
    for t in TRIALS:
        placement = json.loads((trials / t / "placement.json").read_text())
        old, new = pools_at_stop[t], placement["pool"]
        assert placement["placement"] == "shared" and new["id"] == old["id"]
        assert new["learner"]["actor_id"] != old["learner"]["actor_id"] and new["learner"]["pid"] != old["learner"]["pid"]
        assert new["workers"][0]["actor_id"] != old["workers"][0]["actor_id"]
    with gzip.open(trials / "countdown_s0" / "samples" / "step_0.jsonl.gz", "rt") as f:  # the plugin's own problems
        assert all(json.loads(r)["prompt"].startswith("Using the numbers") for r in f)
