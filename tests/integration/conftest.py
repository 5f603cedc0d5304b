"""Shared fixtures for integration tests: one local Ray per session, the tiny models built once."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB per engine, so several engines fit
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> str:
    from workers.models.loading import build_tiny_model

    return str(build_tiny_model(tmp_path_factory.mktemp("tiny_model"), seed=0))


@pytest.fixture(scope="session")
def reasoner_dir() -> str:
    """The tiny reasoner in the cache trials use (`model: {name: tiny-reasoner}`): built once per machine and
    spec (about 2 CPU-minutes), reused by every later session, test and trial."""
    from workers.tiny.reasoner import build_tiny_reasoner

    return str(build_tiny_reasoner(seed=0))


@pytest.fixture(scope="session")
def ray_local():
    """A private local Ray (never joins a cluster already running on the machine).

    4 logical GPUs on a CPU box: trials that ask for none never see them; the packing test asks for them.
    """
    import ray

    ray.init(
        address="local", num_cpus=4, num_gpus=4, include_dashboard=False, log_to_driver=False,
        runtime_env={"env_vars": {"VLLM_CPU_KVCACHE_SPACE": "1", "TOKENIZERS_PARALLELISM": "false"}},
    )
    yield ray
    ray.shutdown()
