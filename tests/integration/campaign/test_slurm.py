"""infra/slurm/campaign.sbatch for real, on a single-node SLURM (slurm_cluster.py: Debian's slurmctld + slurmd +
munge in a private PID namespace): `ray symmetric-run` starts Ray in the allocation and runs the campaign on it, the
preemption signal (`scancel --batch --signal=USR1`, what `--signal=B:USR1@...` sends ahead of the time limit)
stops the campaign and requeues the job, and the requeued job (same id) resumes from the newest checkpoint: the
trial's metrics hold each step exactly once. One campaign run proves both (the CI budget)."""

from __future__ import annotations

import json
import os
import re
import secrets
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.integration.campaign.slurm_cluster import Slurm, available, free_ports

pytestmark = [pytest.mark.integration, pytest.mark.slurm, pytest.mark.skipif(available() is not None, reason=str(available()))]

ROOT = Path(__file__).resolve().parents[3]
STEPS = 6  # steps take a fraction of a second here: a few more than 2 so the signal lands mid-run


@pytest.fixture
def slurm():
    cluster = Slurm.start()
    try:
        yield cluster
    finally:
        cluster.stop()


def _jsonl(path: Path) -> list[dict]:
    try:
        return [json.loads(ln) for ln in path.read_text().splitlines() if ln.strip()]
    except (FileNotFoundError, json.JSONDecodeError):
        return []


def _job(slurm: Slurm, job: str) -> dict[str, str]:
    out = slurm.run(["scontrol", "show", "job", job, "--oneliner"], check=False).stdout
    return dict(re.findall(r"(\w+)=(\S*)", out))


def _until(what: str, ready, slurm: Slurm, job: str, log: Path, limit_s: float = 600) -> None:
    deadline = time.monotonic() + limit_s
    while not ready():
        state = _job(slurm, job).get("JobState")
        if time.monotonic() > deadline or state in ("FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL"):
            text = log.read_text(errors="replace") if log.exists() else ""
            raise AssertionError(f"{what}: not reached (job {state}, limit {limit_s:.0f} s)\n{text[-6000:]}\n"
                                 f"{slurm.logs()}")
        time.sleep(0.2)


def test_the_sbatch_script_runs_a_campaign_and_a_requeue_resumes_it_without_repeating_a_step(slurm, tmp_path):
    store = tmp_path / "store"
    campaign = tmp_path / "slurm_ci.yaml"
    campaign.write_text(yaml.safe_dump({
        "name": "slurm_ci", "storage": str(store), "seeds": [0], "conditions": {"A": {}},
        "base": {"steps": STEPS, "model": {"name": "tiny"}, "task": {"name": "arithmetic"}, "eval": {"every": 0},
                 "rollout": {"prompts_per_step": 4, "n": 4, "max_tokens": 4},
                 "checkpoint": {"every": 1, "keep": 2}},
        "resources": {"rollout_workers": 1, "worker_cpus": 1, "learner_cpus": 1, "driver_cpus": 0.5},
        "wandb": {"mode": "disabled"}}))
    token = slurm.dir / "ray_token"
    token.write_text(secrets.token_hex(32))
    gcs, *ports = free_ports(7)
    env = {**slurm.env, "CAMPAIGN": str(campaign), "ORCHESTRATOR_STORAGE": str(store), "RAY_PORT": str(gcs),
           "RAY_AUTH_TOKEN_PATH": str(token), "RAY_TMPDIR": str(slurm.dir), "RAY_USAGE_STATS_ENABLED": "0",
           # Ray's other ports, free ones: the host network is shared with other tests' Rays
           "RAY_START_ARGS": "--include-dashboard=false --dashboard-port={} --dashboard-agent-listen-port={} "
                             "--dashboard-agent-grpc-port={} --runtime-env-agent-port={} --metrics-export-port={} "
                             "--ray-client-server-port={}".format(*ports),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
           "PYTHONPATH": str(ROOT), "VLLM_CPU_KVCACHE_SPACE": "1", "TOKENIZERS_PARALLELISM": "false"}
    for key in ("RAY_ADDRESS", "RAY_AUTH_TOKEN", "WANDB_MODE"):
        env.pop(key, None)
    log = tmp_path / "job.out"
    # the script's #SBATCH lines, sized down to this node: 1 node, its 2 (count-only) GPUs, a short limit
    job = slurm.run(["sbatch", "--parsable", "--nodes=1", "--gpus-per-node=2", "--time=30", f"--output={log}",
                     str(ROOT / "infra" / "slurm" / "campaign.sbatch")], env=env, cwd=ROOT).stdout.strip()

    trial = store / "slurm_ci" / "trials" / "A_s0"
    _until("step 0", lambda: len(_jsonl(trial / "metrics.jsonl")) >= 1, slurm, job, log)
    slurm.run(["scancel", "--batch", "--signal=USR1", job])
    # SLURM holds a requeued job for 2 minutes (BeginTime); the test waits 10 s of them. Not none: slurmd refuses a
    # launch whose credential is not newer than the kill's revocation ("Job 1 already killed, do not launch").
    _until("the requeue", lambda: _job(slurm, job).get("Reason") == "BeginTime", slurm, job, log)
    slurm.run(["scontrol", "update", f"JobId={job}", "StartTime=now+10"])
    _until("the requeued job's end", lambda: _job(slurm, job).get("JobState") == "COMPLETED", slurm, job, log)

    state, text = _job(slurm, job), log.read_text(errors="replace")
    runs = "".join(ln for ln in text.splitlines(keepends=True) if "scripts.py" not in ln)[-6000:]  # not ray stop's
    assert state["JobState"] == "COMPLETED" and state["Restarts"] == "1", f"{state}\n{runs}\n{slurm.logs()}"
    assert "signal: stopping the campaign and requeueing" in text and "restart 1" in text, runs
    assert "resuming campaign slurm_ci" in text, runs
    rows = _jsonl(trial / "metrics.jsonl")
    assert [r["step"] for r in rows] == list(range(STEPS)), runs  # each step exactly once
    starts = [e["from_step"] for e in _jsonl(trial / "events.jsonl") if e["event"] == "start"]
    assert len(starts) == 2 and starts[0] == 0 and starts[1] >= 1, starts  # resumed from a checkpoint, not step 0
