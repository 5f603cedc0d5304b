"""Timing shared by the in-process benchmarks (credit.py, learner.py): a fixed thread count and a summary of
repeats as median and spread, so a figure does not swing with the load other processes put on the machine."""

from __future__ import annotations

import os
import statistics


def fix_threads(asked: int | None) -> int:
    """torch's intra-op threads: `asked` (--threads), else $BENCH_THREADS, else 1 (one core: the reference is
    single-threaded Python, and a thread count that follows the machine makes the figure follow its load)."""
    import torch

    n = asked or int(os.environ.get("BENCH_THREADS", "1"))
    torch.set_num_threads(n)
    return n


def spread(values: list[float], fmt: str = ".3g") -> str:
    """'median M (min A .. max B, N runs)'."""
    return (f"median {statistics.median(values):{fmt}} (min {min(values):{fmt}} .. max {max(values):{fmt}}, "
            f"{len(values)} runs)")
