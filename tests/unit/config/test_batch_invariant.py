"""resources.shared_base.batch_invariant: the environment the pool's engines start with, and where it is refused
before launch (no CUDA GPU; a GPU model known to be older than compute capability 9.0), from a lone trial's file
too (one line, exit 2). Campaign refusals: tests/unit/campaign/bad_campaigns/50_shared_base_batch_invariant_*."""

from __future__ import annotations

import pytest

from orchestrator.config.pool_key import batch_invariant_refusal, engine_env
from orchestrator.config.trial import TrialConfig
from tests.unit.config.cli_errors import trial_error


def _cfg(batch_invariant: bool = True, **resources) -> TrialConfig:
    return TrialConfig(learner={"mode": "lora"},
                       resources={"shared_base": {"slots": 2, "batch_invariant": batch_invariant}, **resources})


def test_the_pools_engines_start_with_vllms_switch_only_when_asked():
    assert engine_env(_cfg(worker_gpus=1, accelerator_type="H100")) == {"VLLM_BATCH_INVARIANT": "1"}
    assert engine_env(_cfg(False, worker_gpus=1)) == {}
    assert engine_env(TrialConfig(resources={"worker_gpus": 1})) == {}  # separate engines: no pool


@pytest.mark.parametrize("gpu", ["H100", "H200", "B200", None, "RTX-PRO-6000"])  # unknown: nothing to refuse
def test_hopper_and_later_or_an_unknown_model_are_accepted(gpu):
    assert batch_invariant_refusal(_cfg(worker_gpus=1, accelerator_type=gpu)) is None


@pytest.mark.parametrize("gpu, cc", [("A100", "8.0"), ("L4", "8.9"), ("A10G", "8.6"), ("T4", "7.5")])
def test_an_older_gpu_model_is_refused_by_its_key(gpu, cc):
    key, why = batch_invariant_refusal(_cfg(worker_gpus=1, accelerator_type=gpu))
    assert key == "resources.accelerator_type" and f"{gpu} is {cc}" in why


def test_cpu_engines_are_refused_saying_what_holds_on_cpu():
    key, why = batch_invariant_refusal(_cfg(worker_gpus=0))
    assert key == "resources.worker_gpus"
    assert "needs a CUDA GPU" in why and "on CPU" in why and "bit for bit" in why
    assert batch_invariant_refusal(_cfg(False, worker_gpus=0)) is None


def test_a_lone_trial_asking_it_on_cpu_is_one_line_exit_2(tmp_path):
    path, lines = trial_error(tmp_path, "learner: {mode: lora}\n"
                                        "resources: {shared_base: {slots: 1, batch_invariant: true}}\n")
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"error: {path}: resources.worker_gpus: resources.shared_base.batch_invariant "
                               "needs a CUDA GPU"), lines[0]
