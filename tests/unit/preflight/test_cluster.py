"""Pre-launch checks against what an autoscaling cluster can grow to, the W&B mode override, the variables a job
carries, and the GPU driver check (pure parts; the real autoscaler runs in tests/integration/campaign/test_autoscaling.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from orchestrator.campaign.expand import load_campaign
from orchestrator.config.errors import UserError
from orchestrator.jobs import env as job_env
from orchestrator.preflight.cluster import Capacity, check_storage, check_trials, types_from_launcher
from orchestrator.tracking import mode as wandb_mode_mod
from orchestrator.tune.pending import pending_label
from workers.models import gpu_runtime as g

ROOT = Path(__file__).resolve().parents[3]
HEAD = {"CPU": 8.0, "GPU": 0.0}


def _launcher(name: str) -> Capacity:
    types, cap = types_from_launcher(yaml.safe_load((ROOT / "infra" / "cluster" / name).read_text()))
    return Capacity([HEAD], types, cap, name)


def _campaign(tmp_path, **resources) -> object:
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({
        "name": "c", "base": {"steps": 2, "model": {"name": "tiny"}, "task": {"name": "arithmetic"}},
        "conditions": {"C1": {}}, "seeds": [0], "storage": str(tmp_path / "store"),
        "resources": {"rollout_workers": 1, "worker_cpus": 4, "learner_cpus": 4, **resources}}))
    return load_campaign(path)


@pytest.mark.parametrize("name", ["aws-gpu.yaml", "gcp-gpu.yaml"])
def test_a_fresh_launcher_cluster_takes_the_lean_campaign_and_says_it_waits(name):
    cap = _launcher(name)
    assert cap.autoscaling and cap.total("GPU") > 0
    lean = load_campaign(ROOT / "campaigns" / "sepa_lean.yaml")
    assert check_trials(lean, cap) == [t.name for t in lean.trials]  # every trial waits for GPU nodes
    # the old check: the cluster as it is now (the head alone) refuses it
    with pytest.raises(UserError, match=r"fits on no node"):
        check_trials(lean, Capacity([HEAD]))


def test_a_bundle_no_node_type_holds_is_one_line(tmp_path):
    cap = _launcher("aws-gpu.yaml")
    big = _campaign(tmp_path, worker_gpus=16)
    with pytest.raises(UserError) as err:
        check_trials(big, cap)
    msg = str(err.value)
    assert "\n" not in msg and "rollout worker bundle (CPU:4 GPU:16) fits on no node of the cluster" in msg, msg
    assert "gpu_h100x8 (CPU:192 GPU:8 accelerator_type:H100:1) x 5" in msg


def test_totals_respect_the_global_worker_cap():
    cap = Capacity([HEAD], types_from_launcher({
        "max_workers": 1, "head_node_type": "h",
        "available_node_types": {"h": {"resources": {"CPU": 8}}, "g": {"resources": {"GPU": 2, "CPU": 4},
                                                                       "max_workers": 3}}})[0], 1)
    assert cap.total("GPU") == 2 and cap.total("CPU") == 12 and cap.max_nodes() == 2


def test_live_trials_do_not_wait(tmp_path):
    cap = Capacity([{"CPU": 16.0, "GPU": 2.0}])
    assert check_trials(_campaign(tmp_path, worker_gpus=1, learner_gpus=1), cap) == []
    with pytest.raises(UserError, match=r"asks for 3 GPUs; the cluster can have at most 2 \(no autoscaler\)"):
        check_trials(_campaign(tmp_path, worker_gpus=1, learner_gpus=1, learner_ranks=2), cap)


def test_node_local_storage_is_refused_when_the_cluster_can_grow(tmp_path):
    campaign = _campaign(tmp_path)
    check_storage(campaign, Capacity([HEAD]))  # one node, no autoscaler: fine
    with pytest.raises(UserError, match=r"node-local path on a 1-node cluster that can grow to 7 nodes"):
        check_storage(campaign, _launcher("aws-gpu.yaml"))


def test_status_says_how_long_a_trial_waits(tmp_path):
    (tmp_path / "pending.json").write_text('{"C1_s0": 1000.0}')
    assert pending_label(str(tmp_path), "C1_s0", now=1125.0) == "PENDING 2m05s (waiting for nodes)"
    assert pending_label(str(tmp_path), "C2_s0", now=1125.0) is None


# ------------------------------------------------------------------------------------------- W&B and the job
def test_wandb_mode_overrides_the_file(tmp_path, monkeypatch):
    campaign = _campaign(tmp_path)
    monkeypatch.setenv("WANDB_MODE", "online")
    online = wandb_mode_mod.with_wandb_mode(campaign, wandb_mode_mod.wandb_mode())
    assert campaign.config.wandb.mode == "offline"
    assert online.config.wandb.mode == "online"
    assert all(t.trial.wandb.mode == "online" and t.config["wandb"]["mode"] == "online" for t in online.trials)
    monkeypatch.setenv("WANDB_MODE", "dryrun")
    assert wandb_mode_mod.wandb_mode() == "offline"  # wandb's older name
    monkeypatch.setenv("WANDB_MODE", "shared")
    with pytest.raises(UserError, match=r"^WANDB_MODE: 'shared' is not a W&B mode this runs with; allowed: offline"):
        wandb_mode_mod.wandb_mode()
    assert wandb_mode_mod.wandb_mode("disabled") == "disabled" and wandb_mode_mod.os.environ["WANDB_MODE"] == "disabled"


def test_a_job_carries_no_secret_and_no_local_path(monkeypatch):
    for k in job_env.FORWARD:  # the integration conftest sets VLLM_CPU_KVCACHE_SPACE when both suites run
        monkeypatch.delenv(k, raising=False)
    for k, v in {"WANDB_API_KEY": "k" * 40, "HF_TOKEN": "hf_x", "HF_HOME": "/home/me/.cache/hf",
                 "ORCHESTRATOR_STORAGE": "s3://b/c", "WANDB_MODE": "online"}.items():
        monkeypatch.setenv(k, v)
    assert job_env.job_env(["ORCHESTRATOR_STORAGE"]) == {"ORCHESTRATOR_STORAGE": "s3://b/c", "WANDB_MODE": "online"}
    with pytest.raises(UserError, match="looks like a secret"):
        job_env.job_env(["HF_TOKEN"])
    assert "not sent with the job" in job_env.secrets_note("online")


# ------------------------------------------------------------------------------------------ the driver check
def test_driver_requirements():
    assert g.min_driver("13.0") == 580 and g.min_driver("12.8") == 570 and g.min_driver("12.9") == 575
    text = "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  570.172.08  Release Build  (dvs-builder@U16)"
    assert g.driver_version(text) == "570.172.08"
    msg = g.runtime_problem(["0"], "13.0", False, "570.172.08")
    assert msg.startswith("this node's NVIDIA driver is 570.172.08; torch's CUDA 13.0 needs an NVIDIA driver >= 580")
    assert "sees no NVIDIA driver" in g.runtime_problem(["0"], "13.0", False, None)
    assert g.runtime_problem([], "13.0", False, None) is None  # no GPU asked
    assert g.runtime_problem(["0"], None, False, None) is None  # CPU torch with logical GPUs
    assert g.runtime_problem(["0"], "13.0", True, "580.65.06") is None


def test_the_online_key_is_read_on_the_node(tmp_path, monkeypatch):
    from orchestrator.config.trial import TrialConfig
    from orchestrator.tracking.run import _api_key

    cfg = TrialConfig()
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("WANDB_API_KEY_FILE", str(tmp_path / "api-key"))
    assert _api_key(cfg) is None  # an optional Secret that is absent: wandb's own login (~/.netrc) decides
    (tmp_path / "api-key").write_text("k" * 40 + "\n")
    assert _api_key(cfg) == "k" * 40  # the mounted Secret
    monkeypatch.setenv("WANDB_API_KEY", "e" * 40)
    assert _api_key(cfg) == "e" * 40  # the node's environment first


def test_an_accelerator_type_selects_node_types(tmp_path):
    cap = _launcher("gcp-gpu.yaml")
    h100 = _campaign(tmp_path, worker_gpus=1, learner_gpus=1, accelerator_type="H100")
    assert check_trials(h100, cap) == ["C1_s0"]
    with pytest.raises(UserError, match=r"accelerator_type:A100:0.001\) fits on no node of"):
        check_trials(_campaign(tmp_path, worker_gpus=1, accelerator_type="A100"), cap)


def test_the_driver_records_which_trials_wait_and_since_when(tmp_path, capsys):
    from types import SimpleNamespace

    from orchestrator.tune.pending import PendingOnAutoscaling, pending_since

    def trial(name, status):
        return SimpleNamespace(config={"trial": name}, trial_id=name, status=status)

    cb = PendingOnAutoscaling(str(tmp_path), every_s=3600)
    cb.on_step_begin(0, [trial("A_s0", "PENDING"), trial("B_s0", "RUNNING")])
    first = pending_since(str(tmp_path))
    assert list(first) == ["A_s0"]
    cb.on_step_begin(1, [trial("A_s0", "PENDING"), trial("B_s0", "PENDING")])
    later = pending_since(str(tmp_path))
    assert later["A_s0"] == first["A_s0"] and set(later) == {"A_s0", "B_s0"}  # the first wait keeps its start
    assert capsys.readouterr().out.count("autoscaling: 1 trial pending for up to 0m00s") == 1  # once per every_s
    cb.on_experiment_end([])
    assert pending_since(str(tmp_path)) == {}


SLURM_ENV = {"SLURM_JOB_ID": "4242", "SLURM_JOB_NUM_NODES": "2", "SLURM_GPUS_ON_NODE": "4",
             "SLURM_CPUS_ON_NODE": "32", "SLURM_JOB_CPUS_PER_NODE": "32(x2)"}


@pytest.mark.parametrize(("extra", "gpus", "cpus"), [
    ({}, 4, 32),
    ({"SLURM_GPUS_ON_NODE": "", "SLURM_JOB_GPUS": "0,1,2"}, 3, 32),  # the ids SLURM gave this node
    ({"SLURM_GPUS_ON_NODE": "", "SLURM_GPUS_PER_NODE": "h100:8"}, 8, 32),
    ({"SLURM_GPUS_ON_NODE": "", "SLURM_GPUS_PER_NODE": "gpu:h100:2"}, 2, 32),
    ({"SLURM_GPUS_ON_NODE": "", "SLURM_CPUS_ON_NODE": ""}, 0, 32),  # a CPU job; CPUs from 32(x2)
])
def test_a_slurm_allocation_is_read_from_the_job_variables(extra, gpus, cpus):
    from orchestrator.preflight.slurm import allocation

    alloc = allocation({**SLURM_ENV, **extra})
    assert (alloc.job_id, alloc.nodes, alloc.gpus, alloc.cpus) == ("4242", 2, gpus, cpus)
    assert allocation({k: v for k, v in SLURM_ENV.items() if k != "SLURM_JOB_ID"}) is None  # outside SLURM
    assert allocation({}) is None


def test_trials_are_checked_against_the_allocation(tmp_path, monkeypatch):
    from orchestrator.preflight import cluster
    from orchestrator.preflight.checks import check_cluster

    for k, v in SLURM_ENV.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setattr("ray.nodes", lambda: [{"Alive": True, "Resources": {"CPU": 32.0, "GPU": 4.0}}])
    monkeypatch.setattr("ray.get_runtime_context", lambda: pytest.fail("an allocation needs no autoscaler"))
    cap = cluster.capacity()  # one of the allocation's 2 nodes has joined Ray
    assert cap.allocation and cap.max_nodes() == 2 and cap.total("GPU") == 8 and cap.total("CPU") == 64
    fits = _campaign(tmp_path, worker_gpus=4, learner_gpus=1, learner_ranks=4)
    # the worker on one node, the learner's 4 ranks on the other, which has not joined Ray yet: it waits
    assert cluster.check_trials(fits, cap) == ["C1_s0"]
    with pytest.raises(UserError) as err:
        cluster.check_trials(_campaign(tmp_path, worker_gpus=8), cap)
    msg = str(err.value)
    assert "\n" not in msg and "rollout worker bundle (CPU:4 GPU:8) fits on no node of the allocation " \
        "(SLURM job 4242: 2 nodes x 4 GPUs, 32 CPUs)" in msg, msg
    with pytest.raises(UserError, match=r"trial C1_s0 asks for 12 GPUs; the allocation \(SLURM job 4242: 2 nodes "
                                        r"x 4 GPUs, 32 CPUs\) has 8; ask SLURM for more \(--nodes"):
        check_cluster(_campaign(tmp_path, worker_gpus=4, learner_gpus=1, learner_ranks=8))  # what `run` turns into exit 2
    with pytest.raises(UserError, match=r"node-local path on the allocation SLURM job 4242: 2 nodes"):
        cluster.check_storage(fits, cap)
