"""A CUDA error that poisons the process's context ends the process (workers/models/cuda_faults.py), and the pool's
learner actor does so from inside its calls (orchestrator/pool/actors.py); other errors go on to the caller. Fake
errors with the messages torch raises, no GPU."""

from __future__ import annotations

import pytest

from orchestrator.pool.actors import PoolLearnerActor
from orchestrator.pool.probe import CallClock
from workers.learner.pool.shared import SharedLearner
from workers.models.cuda_faults import EXIT_CODE, exit_on_poisoned_context, poisoned_by


class Exited(BaseException):
    """The stand-in for os._exit: ends the block the way the process's end would."""


def _exit(code: int) -> None:
    raise Exited(code)


STICKY = [
    "CUDA error: an illegal memory access was encountered\nCUDA kernel errors might be asynchronously reported",
    "CUDA error: device-side assert triggered\nCompile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.",
    "CUDA error: CUBLAS_STATUS_EXECUTION_FAILED when calling `cublasSgemm( handle, opa, opb, m, n, k, ...)`",
    "CUDA error: unspecified launch failure",
    "CUDA error: misaligned address",
    "CUDA error: uncorrectable ECC error encountered",
]
NOT_STICKY = [
    "CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 79.15 GiB total capacity)",
    "CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`",
    "CUDA error: invalid configuration argument",
    "NCCL error in: ProcessGroupNCCL.cpp:1269, unhandled system error",
    "slot 0 is not open",
]


@pytest.mark.parametrize("message", STICKY)
def test_a_sticky_cuda_error_is_told_apart(message):
    assert poisoned_by(RuntimeError(message)) is not None


@pytest.mark.parametrize("message", NOT_STICKY)
def test_an_error_the_context_survives_is_not(message):
    assert poisoned_by(RuntimeError(message)) is None


def test_a_sticky_error_underneath_another_is_found():
    try:
        try:
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        except RuntimeError as inner:
            raise ValueError("the step failed") from inner
    except ValueError as outer:
        assert poisoned_by(outer) == "an illegal memory access was encountered"


def test_the_block_exits_on_a_sticky_error_with_one_line(capsys):
    with pytest.raises(Exited) as e, exit_on_poisoned_context("pool learner train_step", exit=_exit):
        raise RuntimeError(STICKY[0])
    assert e.value.args == (EXIT_CODE,)
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("pool learner train_step: CUDA context poisoned (an illegal")


def test_any_other_error_goes_on_to_the_caller(capsys):
    with pytest.raises(RuntimeError, match="out of memory"), exit_on_poisoned_context("x", exit=_exit):
        raise RuntimeError(NOT_STICKY[0])
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("call", ["train_step", "checkpoint_files", "restore", "export_policy", "open"])
def test_the_pool_learner_exits_its_process_on_a_poisoned_context(monkeypatch, call):
    """Each call of the pool's learner that runs CUDA work: the process exits (os._exit) instead of answering."""
    import os

    def poisoned(*args, **kwargs):
        raise RuntimeError(STICKY[1])

    monkeypatch.setattr(SharedLearner, call, poisoned)
    monkeypatch.setattr(os, "_exit", _exit)
    actor = PoolLearnerActor.__new__(PoolLearnerActor)  # no model: what is checked is the call's exit path
    actor.clock = CallClock()  # the supervisor's call clock, which __init__ would have made
    args = {"train_step": ("lease", None), "checkpoint_files": ("lease",), "restore": ("lease", {}),
            "export_policy": ("lease", 1), "open": ("lease",)}[call]
    with pytest.raises(Exited):
        getattr(PoolLearnerActor, call)(actor, *args)
