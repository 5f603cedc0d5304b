"""`doctor`'s judges on what the probes would measure (fakes, no Ray): each failure path gives one FAIL line with
the fix, a check that does not apply is skipped with its reason, and the exit code is 0 only without a FAIL. The
probes on the real stack: tests/integration/test_doctor.py."""

from __future__ import annotations

import pytest

from orchestrator.preflight.doctor import (
    ENGINE_FIX,
    Check,
    attempt,
    campaign_check,
    gpu_runtime,
    ray_versions,
    render,
    storage_check,
    wandb_check,
)
from workers.tiny.families import SIZE, build_family_model


def test_a_node_with_another_ray_version_fails_naming_it():
    assert ray_versions("2.60.0", {"10.0.0.1": "2.60.0", "10.0.0.2": "2.60.0"}).ok
    bad = ray_versions("2.60.0", {"10.0.0.1": "2.60.0", "10.0.0.2": "2.54.1"})
    assert bad.ok is False and "10.0.0.2 has 2.54.1" in bad.detail and "ray==2.60.0" in bad.detail
    assert "10.0.0.1" not in bad.detail
    assert ray_versions("2.60.0", {}).ok is False


def test_gpu_runtime_skips_on_cpu_and_names_the_node_with_an_old_driver():
    cpu = gpu_runtime({"n1": {"gpus": [], "cuda": None}})
    assert cpu.ok is None and "CPU only" in cpu.detail
    good = {"gpus": ["0"], "cuda": "12.8", "available": True, "driver": "575.1", "torch": "2.9.0"}
    assert gpu_runtime({"n1": good}).ok
    old = {**good, "available": False, "driver": "535.104"}
    res = gpu_runtime({"n1": good, "n2": old})
    assert res.ok is False and res.detail.startswith("n2:") and ">= 570" in res.detail
    cpu_torch = gpu_runtime({"n3": {**good, "cuda": None}})
    assert cpu_torch.ok is False and "CPU build" in cpu_torch.detail


def test_an_engine_that_cannot_start_fails_with_the_fix():
    def start():
        raise RuntimeError("Engine core initialization failed. See root cause above.\nFailed core proc(s): {}")

    res = attempt("vLLM engine", start, ENGINE_FIX)
    assert res.ok is False and "RuntimeError: Failed core proc(s)" in res.detail and ENGINE_FIX in res.detail
    assert attempt("vLLM engine", lambda: "sampled 2", ENGINE_FIX) == Check("vLLM engine", True, "sampled 2")


def _local_storage(tmp):
    def write(loc, data):
        with open(loc, "wb") as f:
            f.write(data)

    def read(loc):
        try:
            with open(loc, "rb") as f:
                return f.read()
        except FileNotFoundError:
            return None

    return write, read


def test_storage_writable_and_readable_from_a_node(tmp_path):
    write, read = _local_storage(tmp_path)
    seen = {}

    def node(loc, expected):
        seen["expected"] = expected
        write(loc, b"node")
        return b"node"

    res = storage_check(str(tmp_path), write, read, node, "node n2")
    assert res.ok and "node n2" in res.detail and len(seen["expected"]) == 16


def test_unwritable_storage_fails(tmp_path):
    write, read = _local_storage(tmp_path)
    blocker = tmp_path / "a_file"
    blocker.write_text("x")  # a path under a file cannot be created, whoever runs the test (root included)
    res = storage_check(str(blocker / "results"), write, read, lambda loc, e: b"", "node n2")
    assert res.ok is False and "not writable from the driver" in res.detail and "fix:" in res.detail


def test_storage_a_node_cannot_reach_or_the_driver_cannot_read_back(tmp_path):
    write, read = _local_storage(tmp_path)

    def unreachable(loc, expected):
        raise OSError(f"{loc} is not readable here (got None)")

    res = storage_check(str(tmp_path), write, read, unreachable, "node n2")
    assert res.ok is False and "from node n2: OSError" in res.detail and "shared filesystem" in res.detail
    lost = storage_check(str(tmp_path), write, read, lambda loc, e: b"elsewhere", "node n2")  # a node-local disk
    assert lost.ok is False and "not readable from the driver" in lost.detail


def test_wandb_modes():
    def unreachable():
        raise OSError("timed out")

    assert wandb_check("offline", False, unreachable).ok and "offline" in wandb_check(None, False, unreachable).detail
    assert wandb_check("disabled", False, unreachable).ok
    assert wandb_check("online", False, lambda: None).ok is False
    res = wandb_check("online", True, unreachable)
    assert res.ok is False and "unreachable" in res.detail and "--wandb-mode offline" in res.detail
    assert wandb_check("online", True, lambda: None).ok


def test_campaign_model_limits(tmp_path):
    assert campaign_check(None).ok is None
    model = build_family_model("tiny-qwen3", tmp_path / "tiny-qwen3")
    limit = SIZE["max_position_embeddings"]

    def campaign(max_len: int) -> str:
        path = tmp_path / f"c{max_len}.yaml"
        path.write_text(f"name: c\nstorage: {tmp_path}\nseeds: [0]\nconditions: {{A: {{}}}}\n"
                        f"base: {{model: {{name: {model}, max_model_len: {max_len}}}, task: {{name: arithmetic}},"
                        f" rollout: {{max_tokens: 8}}}}\n")
        return str(path)

    assert campaign_check(campaign(limit)).ok
    res = campaign_check(campaign(limit * 2))
    assert res.ok is False and "max_model_len" in res.detail and str(limit) in res.detail


@pytest.mark.parametrize(("oks", "code"), [([True, None], 0), ([True, False, None], 1)])
def test_exit_code_only_zero_without_a_failure(oks, code):
    text, got = render([Check(f"c{i}", ok, "d") for i, ok in enumerate(oks)])
    assert got == code and len(text.splitlines()) == len(oks) + 1
