"""CUDA errors that poison the process's CUDA context: after one, every later CUDA call in the process fails too
(CUDA Runtime API, cudaError: "the process is left in an inconsistent state and any further CUDA work will return
the same error; to continue using CUDA, the process must be terminated and relaunched"). A process that catches
one and lives on keeps a dead context: a pool's learner then fails every trial's step while answering its health
checks. Such a process exits instead (`exit_on_poisoned_context`), and Ray restarts it.

Sticky (cudaError codes): illegal address 700, launch timeout 702, device-side assert 710, hardware stack error
714, illegal instruction 715, misaligned address 716, invalid address space 717, invalid PC 718, launch failure
719, uncorrectable ECC 214. cuBLAS / cuDNN report a kernel that failed on the device (often one of the above
underneath) as CUBLAS_STATUS_EXECUTION_FAILED / CUDNN_STATUS_EXECUTION_FAILED. Not sticky, and left to the
caller: out of memory (torch.cuda.OutOfMemoryError, CUBLAS_STATUS_ALLOC_FAILED), invalid arguments or
configurations of one launch, NCCL errors (the communicator, not the context)."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager

STICKY = (
    "an illegal memory access was encountered",
    "the launch timed out and was terminated",
    "device-side assert triggered",
    "hardware stack error",
    "an illegal instruction was encountered",
    "misaligned address",
    "operation not supported on global/shared address space",
    "invalid program counter",
    "unspecified launch failure",
    "uncorrectable ecc error encountered",
    "cublas_status_execution_failed",
    "cudnn_status_execution_failed",
)
EXIT_CODE = 71  # EX_OSERR: the process's CUDA context, not its input, failed


def poisoned_by(error: BaseException) -> str | None:
    """The sticky CUDA error named in `error` or the exceptions it was raised from (None: not one)."""
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        text = str(error).lower()
        for phrase in STICKY:
            if phrase in text:
                return phrase
        error = error.__cause__ or error.__context__
    return None


@contextmanager
def exit_on_poisoned_context(what: str, exit: Callable[[int], object] | None = None) -> Iterator[None]:
    """Run the block; when it raises a sticky CUDA error, print one line naming `what` and the error and end the
    process at once (`os._exit`: no cleanup that would touch the dead context), so its supervisor (Ray) restarts it.
    Any other error goes on to the caller."""
    try:
        yield
    except BaseException as e:
        phrase = poisoned_by(e)
        if phrase is None:
            raise
        first = (str(e).strip().splitlines() or [""])[0]
        print(f"{what}: CUDA context poisoned ({phrase}: {type(e).__name__}: {first}); process {os.getpid()} exits "
              f"with {EXIT_CODE} to be restarted", file=sys.stderr, flush=True)
        (exit or os._exit)(EXIT_CODE)
        raise  # only reached when `exit` returns (a test's stand-in)
