"""The trial driver's handle on its learner: N rank actors (one per learner bundle of the trial's placement group)
that form one torch.distributed group, called together.

Every call goes to every rank (FSDP's collectives need all of them) and rank 0's answer is the one returned. The
batch is put in the object store once and every rank reads the same copy. The process group is set up here
rather than with Ray Train: Train's TorchTrainer places its own worker group in its own placement group and
runs a training function to completion, while the learner is a long-lived actor the trial calls once per step,
inside the trial's placement group next to its rollout workers (verl, OpenRLHF and SkyRL do the same).
"""

from __future__ import annotations

import ray

from orchestrator.trial.actors.calls import Calls
from workers.learner.inputs import LearnerBatch, StepResult
from workers.sync.policy import PolicyUpdate


class LearnerGroup:
    """The `LearnerPort` interface (orchestrator/trial/actors/ports.py) over the trial's own rank actors. `ranks`: the learner actors (orchestrator/trial/actors/start.py:LearnerRankActor), rank order, built but not started; or
    `started`: any actors with the Learner's methods whose models are already built (one rank, in tests).
    `calls`: the trial's deadlines (orchestrator/trial/actors/calls.py); every wait on a rank goes through it."""

    def __init__(self, ranks: list, full: bool, started: bool = False, calls: Calls | None = None):
        self.ranks, self.full = ranks, full
        self.calls = calls or Calls()
        self.named = [(f"learner[{i}]", r) for i, r in enumerate(ranks)]
        self._started = []
        if not started:
            init = self.calls.get(ranks[0].rendezvous.remote(), "setup", self.named[:1]) if len(ranks) > 1 else None
            self._started = [r.start.remote(init) for r in ranks]  # model loads on every rank at once

    def ready(self) -> bool:
        self.calls.get(self._started, "setup", self.named)
        return all(self.calls.get([r.ready.remote() for r in self.ranks], "setup", self.named))

    # -- training -------------------------------------------------------------------------------------
    def submit_train_step(self, batch: LearnerBatch) -> list:
        """Start one training step on every rank (returns their futures; `result` waits)."""
        ref = ray.put(batch)
        return [r.train_step.remote(ref) for r in self.ranks]

    def result(self, futures: list) -> StepResult:
        return self.calls.get(futures, "train", self.named)[0]

    def train_step(self, batch: LearnerBatch) -> StepResult:
        return self.result(self.submit_train_step(batch))

    def release_cache(self) -> None:
        """Every rank returns its cached, unused GPU memory to the device (colocated trials, before the engines
        wake: orchestrator/trial/actors/phases.py)."""
        self.calls.get([r.release_cache.remote() for r in self.ranks], "sync", self.named)

    # -- the policy for the engines -------------------------------------------------------------------
    def export_policy(self, version: int) -> PolicyUpdate:
        """The learner's policy as `version` (workers/sync/: the LoRA adapter, or the full weights with their
        checksum), gathered on rank 0 (every rank takes part: FSDP's collectives)."""
        return self.calls.get([r.export_policy.remote(version) for r in self.ranks], "sync", self.named)[0]

    # -- checkpoints ----------------------------------------------------------------------------------
    def write_checkpoint(self, directory: str) -> list[str]:
        """Every rank's checkpoint files written under `directory` (names are distinct per rank:
        workers/learner/state.py), each rank's as it arrives and then dropped, so the driver holds one rank's
        share at a time (about 16 bytes per trained parameter / ranks in full mode). Returns the names."""
        from pathlib import Path

        names = []
        for part in self.calls.wait_each([r.checkpoint_files.remote() for r in self.ranks], "checkpoint", self.named):
            for name, data in part.items():
                path = Path(directory) / name
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(data)
                names.append(name)
            del part
        return names

    def restore(self, files: dict[str, bytes], source: str) -> None:
        """Load a checkpoint saved by a group of any size; each rank fetches only the pieces it reads."""
        pieces = ObjectStoreFiles(files)
        self.calls.get([r.restore.remote(pieces, source) for r in self.ranks], "checkpoint", self.named)

    def placements(self) -> list[dict]:
        return self.calls.get([r.placement.remote() for r in self.ranks], "setup", self.named)

    def shutdown(self) -> None:
        """Kill every rank actor (their models and process group go with them). Idempotent. Use
        orchestrator/trial/actors/start.py:shutdown_actors to end a trial's actors together."""
        for r in self.ranks:
            ray.kill(r)



PIECE_BYTES = 64 * 2**20


class ObjectStoreFiles:
    """A checkpoint's files in the object store in pieces of `piece` bytes, read by byte range
    (workers/checkpoint/shard_files.py:CheckpointFiles): a learner rank fetches only the pieces holding the chunks its
    part of the model needs, so N ranks restoring a sharded checkpoint each pull about 1/N of it, not all of it."""

    def __init__(self, files: dict[str, bytes], piece: int = PIECE_BYTES):
        self.piece = piece
        self.sizes = {name: len(data) for name, data in files.items()}
        self.pieces = {name: [ray.put(data[i:i + piece]) for i in range(0, max(len(data), 1), piece)]
                       for name, data in files.items()}
        self._last: tuple[str, int, bytes] | None = None  # consecutive chunks mostly share a piece

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_last": None}

    def __contains__(self, name: object) -> bool:
        return name in self.sizes

    def size(self, name: str) -> int:
        return self.sizes[name]

    def read(self, name: str, start: int = 0, end: int | None = None) -> bytes:
        end = self.sizes[name] if end is None else min(end, self.sizes[name])
        if end <= start:
            return b""
        first, last = start // self.piece, (end - 1) // self.piece
        data = b"".join(self._get(name, k) for k in range(first, last + 1))
        return data[start - first * self.piece:end - first * self.piece]

    def _get(self, name: str, k: int) -> bytes:
        if self._last is None or self._last[:2] != (name, k):  # runs in a learner rank: the driver's wait on
            self._last = (name, k, ray.get(self.pieces[name][k]))  # `restore` bounds it (calls.py, "checkpoint")
        return self._last[2]
