"""A checkpoint's random streams (workers/learner/rng.py) survive the weights-only blob and restore every stream:
the draws after a restore equal the draws after the capture, for torch, Python and NumPy alike."""

from __future__ import annotations

import random

import numpy as np
import torch

from workers.checkpoint.blob import dump_blob, load_blob
from workers.learner.rng import capture_streams, install_streams


def _draws() -> tuple:
    return (torch.rand(4).tolist(), [random.random() for _ in range(4)], np.random.rand(4).tolist(),
            np.random.standard_normal(3).tolist())


def test_every_stream_continues_after_a_restore():
    torch.manual_seed(1), random.seed(2), np.random.seed(3)
    np.random.standard_normal()  # a cached Gaussian half-pair is part of NumPy's state
    saved = load_blob(dump_blob(capture_streams()), "rng")  # through the checkpoint's weights-only format
    expected = _draws()
    torch.manual_seed(9), random.seed(9), np.random.seed(9)
    assert _draws() != expected
    install_streams(saved)
    assert _draws() == expected


def test_a_checkpoint_without_numpy_or_cuda_streams_still_restores():
    torch.manual_seed(1), random.seed(2)
    old = {"torch_rng": torch.random.get_rng_state(), "python_rng": random.getstate()}  # saved before them
    expected = torch.rand(2).tolist(), random.random()
    install_streams(load_blob(dump_blob(old), "old"))
    assert (torch.rand(2).tolist(), random.random()) == expected
