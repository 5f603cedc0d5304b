"""Full policy weights from the learner to a vLLM rollout worker (`learner.mode: full`).

The learner packs its HF-named state dict into safetensors files as bytes (`pack_weights`; nodes share no
filesystem, so bytes travel through Ray) and computes `weights_checksum` on the same state dict, both in a
`PolicyUpdate` of kind "weights". The rollout worker's `FullWeightSync` writes the files to a fresh directory
and has vLLM's model worker run `WeightSyncExtension.sync_load_weights` (a `worker_extension_cls`: one code path
whether the model worker runs in the rollout worker's process or in engine processes of its own; a method name
crosses the process boundary, no callable is pickled). vLLM reads the files itself, so the same path works on a GPU; a NCCL broadcast from the
learner to the engines would avoid the disk and object-store hop and is not built.

vLLM facts this relies on (vllm 0.32, checked on the CPU build):
- `Worker.reload_weights(weights_iterator=...)` loads HF-named tensors in place through the model's own
  `load_weights` (q/k/v are fused into `qkv_proj` and gate/up into `gate_up_proj` there). A parameter it gets
  no tensor for only logs a warning and keeps its old values (a fused one missing a part is left partly
  uninitialized), so the extension checks the files' tensor names against the model before loading anything.
  An iterator is passed rather than `weights_path=`, which would repoint the engine's `model_config.model` at a
  directory the worker deletes right after.
- A tied `lm_head.weight` is skipped by vLLM (it is the embedding's parameter there), so it may be sent or not.
  But vLLM-CPU packs the LM head's weight into a kernel copy after loading, and a reload does not re-pack a tied
  head: the extension re-packs it (`_repack_tied_heads`), or the logits would keep the old embedding.
- Pipeline parallelism is not supported (a stage lacks layers, so the name check fails loudly).
- Tensors cannot cross `collective_rpc` on the CPU build; paths and strings can.
- vLLM 0.33 (the `gpu` extra), read from its source, not run: `Worker.reload_weights` forwards to the model
  runner, and both GPU runners (V1 `gpu_model_runner` and V2 `gpu/model_runner`, `VLLM_USE_V2_MODEL_RUNNER`)
  take the same `weights_iterator=` and call the same in-place loader as the CPU build's.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path

import torch

from workers.sync.policy import PolicyUpdate, write_files

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
MAX_FILE_BYTES = 2 * 1024**3  # per safetensors file, as in HF's sharded checkpoints
EMBED_ROWS = 16
_LAYER_NORM = re.compile(r"^model\.layers\.(\d+)\.(input_layernorm|post_attention_layernorm)\.weight$")


def pack_weights(
    state: Mapping[str, torch.Tensor], dtype: torch.dtype, *, max_file_bytes: int = MAX_FILE_BYTES
) -> dict[str, bytes]:
    """HF-named full state dict (as `model.state_dict()` of a transformers causal LM gives it) -> safetensors
    files as bytes, every tensor cast to `dtype` (the engine's).

    Returns {"model.safetensors": bytes} when the tensors fit in `max_file_bytes`, else
    {"model-0000k-of-0000n.safetensors": bytes, ..., "model.safetensors.index.json": bytes} (HF's sharded
    layout; a tensor larger than the limit gets a file of its own). Tensors that share storage with an earlier one
    (a tied `lm_head.weight` aliases `model.embed_tokens.weight`) are written once, under the first name, as in
    the checkpoints transformers saves. Tensors may live on any device; they are copied to the CPU one file at a
    time, so the peak beyond the returned bytes is one file's tensors.
    """
    from safetensors.torch import save

    if not state:
        raise ValueError("pack_weights: empty state dict")
    if max_file_bytes <= 0:
        raise ValueError(f"max_file_bytes must be > 0, got {max_file_bytes}")
    seen: set[tuple] = set()
    tensors: dict[str, torch.Tensor] = {}
    for name, t in state.items():
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"pack_weights: {name} is a {type(t).__name__}, not a tensor")
        key = (t.device, t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), t.stride())
        if t.numel() and key in seen:
            continue
        seen.add(key)
        tensors[name] = t

    shards: list[list[str]] = [[]]
    size = 0
    for name, t in tensors.items():
        nbytes = t.numel() * dtype.itemsize
        if shards[-1] and size + nbytes > max_file_bytes:
            shards.append([])
            size = 0
        shards[-1].append(name)
        size += nbytes

    def file(names: list[str]) -> bytes:
        cast = {n: tensors[n].detach().to(device="cpu", dtype=dtype).contiguous() for n in names}
        return save(cast, metadata={"format": "pt"})  # the metadata transformers writes; its loader checks it

    if len(shards) == 1:
        return {SINGLE_FILE: file(shards[0])}
    n = len(shards)
    out: dict[str, bytes] = {}
    weight_map: dict[str, str] = {}
    for k, names in enumerate(shards, start=1):
        fname = f"model-{k:05d}-of-{n:05d}.safetensors"
        out[fname] = file(names)
        weight_map.update(dict.fromkeys(names, fname))
    total = sum(t.numel() for t in tensors.values()) * dtype.itemsize
    out[INDEX_FILE] = json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2).encode()
    return out


def checksum_names(names) -> list[str]:
    """The parameters `weights_checksum` reads, in order: `model.embed_tokens.weight` (its first EMBED_ROWS rows),
    every layer's `input_layernorm.weight` and `post_attention_layernorm.weight` (by layer index), then
    `model.norm.weight`.

    Why these: they carry the same name and layout in the HF state dict and in vLLM's Llama / Qwen2 / Qwen3
    (vLLM fuses q/k/v and gate/up, so projections differ), they are whole on tensor-parallel rank 0 (norms are
    replicated; the vocab-parallel embedding keeps the first rows on rank 0 and pads the vocabulary at the end
    only), and the norms take a gradient from every token, so two versions of a policy hardly ever share them."""
    names = set(names)
    layers = sorted((int(m.group(1)), m.group(0)) for n in names if (m := _LAYER_NORM.match(n)))
    out = ["model.embed_tokens.weight", *(n for _, n in layers), "model.norm.weight"]
    missing = [n for n in out if n not in names]
    if missing or not layers:
        raise KeyError(f"weights_checksum needs {missing or 'model.layers.N.*_layernorm.weight'}: not a "
                       "Llama/Qwen-style decoder")
    return out


def weights_checksum(named: Mapping[str, torch.Tensor], dtype: torch.dtype) -> str:
    """sha256 (hex) over the slice `checksum_names` picks from `named` (name -> tensor: the learner's HF state
    dict, or vLLM's `dict(model.named_parameters())`), each cast to `dtype` (the engine's) before hashing, so both
    sides hash the very bytes the engine holds. Each entry's name and shape are hashed with its bytes."""
    h = hashlib.sha256()
    for name in checksum_names(named.keys()):
        t = named[name].detach()
        if name == "model.embed_tokens.weight":
            if t.shape[0] < EMBED_ROWS:
                raise ValueError(f"{name} has {t.shape[0]} rows; the checksum reads {EMBED_ROWS}")
            t = t[:EMBED_ROWS]
        t = t.to(device="cpu", dtype=dtype).contiguous()
        h.update(f"{name}:{tuple(t.shape)};".encode())
        h.update(t.view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def iter_safetensors(directory: str | Path) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) for every tensor of every `*.safetensors` file in `directory` (sorted by file name), read
    one tensor at a time. Raises when there is none."""
    from safetensors import safe_open

    for f in _safetensors_files(directory):
        with safe_open(str(f), framework="pt") as sf:
            for name in sf.keys():  # noqa: SIM118 (safe_open is not a mapping)
                yield name, sf.get_tensor(name)


def engine_checkpoint_names(
    named_parameters: Iterable[tuple[str, object]], packed_modules: Mapping[str, Sequence[str]]
) -> tuple[set[str], set[str]]:
    """The HF checkpoint names a vLLM model loads -> (required, optional).

    `named_parameters`: the model's `named_parameters(remove_duplicate=False)`; `packed_modules`: its
    `packed_modules_mapping` ({"qkv_proj": ["q_proj", "k_proj", "v_proj"], ...}). A fused parameter requires each
    of its parts (`...qkv_proj.weight` -> `...q_proj.weight`, `...k_proj.weight`, `...v_proj.weight`); a
    parameter reached again under another name (a tied `lm_head.weight`) is optional there: vLLM skips it.
    Exact for Llama / Qwen2 / Qwen3, whose vLLM names differ from HF's only by fusion."""
    required: set[str] = set()
    optional: set[str] = set()
    seen: set[int] = set()
    for name, param in named_parameters:
        module, _, leaf = name.rpartition(".")
        parent, _, last = module.rpartition(".")
        parts = packed_modules.get(last)
        names = [f"{parent}.{p}.{leaf}" if parent else f"{p}.{leaf}" for p in parts] if parts else [name]
        (optional if id(param) in seen else required).update(names)
        seen.add(id(param))
    return required, optional - required


def check_checkpoint_names(names: Iterable[str], required: set[str], optional: set[str]) -> None:
    """Raise ValueError unless `names` holds every required name and nothing but required or optional ones.

    vLLM itself only logs a warning for a parameter it got no tensor for (it keeps its old values, or leaves the
    missing part of a fused parameter uninitialized), so this runs before any tensor is loaded."""
    names = set(names)
    missing, unexpected = sorted(required - names), sorted(names - required - optional)
    if missing or unexpected:
        raise ValueError(f"weight files do not match the engine's model: {len(missing)} missing {missing[:6]}, "
                         f"{len(unexpected)} unexpected {unexpected[:6]}")


def safetensors_names(directory: str | Path) -> set[str]:
    """Tensor names in the `*.safetensors` files of `directory` (headers only)."""
    from safetensors import safe_open

    out: set[str] = set()
    for f in _safetensors_files(directory):
        with safe_open(str(f), framework="pt") as sf:
            out.update(sf.keys())
    return out


def _safetensors_files(directory: str | Path) -> list[Path]:
    files = sorted(Path(directory).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors file in {directory}")
    return files


def _repack_tied_heads(model) -> None:
    """Re-run the after-loading step of every embedding-type layer whose weight is another layer's (a tied LM head).

    vLLM-CPU packs an LM head's weight into a kernel-specific copy after loading. A reload re-packs the layers it
    loaded, but a tied head is loaded under the embedding's name only, so it kept computing logits with the old
    embedding (seen on the tiny Qwen2: the embedding and its checksum were new, the log-probs were not). On a GPU
    this step does nothing."""
    from vllm.model_executor.layers.vocab_parallel_embedding import (
        UnquantizedEmbeddingMethod,
        VocabParallelEmbedding,
    )

    seen: set[int] = set()
    for name, param in model.named_parameters(remove_duplicate=False):
        if id(param) in seen:
            layer = model.get_submodule(name.rpartition(".")[0])
            if isinstance(layer, VocabParallelEmbedding) and isinstance(layer.quant_method, UnquantizedEmbeddingMethod):
                layer.quant_method.process_weights_after_loading(layer)
        seen.add(id(param))


class WeightSyncExtension:
    """Mixed into vLLM's model worker class (`LLM(worker_extension_cls="workers.sync.full_weights.WeightSyncExtension")`)
    and called through `llm.collective_rpc("sync_load_weights", ...)`. `self` is vLLM's worker
    (`get_model`, `reload_weights`, `vllm_config`)."""

    def sync_load_weights(self, weights_dir: str) -> str:
        """Load every tensor in `weights_dir` into the running model in place; returns `sync_checksum()`.

        The file's names are checked against the model first (`check_checkpoint_names`), so a partial or misnamed
        set raises before any weight changes."""
        model = self.get_model()
        check_checkpoint_names(
            safetensors_names(weights_dir),
            *engine_checkpoint_names(model.named_parameters(remove_duplicate=False),
                                     getattr(model, "packed_modules_mapping", None) or {}))
        self.reload_weights(weights_iterator=iter_safetensors(weights_dir))
        _repack_tied_heads(model)
        return self.sync_checksum()

    def sync_checksum(self) -> str:
        """`weights_checksum` of the engine's loaded parameters, in the engine's dtype."""
        return weights_checksum(dict(self.get_model().named_parameters()), self.vllm_config.model_config.dtype)


WEIGHTS = "weights"
WEIGHT_SYNC_EXTENSION = "workers.sync.full_weights.WeightSyncExtension"  # vLLM imports it in its model worker


class FullWeightSync:
    """The policy as the engine's own weights, reloaded in place (`WeightSyncExtension`) from the files of a
    `PolicyUpdate` of kind "weights", written under `root` and deleted once loaded."""

    kind = WEIGHTS

    def __init__(self, root: Path):
        self.root = Path(root)
        self._loads = 0  # loads tried: each gets a fresh directory

    def engine_args(self) -> dict:
        return dict(enable_lora=False, worker_extension_cls=WEIGHT_SYNC_EXTENSION)

    def apply(self, llm, update: PolicyUpdate) -> None:
        """The files go to a fresh directory (deleted again before returning, whatever happens: the engine holds
        the weights), the engine reloads them in place and the prefix cache is reset (its KV blocks were computed
        with the old weights). The engine's `weights_checksum` of the loaded parameters must equal the update's,
        else this raises (the weights may be half overwritten: the worker must not sample with them)."""
        self._loads += 1
        path = self.root / f"weights_v{update.version}_{self._loads}"
        try:
            write_files(path, update.files, "weight")
            got = llm.collective_rpc("sync_load_weights", args=(str(path),))
            if not llm.reset_prefix_cache():  # False while requests run; generate is synchronous
                raise RuntimeError("vLLM did not reset its prefix cache after the weight load")
            if any(g != update.checksum for g in got):
                raise ValueError(f"weights checksum mismatch: learner {update.checksum}, engine {got}")
        finally:
            shutil.rmtree(path, ignore_errors=True)

    def lora_request(self):
        return None

    def lora_ids(self, llm) -> list[int]:
        return []

    @staticmethod
    def checksum(llm) -> str:
        """`weights_checksum` of the weights the engine holds now (model worker of rank 0)."""
        return llm.collective_rpc("sync_checksum")[0]
