"""What leaves the learner: the policy for the rollout workers (LoRA adapter files, or the full weights), and the
checkpoint (a weights-only blob plus, for a sharded learner, `torch.distributed.checkpoint` shards).

Checkpoint files (`checkpoint_files`, merged over the ranks by the trial driver into one directory):
    learner.pt            weights-only blob: LR scheduler, RNG, step counters; an unsharded LoRA learner also keeps
                          its adapter and optimizer here (the format every checkpoint before the learner group had)
    learner_shards/...    DCP shards of the trained weights and optimizer state (sharded or full-mode learners),
                          saved by every rank in parallel and restorable on any number of ranks (DCP reshards)
Exports and sharded saves are collective calls: every rank of a group must make them; rank 0's result is the one
that counts (others return None / their own shard files).
"""

from __future__ import annotations

import copy
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from workers.checkpoint.blob import CorruptCheckpoint, dump_blob, load_blob
from workers.learner.rng import capture_streams, install_streams
from workers.sync.policy import PolicyUpdate

if TYPE_CHECKING:
    from torch import nn

    from workers.learner.context import Layout, PolicyOptim

BLOB, SHARDS = "learner.pt", "learner_shards"


@dataclass
class Progress:
    """The learner's step counters: training steps done and policy optimizer steps taken (saved in checkpoints)."""

    steps_done: int = 0
    optimizer_steps: int = 0


class PolicyExport:
    """The policy as the rollout workers load it, from the policy `model` (and the LoRA `critic` sharing it,
    whose adapter never leaves), laid out as `layout` says. Collective on a sharded learner."""

    def __init__(self, model: nn.Module, critic, layout: Layout) -> None:
        self.model, self.critic = model, critic
        self.full, self.sharded, self.dtype, self.ranks = layout.full, layout.sharded, layout.dtype, layout.ranks

    # -- the policy, for the rollout workers ------------------------------------------------------------
    def export_policy(self, version: int) -> PolicyUpdate | None:
        """The policy as vLLM takes it (workers/sync/policy.py): kind "adapter" with the adapter files (lora) or
        kind "weights" with the files and their checksum (full, in the engine's dtype). None on ranks other
        than 0."""
        if not self.full:
            files = self.export_adapter(version)
            return PolicyUpdate("adapter", version, files) if files is not None else None
        from workers.learner.modules import full_state
        from workers.sync.full_weights import pack_weights, weights_checksum

        state = full_state(self.model, sharded=self.sharded)
        if not self.ranks.leader:
            return None
        if self.critic is not None and getattr(self.critic, "full_policy", False):
            state = self.critic.policy_weights(state)
        return PolicyUpdate("weights", version, pack_weights(state, self.dtype), weights_checksum(state, self.dtype))

    def export_adapter(self, version: int) -> dict[str, bytes] | None:
        """The policy adapter as PEFT files (bytes), written to a fresh directory so vLLM never sees a stale one;
        never the critic's adapter. Sharded: gathered from the shards onto rank 0 (others return None)."""
        with tempfile.TemporaryDirectory(prefix=f"adapter-v{version}-") as d:
            if not self.sharded:
                self.model.save_pretrained(d, selected_adapters=["default"])
            else:
                from peft.utils import get_peft_model_state_dict
                from safetensors.torch import save_file

                from workers.learner.modules import full_state

                state = full_state(self.model, trainable_only=True, sharded=True)  # the active (policy) adapter
                if not self.ranks.leader:
                    return None
                adapter = get_peft_model_state_dict(self.model, state_dict=state, adapter_name="default")
                save_file({k: v.contiguous() for k, v in adapter.items()}, str(Path(d) / "adapter_model.safetensors"),
                          metadata={"format": "pt"})
                config = copy.deepcopy(self.model.peft_config["default"])
                config.inference_mode = True  # as PEFT's save_pretrained writes it
                config.save_pretrained(d)
            return {p.name: p.read_bytes() for p in Path(d).iterdir() if p.is_file()}


class LearnerStateIO:
    """The learner's checkpoint (see module docstring): the policy `model` with its optimiser `optim`, the
    `critic` (None without one), the step counters `progress` (read and restored in place) and the global RNGs."""

    def __init__(self, model: nn.Module, optim: PolicyOptim, critic, layout: Layout, progress: Progress) -> None:
        self.model, self.optimizer, self.scheduler = model, optim.optimizer, optim.scheduler
        self.critic, self.progress = critic, progress
        self.full, self.sharded, self.ranks = layout.full, layout.sharded, layout.ranks

    def _counters(self) -> dict:
        return {"scheduler": self.scheduler.state_dict(), **capture_streams(), "steps_done": self.progress.steps_done,
                "optimizer_steps": self.progress.optimizer_steps}

    def checkpoint_files(self) -> dict[str, bytes]:
        """This rank's part of the checkpoint (file name -> bytes; see module docstring). Collective."""
        if not self.sharded and not self.full:
            return {BLOB: self.state_dict()}
        from workers.checkpoint.sharded import save_shards

        files = {f"{SHARDS}/{name}": data for name, data in save_shards(
            self._parts(), trainable_only=not self.full).items()}
        if self.ranks.leader:
            files[BLOB] = dump_blob({**self._counters(), "format": "sharded", "ranks": self.ranks.world})
        return files

    def restore(self, files, source: str = "checkpoint") -> None:
        """Load `checkpoint_files()` merged over the ranks of whichever group saved them (any number of ranks):
        {name: bytes}, or a `CheckpointFiles` that fetches byte ranges on demand (a rank then reads only its
        share of the shards). Collective on a sharded learner."""
        from workers.checkpoint.shard_files import Under, as_files
        from workers.checkpoint.sharded import load_shards

        files = as_files(files)
        state = load_blob(files.read(BLOB), f"{source}/{BLOB}")
        if state.get("format") != "sharded":  # a one-rank LoRA learner's blob
            if self.full:
                raise CorruptCheckpoint(f"{source}/{BLOB}: saved by a LoRA learner (adapters only); resume it with "
                                        "learner.mode lora")
            if self.sharded:
                self._blob_into_shards(state, f"{source}/{BLOB}")
            else:
                self._load_blob_state(state)
            return
        load_shards(Under(files, f"{SHARDS}/"), self._parts(), trainable_only=not self.full,
                    source=f"{source}/{SHARDS}")
        self._load_counters(state)

    def _blob_into_shards(self, state: dict, where: str) -> None:
        """A one-rank LoRA learner's blob restored on a sharded learner (N ranks, or one rank that offloads).
        The blob holds whole tensors, the adapters keyed as PEFT saves them (adapter name dropped) and the Adam
        state by parameter index; each is matched to this learner's parameter names (the index order is the
        optimizer's, built the same way on any number of ranks) and handed to torch's full-state-dict loader,
        which cuts every rank's shard. Collective: `get_state_dict` gathers the (small) trained tensors."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict

        whole = StateDictOptions(full_state_dict=True, ignore_frozen_params=True)
        if self.critic is not None and "critic" not in state:
            raise CorruptCheckpoint(f"{where}: holds no critic (saved without one); resume it with the "
                                    "credit.advantage_mode it was saved with")
        for name, (model, optim, *_) in self._parts().items():
            msd, osd = get_state_dict(model, optim, options=whole)
            values = {k: _blob_tensor(k, state, where) for k in msd}
            for k, v in values.items():
                if tuple(v.shape) != tuple(msd[k].shape):
                    raise CorruptCheckpoint(f"{where}: {k} has shape {list(v.shape)}, the model "
                                            f"{list(msd[k].shape)} (saved with other LoRA settings?)")
            saved = state["optimizer"] if name == "policy" else state["critic"]["optimizer"]
            named = _named_optimizer(saved, osd, f"{where} ({name} optimizer)")
            set_state_dict(model, optim, model_state_dict=values, optim_state_dict=named, options=whole)
        self._load_counters(state)

    def _parts(self) -> dict:
        """The trained modules and their optimizers, by name, for the shards. A LoRA critic on a full-mode policy
        shares the policy's PeftModel: the critic part holds only its adapter and head, the policy part the rest."""
        c = self.critic
        if c is not None and getattr(c, "full_policy", False):
            return {"policy": (self.model, self.optimizer, lambda k: not c.owns(k)),
                    "critic": (c.module, c.optimizer, lambda k: c.owns(k) or k.startswith("head."))}
        parts = {"policy": (self.model, self.optimizer)}
        if c is not None:
            parts["critic"] = (c.module, c.optimizer)
        return parts

    def _load_counters(self, state: dict) -> None:
        self.scheduler.load_state_dict(state["scheduler"])
        install_streams(state)
        self.progress.steps_done = state.get("steps_done", 0)
        self.progress.optimizer_steps = state.get("optimizer_steps", 0)

    def state_dict(self) -> bytes:
        """An unsharded LoRA learner's whole state (adapter, optimizer, scheduler, RNG) as one weights-only blob."""
        from peft import get_peft_model_state_dict

        state = {"adapter": {k: v.detach().cpu() for k, v in get_peft_model_state_dict(self.model).items()},
                 "optimizer": self.optimizer.state_dict(), **self._counters()}
        if self.critic is not None:
            state["critic"] = self._critic_blob()
        return dump_blob(state)

    def load_state_dict(self, blob: bytes, source: str = "learner state") -> None:
        """Restore `state_dict()`'s blob. Loaded with `torch.load(weights_only=True)` (workers.checkpoint.blob): a
        blob that would run code is refused with `UnsafeCheckpoint` naming `source`."""
        self._load_blob_state(load_blob(blob, source))

    def _load_blob_state(self, state: dict) -> None:
        from peft import set_peft_model_state_dict

        set_peft_model_state_dict(self.model, state["adapter"])
        self.optimizer.load_state_dict(state["optimizer"])
        self._load_counters(state)
        if self.critic is not None:
            self._load_critic_blob(state["critic"])

    def _critic_blob(self) -> dict:
        from peft import get_peft_model_state_dict

        from workers.learner.critic import ADAPTER

        c = self.critic
        return {"adapter": {k: v.detach().cpu() for k, v in get_peft_model_state_dict(
                    c.model, adapter_name=ADAPTER).items()},
                "head": {k: v.detach().cpu() for k, v in c.head.state_dict().items()},
                "optimizer": c.optimizer.state_dict()}

    def _load_critic_blob(self, state: dict) -> None:
        from peft import set_peft_model_state_dict

        from workers.learner.critic import ADAPTER

        c = self.critic
        set_peft_model_state_dict(c.model, state["adapter"], adapter_name=ADAPTER)
        c.head.load_state_dict(state["head"])
        c.optimizer.load_state_dict(state["optimizer"])


def _blob_tensor(key: str, state: dict, where: str) -> torch.Tensor:
    """The blob's tensor for a parameter name of the sharded learner's parts: the critic's head, or a LoRA
    weight of the policy's adapter ("default") or the critic's, under PEFT's saved name (".{adapter}" dropped)."""
    from workers.learner.critic import ADAPTER

    key = key.removeprefix("lm.")  # the LoRA critic's part sees the policy's PeftModel under "lm."
    if key.startswith("head."):
        source = state["critic"]["head"]
        saved = key.removeprefix("head.")
    else:
        adapter = ADAPTER if f".{ADAPTER}." in key else "default"
        source = state["adapter"] if adapter == "default" else state["critic"]["adapter"]
        saved = key.replace(f".{adapter}", "")
    if saved not in source:
        raise CorruptCheckpoint(f"{where}: no {saved} (saved from another model or other LoRA settings)")
    return source[saved]


def _named_optimizer(saved: dict, mine: dict, where: str) -> dict:
    """`saved` (torch's optimizer state dict, keyed by parameter index) keyed by this learner's parameter names,
    taken group by group and position by position from `mine` (the same optimizer's full state dict by name)."""
    groups, per_param = [], {}
    if len(saved["param_groups"]) != len(mine["param_groups"]):
        raise CorruptCheckpoint(f"{where}: {len(saved['param_groups'])} parameter groups, the optimizer "
                                f"{len(mine['param_groups'])}")
    for theirs, ours in zip(saved["param_groups"], mine["param_groups"], strict=True):
        if len(theirs["params"]) != len(ours["params"]):
            raise CorruptCheckpoint(f"{where}: {len(theirs['params'])} parameters, the optimizer "
                                    f"{len(ours['params'])} (saved with other LoRA settings?)")
        for index, fqn in zip(theirs["params"], ours["params"], strict=True):
            if index in saved["state"]:
                per_param[fqn] = saved["state"][index]
        groups.append({**theirs, "params": list(ours["params"])})
    return {"state": per_param, "param_groups": groups}
