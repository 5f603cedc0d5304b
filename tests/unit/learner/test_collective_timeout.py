"""The learner group's collective timeout on a real gloo group of two processes: rank 1 joins and then freezes
(SIGSTOP on itself), and rank 0's all_reduce fails after `timeout_s` instead of torch's 30-minute gloo default."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

RANK = r'''
import os, signal, sys, torch
import torch.distributed as dist
from workers.learner.ranks import Ranks, join_group
rank = int(sys.argv[1])
join_group(Ranks(rank, 2), sys.argv[2], cuda=False, timeout_s=3.0)
if rank == 1:
    os.kill(os.getpid(), signal.SIGSTOP)  # frozen inside the group, like a lost rank
try:
    dist.all_reduce(torch.ones(1))
    print("REDUCED")
except Exception as e:
    print("FAILED " + type(e).__name__ + ": " + str(e).splitlines()[0])
'''


def test_a_frozen_rank_fails_the_other_ranks_collective(tmp_path):
    root = Path(__file__).resolve().parents[3]
    script = tmp_path / "rank.py"
    script.write_text(RANK)
    init = f"file://{tmp_path / 'store'}"
    env = {**os.environ, "PYTHONPATH": str(root)}
    procs = [subprocess.Popen([sys.executable, str(script), str(r), init], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for r in (0, 1)]
    try:
        out, err = procs[0].communicate(timeout=120)  # without the timeout: 30 min (gloo's default)
    finally:
        procs[1].send_signal(signal.SIGKILL)
        procs[1].wait()
    assert "FAILED" in out and "REDUCED" not in out, out + err
