"""The learner group's torch.distributed side: the process group, how a mini-batch's rows are split over ranks,
and the few collectives the learner needs. One rank (no group) is the case where every helper is the identity.

Why the rows are split by tokens and every rank runs the same number of passes: under FSDP2 every forward and
backward all-gathers / reduce-scatters parameters, so ranks must run the same sequence of passes; a rank with
fewer micro-batches runs zero-weight passes (`pad_passes`). The loss of each rank's rows is divided by the whole
mini-batch's denominators (`workers.learner.batch.loss_totals`), so the gradients summed over ranks (FSDP's reduce with
divide factor 1) equal the single-rank gradient of the whole mini-batch exactly, token-mean included.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class Ranks:
    """This process's place in the learner group."""

    rank: int = 0
    world: int = 1

    @property
    def grouped(self) -> bool:
        return self.world > 1

    @property
    def leader(self) -> bool:
        return self.rank == 0


ONE_RANK = Ranks()  # the default: no group
def rendezvous_address() -> str:
    """`tcp://<this node's IP>:<a free port>` for the group's store, picked by rank 0 on its own node."""
    import ray

    ip = ray.util.get_node_ip_address() if ray.is_initialized() else "127.0.0.1"
    with socket.socket() as s:
        s.bind(("", 0))
        port = s.getsockname()[1]
    return f"tcp://{ip}:{port}"


def join_group(ranks: Ranks, init_method: str, cuda: bool, timeout_s: float = 600.0) -> None:
    """Join the learner's process group: NCCL on GPU, gloo on CPU. Ray gives each rank's actor its own GPU as
    device 0 (CUDA_VISIBLE_DEVICES), so NCCL's device is cuda:0 everywhere. `timeout_s` bounds every collective
    (and the rendezvous): a lost or frozen rank makes the others fail instead of waiting torch's default 10 min
    (NCCL) or 30 min (gloo); NCCL's async error handling (1: tear the process down) acts on that timeout."""
    import datetime

    import torch.distributed as dist

    if dist.is_initialized():  # one group per process: a second learner in it (tests) reuses it
        return
    if cuda:
        torch.cuda.set_device(0)
    os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")
    dist.init_process_group("nccl" if cuda else "gloo", init_method=init_method, rank=ranks.rank,
                            world_size=ranks.world, timeout=datetime.timedelta(seconds=timeout_s))


def split_rows(rows: Tensor, lengths: Tensor, world: int) -> list[Tensor]:
    """`rows` (indices into the batch) split over `world` ranks so their token counts are balanced: longest
    sequence first, each to the rank with the fewest tokens so far (ties: the lowest rank). Deterministic, so
    every rank computes every rank's share without talking. `lengths[i]` is row i's sequence length."""
    if world == 1:
        return [rows]
    order = torch.argsort(lengths[rows], descending=True, stable=True).tolist()
    shares: list[list[int]] = [[] for _ in range(world)]
    load = [0] * world
    for i in order:
        k = min(range(world), key=lambda j: (load[j], j))
        shares[k].append(int(rows[i]))
        load[k] += int(lengths[rows[i]])
    return [torch.tensor(sorted(s), dtype=torch.long) for s in shares]


def pad_passes(mine: list, counts: list[int], filler) -> list[tuple[object, bool]]:
    """This rank's micro-batches as (item, real) pairs, padded with `(filler, False)` to the most any rank has."""
    return [(m, True) for m in mine] + [(filler, False)] * (max(counts) - len(mine))


def sum_over_ranks(values: dict[str, float], ranks: Ranks) -> dict[str, float]:
    """Each key summed over the group (the identity on one rank)."""
    if not ranks.grouped or not values:
        return values
    import torch.distributed as dist

    keys = sorted(values)
    t = torch.tensor([float(values[k]) for k in keys], dtype=torch.float64)
    if dist.get_backend() == "nccl":  # NCCL reduces device tensors only
        t = t.cuda()
    dist.all_reduce(t)
    return dict(zip(keys, t.tolist(), strict=True))


def gather_rows(rows: Tensor, parts: dict[str, Tensor | None], size: int, ranks: Ranks,
                fill: float = 0.0) -> dict[str, Tensor | None]:
    """`[b_r, ...]` CPU tensors of this rank's `rows` -> the whole batch's `[size, ...]` tensors on every rank
    (rows no rank holds are `fill`)."""
    everyone: list = [(rows, parts)]
    if ranks.grouped:
        import torch.distributed as dist

        everyone = [None] * ranks.world
        dist.all_gather_object(everyone, (rows, parts))
    out: dict[str, Tensor | None] = {}
    for key, first in parts.items():
        if first is None:
            out[key] = None
            continue
        full = first.new_full((size, *first.shape[1:]), fill)
        for r, p in everyone:
            full[r] = p[key]
        out[key] = full
    return out


def min_over_ranks(value: float | None, ranks: Ranks) -> float | None:
    """The smallest of each rank's value (None where a rank has none)."""
    if not ranks.grouped:
        return value
    import torch.distributed as dist

    everyone: list = [None] * ranks.world
    dist.all_gather_object(everyone, value)
    present = [v for v in everyone if v is not None]
    return min(present) if present else None


def leave_group() -> None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
