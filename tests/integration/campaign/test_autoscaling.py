"""Campaigns on an autoscaling cluster, with Ray's real autoscaler: a private head started with Ray's fake
multi-node provider (RAY_FAKE_CLUSTER=1), whose GPU node type starts at zero workers. Worker "nodes" are local
raylets with logical GPUs; vLLM runs on CPU.

One campaign (one trial start saved over two campaigns: the proofs chain): asking GPUs of a cluster that has
none *yet*, it launches (it used to exit 2), waits for the node the autoscaler adds and runs there; that node is
then killed mid-run (its raylet, as a lost spot node) and the trial resumes on a replacement node from its
checkpoint, every step exactly once.

The head runs in a private PID namespace (`unshare --pid --fork --mount-proc`, root): stopping it ends every
process it started, its autoscaled nodes included, and nothing else (never a machine-wide `ray stop`). Without
unshare, the head's session is tracked by process group as in test_job_roundtrip.py.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest
import yaml

from orchestrator.campaign.expand import load_campaign
from orchestrator.jobs.status import render
from tests.integration.campaign.test_job_roundtrip import _free_ports, _jsonl, _stop_tree

ROOT = Path(__file__).resolve().parents[3]
HEAD_ID = "f" * 51 + "00000"  # the fake provider's head node id
pytestmark = pytest.mark.timeout(1200)


def _cluster_config(gcs_port: int) -> dict:
    """A launcher config for Ray's fake multi-node provider: a CPU head, a GPU type from zero to two nodes."""
    return {
        "cluster_name": "autoscaling-test", "max_workers": 2, "upscaling_speed": 1.0, "idle_timeout_minutes": 5,
        "provider": {"type": "fake_multinode", "use_node_id_as_ip": True, "disable_node_updaters": True,
                     "disable_launch_config_check": True, "gcs_address": f"127.0.0.1:{gcs_port}"},
        "available_node_types": {
            "ray.head.default": {"resources": {"CPU": 2, "GPU": 0}, "node_config": {}, "max_workers": 0},
            "gpu_node": {"resources": {"CPU": 3, "GPU": 2}, "node_config": {}, "min_workers": 0, "max_workers": 2},
        },
        "head_node_type": "ray.head.default", "auth": {"ssh_user": "nobody"}, "file_mounts": {}, "cluster_synced_files": [],
        "file_mounts_sync_continuously": False, "initialization_commands": [], "setup_commands": [],
        "head_setup_commands": [], "worker_setup_commands": [], "head_start_ray_commands": [],
        "worker_start_ray_commands": [],
    }


def _start_head(tmp: Path) -> tuple[subprocess.Popen | None, str, dict, bool]:
    """`ray start --head --block` with the fake provider's autoscaler; (None, ...) when it gave up starting (a
    loaded machine can time Ray's node start out)."""
    gcs, dash, client, agent, agent_grpc, env_agent, metrics = _free_ports(7)
    config = tmp / "cluster.yaml"
    config.write_text(yaml.safe_dump(_cluster_config(gcs)))
    env = {**os.environ, "RAY_FAKE_CLUSTER": "1", "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0",
           "RAY_TMPDIR": str(tmp), "AUTOSCALER_UPDATE_INTERVAL_S": "2", "AUTOSCALER_HEARTBEAT_TIMEOUT_S": "10",
           "RAY_health_check_period_ms": "1000", "RAY_health_check_failure_threshold": "3",  # a lost node: ~3 s
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
           "TOKENIZERS_PARALLELISM": "false", "VLLM_CPU_KVCACHE_SPACE": "1"}
    for key in ("RAY_ADDRESS", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"):
        env.pop(key, None)
    ray_bin = str(Path(sys.executable).parent / "ray")
    cmd = [ray_bin, "start", "--head", "--block", f"--port={gcs}", "--dashboard-host=127.0.0.1",
           f"--dashboard-port={dash}", f"--ray-client-server-port={client}",
           f"--dashboard-agent-listen-port={agent}", f"--dashboard-agent-grpc-port={agent_grpc}",
           f"--runtime-env-agent-port={env_agent}", f"--metrics-export-port={metrics}",
           f"--temp-dir={tmp / 'ray'}", "--num-cpus=2", "--num-gpus=0", f"--autoscaling-config={config}",
           "--disable-usage-stats"]
    private = bool(os.geteuid() == 0 and shutil.which("unshare"))
    if private:
        cmd = ["unshare", "--pid", "--fork", "--mount-proc", *cmd]
    with (tmp / "head.log").open("w") as log:
        head = subprocess.Popen(cmd, env=env, cwd=tmp, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.time() + 180
    while "will now block" not in (tmp / "head.log").read_text():
        if head.poll() is not None or time.time() > deadline:
            _stop_head(head, private)
            return None, "", env, private
        time.sleep(0.5)
    return head, f"127.0.0.1:{gcs}", env, private


def _stop_head(head: subprocess.Popen, private: bool) -> None:
    if private:  # SIGKILL to the namespace's init (unshare's child) ends every process in the namespace
        try:
            for child in psutil.Process(head.pid).children():
                child.kill()
        except psutil.NoSuchProcess:
            pass  # unshare is gone: its namespace went with it
        head.wait(timeout=30)
    else:
        head.send_signal(signal.SIGTERM)
        _stop_tree(head.pid)


@pytest.fixture(scope="module")
def autoscaling_head():
    """Yields (RAY_ADDRESS, env, tmp): a head with 2 CPUs, no GPU, and an autoscaler that adds GPU nodes."""
    tmp = Path(tempfile.mkdtemp(prefix="as-", dir="/tmp"))  # short: Ray's socket paths must stay < 108 chars
    head = None
    try:
        for _ in range(3):
            head, address, env, private = _start_head(tmp)
            if head is not None:
                break
        assert head is not None, (tmp / "head.log").read_text()[-3000:]
        yield address, env, tmp
    finally:
        if head is not None:
            _stop_head(head, private)
        shutil.rmtree(tmp, ignore_errors=True)


def _campaign(tmp: Path, name: str, steps: int) -> Path:
    """One tiny trial asking a GPU for its rollout worker and one for its learner (logical GPUs, CPU vLLM)."""
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump({
        "name": name,
        "base": {"steps": steps, "model": {"name": "tiny"}, "task": {"name": "arithmetic", "max_operand": 4},
                 "rollout": {"prompts_per_step": 4, "n": 4, "max_tokens": 4}, "eval": {"every": 0},
                 "checkpoint": {"every": 2, "keep": 2}},
        "conditions": {"C1": {"credit": {"advantage_mode": "grpo"}}},
        "seeds": [0],
        "resources": {"rollout_workers": 1, "worker_gpus": 1, "learner_gpus": 1, "worker_cpus": 1,
                      "learner_cpus": 1, "driver_cpus": 0.5},
        "max_failures": 2,
        "storage": str(tmp / "store"), "storage_shared": True,  # every fake node is this machine
        "wandb": {"mode": "disabled"},
    }))
    return path


def _run(env: dict, address: str, campaign: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "orchestrator", "run", str(campaign)], cwd=ROOT,
                            env={**env, "RAY_ADDRESS": address}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, errors="replace")


def _node_processes(node_id: str) -> list[psutil.Process]:
    out = []
    for p in psutil.process_iter(["cmdline"]):
        cmd = " ".join(p.info.get("cmdline") or [])
        if f"--node_id={node_id}" in cmd or f"--node-id={node_id}" in cmd:
            out.append(p)
    return out


def test_a_trial_waits_for_the_nodes_the_autoscaler_adds_and_resumes_on_a_replacement_when_one_is_lost(
        autoscaling_head):
    """One campaign: its GPU trial waits for nodes (`status` says so), runs on the node the autoscaler added,
    loses that node past its first checkpoint (every process of the node killed, as a preempted spot node) and
    finishes on a replacement, each step exactly once."""
    address, env, tmp = autoscaling_head
    steps = 8
    campaign = _campaign(tmp, "as_lose", steps=steps)
    trial = tmp / "store" / "as_lose" / "trials" / "C1_s0"
    pending = tmp / "store" / "as_lose" / "pending.json"
    proc = _run(env, address, campaign)
    try:
        deadline = time.time() + 300
        while "C1_s0" not in (pending.read_text() if pending.exists() else ""):  # the driver: waiting for nodes
            assert proc.poll() is None and time.time() < deadline, proc.stdout.read()[-4000:]
            time.sleep(0.2)
        status = render(load_campaign(campaign))  # what `python -m orchestrator status` prints, from storage
        if "C1_s0" in pending.read_text():  # still waiting after status read it (else the node came up first)
            assert "C1_s0  PENDING " in status and "(waiting for nodes)" in status, status
            assert "1 pending on autoscaling" in status, status
            print(status)
        deadline = time.time() + 600
        while len(_jsonl(trial / "metrics.jsonl")) < 3:  # past the checkpoint of step 1
            assert proc.poll() is None and time.time() < deadline, proc.stdout.read()[-4000:]
            time.sleep(0.2)
        lost = json.loads((trial / "placement.json").read_text())["node_id"]
        assert lost != HEAD_ID  # on a node the autoscaler added
        first = json.loads((trial / "placement.json").read_text())
        assert first["workers"][0]["gpu_ids"] and first["learner"]["gpu_ids"], first
        victims = _node_processes(lost)
        assert any("raylet" in " ".join(p.cmdline()) for p in victims), lost
        for p in victims:  # the node is gone: its raylet, agents and workers, as a preempted spot node
            for c in [p, *p.children(recursive=True)]:
                try:
                    c.kill()
                except psutil.Error:
                    pass
        done_at_loss = len(_jsonl(trial / "metrics.jsonl"))
        out, _ = proc.communicate(timeout=900)
    finally:
        if proc.poll() is None:
            proc.kill()
    print("\n".join(ln for ln in out.splitlines() if ln.startswith("autoscaling:")))
    assert proc.returncode == 0, out[-4000:]
    assert "autoscaling: 1 of 1 trials need nodes that are not up yet" in out, out[-4000:]
    assert "gpu_node (CPU:3 GPU:2) x 2" in out, out[-4000:]
    assert done_at_loss < steps, "the trial finished before its node was lost; the test needs more steps"
    assert [r["step"] for r in _jsonl(trial / "metrics.jsonl")] == list(range(steps))  # each step exactly once
    starts = [e["from_step"] for e in _jsonl(trial / "events.jsonl") if e["event"] == "start"]
    assert len(starts) == 2 and starts[0] == 0 and 0 < starts[1] <= done_at_loss, starts
    placed = json.loads((trial / "placement.json").read_text())["node_id"]
    assert placed not in (lost, HEAD_ID)  # a replacement node
