"""SharedRolloutWorker's continuous batching and slot bookkeeping (workers/rollout/shared.py) against a fake engine
that steps: calls waiting together are admitted into one batch with each prompt under its own slot's adapter and
its own params, each caller gets exactly its own outputs, a call arriving while others decode joins the running
batch (and a load of another slot runs between two steps), a load or drop of a slot is never reordered around that
slot's generate, LoRA ids are never reused, a reload or drop evicts only its slot's adapter, a failed load breaks
only its slot. The real engine: tests/integration/rollout/test_shared_engine.py."""

from __future__ import annotations

import sys
import threading
import time
from dataclasses import dataclass
from types import ModuleType, SimpleNamespace

import pytest

from workers.rollout.sampling import SamplingRequest
from workers.sync.policy import PolicyUpdate


@dataclass(frozen=True)
class FakeLoRARequest:
    lora_name: str
    lora_int_id: int
    lora_path: str


class FakeEngineCore:
    """vLLM's LLMEngine as the shared engine drives it: requests added by id, `step` advancing every running request
    by one token; a request whose prompt starts with token t runs `durations.get(t, 1)` steps. `on_step(k)` runs
    inside step k (from 1): a test's hook to act while requests are in flight."""

    def __init__(self, log: list):
        self.log, self.loaded, self.fail = log, set(), False
        self.running: dict[str, list] = {}  # id -> [steps left, (first token, LoRA id, seed)]
        self.durations: dict[int, int] = {}
        self.steps, self.on_step = 0, None

    def add_lora(self, req) -> bool:
        self.log.append(("add", req.lora_int_id))
        if self.fail:
            raise RuntimeError("bad adapter")
        self.loaded.add(req.lora_int_id)
        return True

    def remove_lora(self, int_id: int) -> bool:
        self.log.append(("remove", int_id))
        self.loaded.discard(int_id)
        return True

    def list_loras(self) -> set[int]:
        return set(self.loaded)

    def add_request(self, request_id, prompt, params, lora_request=None):
        key = (prompt["prompt_token_ids"][0], getattr(lora_request, "lora_int_id", 0), params)
        self.log.append(("request", key))
        self.running[request_id] = [self.durations.get(key[0], 1), key]

    def abort_request(self, request_ids):
        for rid in request_ids:
            self.running.pop(rid, None)

    def has_unfinished_requests(self) -> bool:
        return bool(self.running)

    def step(self):
        self.steps += 1
        if self.on_step is not None:
            self.on_step(self.steps)
        self.log.append(("step", sorted(k[0] for _, k in self.running.values())))
        outs = []
        for rid, entry in list(self.running.items()):
            entry[0] -= 1
            if entry[0] == 0:
                del self.running[rid]
                ids = list(entry[1])
                lps = [{t: SimpleNamespace(logprob=-float(t))} for t in ids]
                outs.append(SimpleNamespace(request_id=rid, finished=True, outputs=[SimpleNamespace(
                    index=0, token_ids=ids, logprobs=lps, finish_reason="length", text="")]))
        return outs


class FakeLLM:
    """Answers each prompt with one completion whose tokens are (the prompt's first token, its LoRA id, seed)."""

    def __init__(self):
        self.log: list = []
        self.llm_engine = FakeEngineCore(self.log)


@pytest.fixture
def worker(monkeypatch, tmp_path):
    import workers.rollout.shared as shared

    for name in ("vllm", "vllm.lora", "vllm.lora.request"):  # AdapterSync's LoRARequest, without vLLM's import
        monkeypatch.setitem(sys.modules, name, ModuleType(name))
    sys.modules["vllm.lora.request"].LoRARequest = FakeLoRARequest
    llm = FakeLLM()
    monkeypatch.setattr(shared, "open_engine", lambda model, s, args: (llm, dict(args), True))
    monkeypatch.setattr(shared, "sampling_params", lambda prompt_ids, r: (
        [{"prompt_token_ids": list(p)} for p in prompt_ids], [r.seed + i for i in range(len(prompt_ids))], None))
    w = shared.SharedRolloutWorker("model", 3)
    yield w, llm
    w.close()


def _req(seed: int) -> SamplingRequest:
    return SamplingRequest(n=1, temperature=1.0, max_tokens=3, seed=seed)


def _update(version: int) -> PolicyUpdate:
    return PolicyUpdate("adapter", version, {"adapter_config.json": b"{}"})


def _wait_queued(w, k: int) -> None:
    deadline = time.monotonic() + 10
    while w.waiting() < k:
        assert time.monotonic() < deadline
        time.sleep(0.005)


def _in_threads(w, calls) -> list:
    """Run `calls` (functions of the worker) from one thread each while the engine is held; their results."""
    out = [None] * len(calls)

    def run(i):
        try:
            out[i] = calls[i](w)
        except Exception as e:  # handed back to the test
            out[i] = e

    w.hold()
    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(calls))]
    for t in threads:
        t.start()
    _wait_queued(w, len(calls))
    w.release()
    for t in threads:
        t.join(10)
    return out


def test_the_engine_args_give_every_slot_a_place_and_one_more(worker):
    w, _ = worker
    s = w.settings()
    assert (s["enable_lora"], s["max_loras"], s["max_cpu_loras"]) == (True, 3, 4)


def test_waiting_calls_are_admitted_into_one_batch_each_caller_its_own(worker):
    w, llm = worker
    w.load_policy(0, _update(1))
    w.load_policy(1, _update(1))
    llm.log.clear()
    outs = _in_threads(w, [
        lambda w: w.generate(0, [[10], [11]], _req(100)),
        lambda w: w.generate(1, [[20]], _req(200)),
        lambda w: w.generate(2, [[30], [31], [32]], _req(300)),
    ])
    sent = sorted(k for kind, k in llm.log if kind == "request")
    assert sent == sorted([(10, 1, 100), (11, 1, 101), (20, 2, 200), (30, 0, 300), (31, 0, 301), (32, 0, 302)])
    assert [e for e in llm.log if e[0] == "step"] == [("step", [10, 11, 20, 30, 31, 32])]  # one batch
    stats = w.stats()
    assert {k: stats[k] for k in ("admissions", "served_calls", "max_in_flight", "engine_steps")} == {
        "admissions": 1, "served_calls": 3, "max_in_flight": 3, "engine_steps": 1}
    assert 0 < stats["step_s"] <= stats["up_s"] and stats["adapter_s"] > 0
    got = [[c.token_ids for g in gen.completions for c in g] for gen in outs]
    assert got == [[[10, 1, 100], [11, 1, 101]], [[20, 2, 200]], [[30, 0, 300], [31, 0, 301], [32, 0, 302]]]
    assert [gen.adapter_version for gen in outs] == [1, 1, None]


def test_a_call_arriving_mid_batch_joins_it_and_another_slots_load_runs_between_steps(worker):
    """Slot 0 decodes for 6 steps. At its step 2, three calls arrive: a load of slot 1, a generate on slot 1 (2 steps)
    and a reload of slot 0. Slot 1's load and generate run while slot 0 still decodes (the engine's log: slot 1's
    request joins at step 3 and finishes at step 4 of 6); slot 0's reload waits for slot 0's requests to finish.
    Read from the engine's own log, not from the callers' clocks (a caller's thread may wake after another's)."""
    w, llm = worker
    w.load_policy(0, _update(1))
    eng, results, threads = llm.llm_engine, {}, []
    eng.durations = {1: 6, 2: 2}

    def mid_batch(k):
        if k != 2:
            return
        for name, fn in [("load1", lambda: w.load_policy(1, _update(3))),
                         ("gen1", lambda: w.generate(1, [[2]], _req(7))),
                         ("reload0", lambda: w.load_policy(0, _update(2)))]:
            threads.append(threading.Thread(target=lambda n=name, f=fn: results.setdefault(n, f())))
            threads[-1].start()
            _wait_queued(w, len(threads))

    eng.on_step = mid_batch
    llm.log.clear()
    gen0 = w.generate(0, [[1]], _req(0))
    for t in threads:
        t.join(10)
    kinds = [(kind, k if kind != "step" else tuple(k)) for kind, k in llm.log]
    assert kinds == [("request", (1, 1, 0)), ("step", (1,)), ("step", (1,)),
                     ("add", 2), ("request", (2, 2, 7)), ("step", (1, 2)), ("step", (1, 2)), ("step", (1,)),
                     ("step", (1,)), ("add", 3), ("remove", 1)]
    assert gen0.adapter_version == 1 and results["gen1"].adapter_version == 3 and results["reload0"] == 2
    assert w.stats()["max_in_flight"] == 2


def test_a_load_is_never_reordered_around_a_generate(worker):
    w, llm = worker
    w.hold()
    results = {}
    t1 = threading.Thread(target=lambda: results.setdefault("g1", w.generate(0, [[1]], _req(0))))
    t1.start()
    _wait_queued(w, 1)
    t2 = threading.Thread(target=lambda: results.setdefault("load", w.load_policy(0, _update(4))))
    t2.start()
    _wait_queued(w, 2)
    t3 = threading.Thread(target=lambda: results.setdefault("g2", w.generate(0, [[2]], _req(0))))
    t3.start()
    _wait_queued(w, 3)
    w.release()
    for t in (t1, t2, t3):
        t.join(10)
    assert [e[0] for e in llm.log] == ["request", "step", "add", "request", "step"]
    assert results["g1"].adapter_version is None and results["g2"].adapter_version == 4 and results["load"] == 4


def test_ids_are_fresh_and_a_reload_or_drop_evicts_only_its_slot(worker, tmp_path):
    w, llm = worker
    w.load_policy(0, _update(1))
    w.load_policy(1, _update(1))
    w.load_policy(0, _update(2))  # slot 0 reloaded: id 3, id 1 evicted, slot 1's id 2 kept
    assert llm.llm_engine.list_loras() == {2, 3} and ("remove", 2) not in llm.log
    state = w.lora_state()
    assert [s["lora_id"] for s in state["slots"]] == [3, 2, None]
    assert [s["dirs"] for s in state["slots"]] == [["v2_id3"], ["v1_id2"], []]
    w.drop(1)
    assert llm.llm_engine.list_loras() == {3} and w.adapter_version(1) is None
    assert w.lora_state()["slots"][1]["dirs"] == []
    w.load_policy(1, _update(7))
    assert w.lora_state()["slots"][1]["lora_id"] == 4  # never an id used before, by any slot
    adds = [i for kind, i in llm.log if kind == "add"]
    assert adds == sorted(set(adds))


def test_a_failed_load_breaks_only_its_slot(worker):
    w, llm = worker
    w.load_policy(0, _update(1))
    w.load_policy(1, _update(1))
    llm.llm_engine.fail = True
    with pytest.raises(RuntimeError, match="bad adapter"):
        w.load_policy(1, _update(2))
    llm.llm_engine.fail = False
    assert w.broken(1) and w.adapter_version(1) is None and llm.llm_engine.list_loras() == {1}
    outs = _in_threads(w, [lambda w: w.generate(0, [[5]], _req(0)), lambda w: w.generate(1, [[6]], _req(0))])
    assert outs[0].completions[0][0].token_ids == [5, 1, 0]
    assert isinstance(outs[1], RuntimeError) and "slot 1 unusable" in str(outs[1])
    w.drop(1)  # a freed slot is clean again: the base model
    assert w.broken(1) is None and w.generate(1, [[6]], _req(0)).adapter_version is None


def test_bad_calls_name_what_is_allowed(worker):
    w, _ = worker
    with pytest.raises(ValueError, match=r"slot must be an int in \[0, 3\)"):
        w.generate(3, [[1]], _req(0))
    with pytest.raises(ValueError, match="adapter updates only"):
        w.load_policy(0, PolicyUpdate("weights", 1, {"x": b""}))
