"""vLLM's sampler helpers are `torch.compile`d; an eager CPU engine turns Dynamo off (workers/rollout/engine.py:
quiet_sampler_compile). Torch keeps that switch per thread, and a Ray actor with concurrency groups builds its
engine on one thread and samples on another, so the worker sets it again on each `generate`'s thread."""

from __future__ import annotations

import threading

import torch

from workers.rollout import worker as worker_mod
from workers.rollout.engine import quiet_sampler_compile


@torch.compile(backend="eager", dynamic=True)  # at import, as vLLM's; "eager": Dynamo traces, no C++ is built
def count_greater(x: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    return (x >= values).sum(-1)


def _frames_compiled_on_a_new_thread(prepare) -> int:
    """How many graphs Dynamo captured when a compiled helper ran on a fresh thread after `prepare` ran there."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()

    def run() -> None:
        prepare()
        count_greater(torch.randn(4, 50), torch.randn(4, 1))

    t = threading.Thread(target=run)
    t.start()
    t.join()
    return counters["stats"]["unique_graphs"]


def _on_a_thread(fn, *args) -> None:
    t = threading.Thread(target=fn, args=args)
    t.start()
    t.join()


def test_the_switch_is_per_thread_so_a_new_thread_must_set_it_again(monkeypatch):
    monkeypatch.setenv("TORCH_COMPILE_DISABLE", "0")  # put back after the test (quiet_sampler_compile sets it)
    _on_a_thread(quiet_sampler_compile)  # as an actor's __init__ thread would
    assert _frames_compiled_on_a_new_thread(lambda: None) == 1  # another thread still compiles
    assert _frames_compiled_on_a_new_thread(quiet_sampler_compile) == 0


class _Llm:
    def __init__(self):
        self.seen_disabled: list[bool] = []

    def generate(self, prompts, params, lora_request=None, use_tqdm=False):
        self.seen_disabled.append(torch._dynamo.config.disable)
        return []


def test_each_generate_sets_it_on_its_own_thread(monkeypatch, tmp_path):
    monkeypatch.setenv("TORCH_COMPILE_DISABLE", "0")
    llm = _Llm()
    monkeypatch.setattr(worker_mod, "open_engine", lambda model, s, args: (llm, {"enforce_eager": True}, True))
    monkeypatch.setattr(worker_mod, "completions", lambda outs, stop, action_ids: ([], 0))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    built = []
    _on_a_thread(lambda: built.append(worker_mod.RolloutWorker("unused", worker_mod.RolloutWorkerSettings())))
    request = worker_mod.SamplingRequest(n=1, temperature=1.0, max_tokens=2, seed=0)
    _on_a_thread(built[0].generate, [[2, 5]], request)  # another thread than the engine's builder
    assert llm.seen_disabled == [True]
