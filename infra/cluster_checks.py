"""Offline checks that a deployment would launch and run, beyond what the schemas say (used by infra/validate.py).

Each function returns problems as lines ("<key path>: what is wrong; what to do"), [] when none:
- image_findings: the GPU image's CUDA (its `FROM nvidia/cuda:X.Y...`) is the CUDA torch's wheels are built for,
  and its `ai.credit-orchestrator.min-nvidia-driver` label is the driver that CUDA needs (workers/models/gpu_runtime.py);
- launch_findings (a prepared launcher config): GCP boot disks name a disk type other than pd-standard (G2 and A3
  machines refuse pd-standard, the default); on AWS a `resolve:ssm:` AMI comes with an explicit head instance
  profile (Ray's default head role has no ssm:GetParameters, so the autoscaler cannot launch those workers);
- pod_findings (a RayCluster spec): every pod names its service account (the one bucket identity binds to; else
  KubeRay names it after the cluster), GPU pods select a GPU node pool, and /dev/shm holds Ray's object store.
"""

from __future__ import annotations

import re

from workers.models.gpu_runtime import min_driver

# torch release -> the CUDA its default wheels on the package index are built for (when no cuXYZ index is named)
TORCH_DEFAULT_CUDA = {"2.14": "13.0"}
GPU_NODE_LABELS = ("cloud.google.com/gke-accelerator", "nvidia.com/gpu.product", "node.kubernetes.io/instance-type",
                   "karpenter.k8s.aws/instance-gpu-name", "cloud.google.com/gke-nodepool")
OBJECT_STORE_FRACTION, OBJECT_STORE_CAP = 0.3, 200 * 10**9  # Ray's defaults when object-store-memory is unset
UNITS = {"": 1, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}


# ---------------------------------------------------------------------------------------------------- images
def image_cuda(text: str) -> str | None:
    m = re.search(r"^FROM\s+nvidia/cuda:(\d+)\.(\d+)", text, re.M)
    return f"{m.group(1)}.{m.group(2)}" if m else None


def torch_cuda(text: str) -> str | None:
    """The CUDA of the torch the Dockerfile installs: a named cuXYZ wheel index, else the release's default."""
    m = re.search(r"download\.pytorch\.org/whl/cu(\d+)(\d)\b", text)
    if m:
        return f"{m.group(1)}.{m.group(2)}"
    m = re.search(r"\btorch==(\d+\.\d+)", text)
    return TORCH_DEFAULT_CUDA.get(m.group(1)) if m else None


def image_findings(text: str, source: str) -> list[str]:
    base = image_cuda(text)
    if base is None:  # not a CUDA image (the CPU one)
        return []
    torch = torch_cuda(text)
    if torch is None:
        return [f"{source}: torch: cannot tell which CUDA its wheels use; install it from "
                "https://download.pytorch.org/whl/cuXYZ"]
    out = []
    if torch != base:
        out.append(f"{source}: FROM nvidia/cuda:{base}: torch's wheels are built for CUDA {torch}; use a CUDA "
                   f"{torch} base (one toolkit in the image, and the driver check of the base is torch's)")
    need = min_driver(torch)
    label = re.search(r"ai\.credit-orchestrator\.min-nvidia-driver=\"?(\d+)", text)
    if label is None or int(label.group(1)) != need:
        out.append(f"{source}: LABEL ai.credit-orchestrator.min-nvidia-driver: must be {need} (CUDA {torch} needs "
                   f"NVIDIA driver >= {need}), got {label.group(1) if label else 'none'}")
    return out


# ------------------------------------------------------------------------------------------ launcher configs
def launch_findings(config: dict) -> list[str]:
    provider = (config.get("provider") or {}).get("type")
    types = config.get("available_node_types") or {}
    out = []
    if provider == "gcp":
        for name, t in types.items():
            for i, disk in enumerate((t.get("node_config") or {}).get("disks") or []):
                kind = str((disk.get("initializeParams") or {}).get("diskType", "pd-standard"))
                if kind.rsplit("/", 1)[-1] == "pd-standard":
                    out.append(f"available_node_types.{name}.node_config.disks.{i}.initializeParams.diskType: "
                               f"{kind if 'diskType' in (disk.get('initializeParams') or {}) else 'unset'} "
                               "(pd-standard); G2 / A3 GPU machines refuse it: use zones/ZONE/diskTypes/pd-balanced")
    if provider == "aws":
        ssm = [n for n, t in types.items() if str((t.get("node_config") or {}).get("ImageId", "")).startswith(
            "resolve:ssm:")]
        head = types.get(config.get("head_node_type"), {})
        if ssm and not (head.get("node_config") or {}).get("IamInstanceProfile"):
            out.append(f"available_node_types.{config.get('head_node_type')}.node_config.IamInstanceProfile: unset, "
                       f"but {', '.join(ssm)} boot a resolve:ssm: AMI; Ray's default head role cannot read SSM "
                       "parameters (ssm:GetParameters): give the head a profile that can (docs/deploy.md)")
    return out


# ------------------------------------------------------------------------------------------ KubeRay pod specs
def quantity(value) -> float:
    """A Kubernetes quantity ('8Gi', '900Gi', '6442450944') in bytes."""
    m = re.fullmatch(r"\s*([0-9.]+)\s*([kMGT]i?)?\s*", str(value))
    if not m:
        raise ValueError(f"not a quantity: {value!r}")
    return float(m.group(1)) * UNITS[m.group(2) or ""]


def _object_store(group: dict, container: dict) -> float:
    params = group.get("rayStartParams") or {}
    if "object-store-memory" in params:
        return quantity(params["object-store-memory"])
    memory = ((container.get("resources") or {}).get("limits") or {}).get("memory")
    return min(OBJECT_STORE_FRACTION * quantity(memory), OBJECT_STORE_CAP) if memory else 0.0


def _shm(pod: dict, container: dict) -> float | None:
    mounted = {m.get("name") for m in container.get("volumeMounts") or [] if m.get("mountPath") == "/dev/shm"}
    for v in pod.get("volumes") or []:
        empty = v.get("emptyDir") or {}
        if v.get("name") in mounted and empty.get("medium") == "Memory":
            return quantity(empty["sizeLimit"]) if "sizeLimit" in empty else float("inf")
    return None


def _selects_gpu_pool(pod: dict) -> bool:
    if any(k in GPU_NODE_LABELS for k in pod.get("nodeSelector") or {}):
        return True
    terms = (((pod.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution") or {}).get("nodeSelectorTerms") or []
    return bool(terms) and all(any(e.get("key") in GPU_NODE_LABELS for e in t.get("matchExpressions") or [])
                               for t in terms)


def pod_findings(spec: dict, where: str) -> list[str]:
    groups = [(f"{where}.headGroupSpec", spec.get("headGroupSpec") or {})]
    groups += [(f"{where}.workerGroupSpecs.{i}", g) for i, g in enumerate(spec.get("workerGroupSpecs") or [])]
    out = []
    for gwhere, group in groups:
        pod = (group.get("template") or {}).get("spec") or {}
        pwhere = f"{gwhere}.template.spec"
        if not pod.get("serviceAccountName"):
            out.append(f"{pwhere}.serviceAccountName: unset; KubeRay then uses an account named after the cluster "
                       "(random for a RayJob), which bucket identity cannot be bound to: name one")
        containers = pod.get("containers") or [{}]
        ray = containers[0]
        gpus = any(((c.get("resources") or {}).get("limits") or {}).get("nvidia.com/gpu") for c in containers)
        if gpus and not _selects_gpu_pool(pod):
            out.append(f"{pwhere}.nodeSelector: a GPU pod without a GPU node selector ({', '.join(GPU_NODE_LABELS[:2])}"
                       ", ...) may land on any GPU pool")
        store, shm = _object_store(group, ray), _shm(pod, ray)
        if shm is None:
            out.append(f"{pwhere}.volumes: no memory-backed /dev/shm; Ray's object store falls back to /tmp (slow)")
        elif shm < store:
            out.append(f"{pwhere}.volumes: /dev/shm ({shm / 2**30:g} GiB) is smaller than Ray's object store "
                       f"({store / 2**30:.3g} GiB): set rayStartParams.object-store-memory below it or grow the "
                       "volume's sizeLimit")
    return out
