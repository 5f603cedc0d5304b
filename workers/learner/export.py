"""The trained policy of a learner checkpoint (workers/learner/state.py) as a model directory other tools load.

- LoRA: a PEFT adapter directory (`adapter_config.json` + `adapter_model.safetensors`) that
  `PeftModel.from_pretrained(base, dir)` and vLLM's `LoRARequest` load; `merge`: the adapter merged into the base
  weights, saved as a plain transformers model.
- full: the whole policy gathered from the sharded (DCP) checkpoint of any number of ranks, as safetensors.
Built on CPU in float32 (the learner's master weights), from the blob (a one-rank LoRA learner) or the shards,
read with the same loaders as a restore (weights-only; refused metadata raises `UnsafeCheckpoint`).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from workers.checkpoint.blob import CorruptCheckpoint, load_blob
from workers.learner.config import LearnerConfig
from workers.learner.state import BLOB, SHARDS


def export_policy_dir(files: Mapping[str, bytes], model_path: str, learner: LearnerConfig, out: str | Path, *,
                      merge: bool = False, source: str = "checkpoint") -> str:
    """Write the checkpoint's policy to `out`; returns what was written: "adapter", "merged" or "full".
    `files`: the checkpoint's learner files by name (the blob and `learner_shards/...`); `model_path`: the base
    model the trial trained from."""
    import torch

    from workers.checkpoint.shard_files import Under, as_files
    from workers.checkpoint.sharded import load_shards
    from workers.learner.modules import load_causal_lm, lora_config

    state = load_blob(files[BLOB], f"{source}/{BLOB}")
    sharded = state.get("format") == "sharded"
    shards = Under(as_files(dict(files)), f"{SHARDS}/") if sharded else None
    model = load_causal_lm(model_path, torch.float32, "cpu")
    out = Path(out)
    if learner.mode == "full":
        if not sharded:
            raise CorruptCheckpoint(f"{source}/{BLOB}: saved by a LoRA learner (no full weights to export)")
        load_shards(shards, {"policy": (model, None)}, trainable_only=False, source=f"{source}/{SHARDS}")
        model.save_pretrained(out, safe_serialization=True)
        return "full"
    from peft import get_peft_model, set_peft_model_state_dict

    peft = get_peft_model(model, lora_config(learner.lora))
    if sharded:
        load_shards(shards, {"policy": (peft, None)}, trainable_only=True, source=f"{source}/{SHARDS}")
    else:
        set_peft_model_state_dict(peft, state["adapter"])
    if merge:
        peft.merge_and_unload().save_pretrained(out, safe_serialization=True)
        return "merged"
    peft.save_pretrained(out, selected_adapters=["default"])
    return "adapter"
