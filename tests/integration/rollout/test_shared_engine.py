"""The pool's shared rollout engine (workers/rollout/shared.py) on real Ray + vLLM-CPU with the tiny model: ONE
engine for the module, 3 LoRA slots. Each slot samples under its own adapter (log-probs against the PEFT model
of that adapter, the base where none is loaded), concurrent calls from several threads go out as one engine
call and each caller gets its own results, a request samples the same whether or not other slots' requests
share its batch (measured and bounded where vLLM-CPU is not batch-invariant), a reload or drop touches only its
slot, a bad adapter breaks only its slot, LoRA ids are never reused. Tests run in file order."""

from __future__ import annotations

import dataclasses
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from tests.integration.rollout.adapters import hf_logprobs, make_adapter, max_lp_err
from tests.tolerance import LOGPROB_GAP
from workers.rollout.isolation import positions
from workers.rollout.sampling import SamplingRequest
from workers.sync.policy import PolicyUpdate

pytestmark = pytest.mark.integration

SLOTS = 3
T = 0.7
TOL = LOGPROB_GAP  # vLLM's kernels against torch's forward: tests/tolerance.py
PROMPTS = ["what is 1 + 2 ?", "what is 3 * 4 ?", "let me think", "the answer is", "so the sum", "first we add"]
REQUEST = SamplingRequest(n=2, temperature=T, max_tokens=16, seed=7)
# what each slot asks for in the shared batch: different prompt counts, n, lengths and seeds, so the batch's
# shape changes while it decodes
MIXED = [(6, SamplingRequest(n=4, temperature=T, max_tokens=16, seed=7)), (5, SamplingRequest(n=2, temperature=T, max_tokens=24, seed=3)),
         (3, SamplingRequest(n=3, temperature=T, max_tokens=8, seed=7))]
SYNC_S: list[float] = []  # load_policy seconds per adapter (driver's wall, bytes through Ray included)


@pytest.fixture(scope="module")
def prompt_ids(tiny_model_dir) -> list[list[int]]:
    from workers.models.loading import load_tokenizer

    tok = load_tokenizer(tiny_model_dir)
    return [[tok.bos_token_id] + tok.encode(p, add_special_tokens=False) for p in PROMPTS]


@pytest.fixture(scope="module")
def pool(ray_local, tiny_model_dir):
    import ray

    from orchestrator.trial.actors.start import shutdown_actors
    from workers.rollout.shared import shared_rollout_actor
    from workers.rollout.worker import RolloutWorkerSettings

    actor = shared_rollout_actor(SLOTS, num_cpus=1).remote(tiny_model_dir, SLOTS,
                                                           RolloutWorkerSettings(seed=0, start_policy=True))
    assert ray.get(actor.ready.remote(), timeout=600)
    yield actor
    shutdown_actors([actor])
    if SYNC_S:
        print(f"\nload_policy seconds per adapter: {[round(s, 4) for s in SYNC_S]}")


@pytest.fixture(scope="module")
def adapters(tiny_model_dir, tmp_path_factory) -> dict:
    """seed -> (PEFT model, adapter files)."""
    root = tmp_path_factory.mktemp("adapters")
    return {k: make_adapter(tiny_model_dir, root / f"a{k}", seed=k) for k in (1, 2, 3)}


@pytest.fixture(scope="module")
def base_model(tiny_model_dir):
    from workers.models.loading import load_model

    return load_model(tiny_model_dir, dtype=torch.float32).eval()


def _load(pool, slot: int, files: dict, version: int) -> int:
    import ray

    t0 = time.perf_counter()
    out = ray.get(pool.load_policy.remote(slot, PolicyUpdate("adapter", version, files)), timeout=300)
    SYNC_S.append(time.perf_counter() - t0)
    return out


def _gen(pool, slot: int, prompt_ids, request=REQUEST):
    import ray

    return ray.get(pool.generate.remote(slot, prompt_ids, request), timeout=300)


def _batched(pool, calls: list[tuple[int, list, SamplingRequest]]) -> tuple[list, int]:
    """`calls` ((slot, prompts, request) each) from as many driver threads at once, held until all wait on the engine:
    (their Generations in call order, how many admissions into the engine served them)."""
    import ray

    before = ray.get(pool.stats.remote())["admissions"]
    ray.get(pool.hold.remote(), timeout=60)
    with ThreadPoolExecutor(len(calls)) as ex:
        futs = [ex.submit(_gen, pool, *call) for call in calls]
        deadline = time.monotonic() + 120
        while ray.get(pool.waiting.remote()) < len(calls):
            assert time.monotonic() < deadline, "the calls never reached the engine's queue"
            time.sleep(0.05)
        # every slot's call waits in the actor, and health still answers (max_concurrency = slots + 2)
        assert ray.get(pool.health.remote(), timeout=60)["ok"]
        ray.get(pool.release.remote())
        outs = [f.result() for f in futs]
    return outs, ray.get(pool.stats.remote())["admissions"] - before


def _tokens(gen) -> list[list[int]]:
    return [c.token_ids for g in gen.completions for c in g]


def _compare(solo, mixed) -> tuple[float, float]:
    """(fraction of completions whose tokens are identical, max |delta log-prob| over identical completions)."""
    same, delta, total = 0, 0.0, 0
    for a, b in zip((c for g in solo.completions for c in g), (c for g in mixed.completions for c in g), strict=True):
        total += 1
        if a.token_ids == b.token_ids:
            same += 1
            delta = max(delta, max((abs(x - y) for x, y in zip(a.logprobs, b.logprobs, strict=True)), default=0.0))
    return same / total, delta


def test_each_slot_samples_under_its_own_adapter(pool, adapters, base_model, prompt_ids):
    import ray

    (pm1, files1), (pm2, files2) = adapters[1], adapters[2]
    assert _load(pool, 0, files1, version=1) == 1
    assert _load(pool, 1, files2, version=5) == 5
    r0, r1, r2 = (_gen(pool, s, prompt_ids) for s in range(SLOTS))
    assert (r0.adapter_version, r1.adapter_version, r2.adapter_version) == (1, 5, None)
    assert max_lp_err(pm1, prompt_ids, r0, T) < TOL
    assert max_lp_err(pm2, prompt_ids, r1, T) < TOL
    assert max_lp_err(base_model, prompt_ids, r2, T) < TOL  # slot 2 holds no adapter: the base model
    assert max_lp_err(pm2, prompt_ids, r0, T) > 1e-2 and max_lp_err(pm1, prompt_ids, r1, T) > 1e-2
    assert _tokens(r0) != _tokens(r1)  # same seeds, different adapters
    state = ray.get(pool.lora_state.remote())
    ids = [s["lora_id"] for s in state["slots"]]
    # the two slots' adapters and the starting policy's zero adapter (made from the first load: start_policy)
    assert ids[2] is None and ids[0] != ids[1] and set(ids[:2]) < set(state["lora_ids"]) and len(state["lora_ids"]) == 3
    assert [len(s["dirs"]) for s in state["slots"]] == [1, 1, 0]


def test_concurrent_callers_share_one_batch_and_get_their_own_results(pool, adapters, base_model, prompt_ids):
    """Three threads (slots 0, 1, 2; different prompt counts, n, lengths, seeds) held until all three wait: one
    admission serves them (one batch), each gets its prompts' completions under its own adapter (checked against
    transformers, which no batch composition can fool). Batch invariance: each slot's completions in the shared
    batch equal those it gets alone BIT FOR BIT on vLLM-CPU (measured: all tokens identical, max |delta
    log-prob| 0.0; the numbers are printed)."""
    models = (adapters[1][0], adapters[2][0], base_model)
    calls = [(s, prompt_ids[:k], req) for s, (k, req) in enumerate(MIXED)]
    solo = [_gen(pool, *call) for call in calls]
    mixed, admissions = _batched(pool, calls)
    assert admissions == 1
    for (s, prompts, req), model, gen in zip(calls, models, mixed, strict=True):
        assert len(gen.completions) == len(prompts) and all(len(g) == req.n for g in gen.completions)
        assert gen.adapter_version == (1, 5, None)[s]
        assert max_lp_err(model, prompts[:2], dataclasses.replace(gen, completions=gen.completions[:2]), T) < TOL
    numbers = [_compare(a, b) for a, b in zip(solo, mixed, strict=True)]
    print(f"\nbatch invariance per slot (fraction of identical completions, max |delta log-prob|): {numbers}")
    assert all(a.completions == b.completions for a, b in zip(solo, mixed, strict=True)), numbers


def test_base_model_requests_batched_with_adapters_sample_the_base(pool, adapters, base_model, prompt_ids):
    """`SamplingRequest.base` (the starting policy of rollout.difficulty_samples) from slots 0 and 2 in one batch with
    slot 1's adapter request: the base requests get the base model (against transformers) and exactly what they
    get alone, slot 1 its adapter; the slots' adapters are untouched. (A request under no adapter batched with
    adapters' was once sampled with another adapter's weights at 4 slots: the base goes under a zero adapter.)"""
    base = dataclasses.replace(REQUEST, base=True)
    calls = [(0, prompt_ids[:4], base), (1, prompt_ids[:4], REQUEST), (2, prompt_ids[:3], base)]
    solo = [_gen(pool, *call) for call in calls]
    mixed, admissions = _batched(pool, calls)
    assert admissions == 1
    assert [g.adapter_version for g in mixed] == [None, 5, None]
    for (_, prompts, _), model, gen in zip(calls, (base_model, adapters[2][0], base_model), mixed, strict=True):
        assert max_lp_err(model, prompts, gen, T) < TOL
    assert all(a.completions == b.completions for a, b in zip(solo, mixed, strict=True))
    assert _gen(pool, 0, prompt_ids).adapter_version == 1 and max_lp_err(adapters[1][0], prompt_ids,
                                                                         _gen(pool, 0, prompt_ids), T) < TOL


def test_the_isolation_probe_waits_for_the_engine_and_finds_a_cpu_slot_independent_of_its_batch(
        pool, adapters, prompt_ids):
    """The isolation probe of slot 0 (workers/rollout/isolation.py: teacher-forced log-probs alone vs in one batch
    with slot 1's adapter and the starting policy's) queued behind slot 1's generate while the engine is held: it
    waits for the generate's requests to finish (slot 1 gets exactly what it gets alone: the probe stepped none of
    them), scores under slot 0's adapter (its mean log-prob against the PEFT model) and finds every log-prob the
    same bits alone and mixed on vLLM-CPU."""
    import ray

    first = _gen(pool, 0, prompt_ids)
    seqs = [p + g[0].token_ids for p, g in zip(prompt_ids, first.completions, strict=True)]
    solo = _gen(pool, 1, prompt_ids)
    ray.get(pool.hold.remote(), timeout=60)
    with ThreadPoolExecutor(2) as ex:
        gen = ex.submit(_gen, pool, 1, prompt_ids)
        while ray.get(pool.waiting.remote()) < 1:
            time.sleep(0.02)
        probe = ex.submit(lambda: ray.get(pool.isolation.remote(0, seqs), timeout=300).record())
        while ray.get(pool.waiting.remote()) < 2:
            time.sleep(0.02)
        ray.get(pool.release.remote())
        got, probe = gen.result(), probe.result()
    assert got.completions == solo.completions
    at = [positions(len(s)) for s in seqs]
    tokens = sum(map(len, at))
    assert probe["identical"] and probe["max_abs_diff"] == 0.0, probe
    assert not probe["gpu"] and not probe["batch_invariant"], probe  # what the engine process says of itself
    assert (probe["tokens"], probe["batch"]) == (tokens, tokens * 3), probe  # + slot 1's and the zero adapter
    ref = [hf_logprobs(adapters[1][0], s[:1], s[1:], 1.0)[[t - 1 for t in ts]] for s, ts in zip(seqs, at, strict=True)]
    assert abs(probe["mean_logprob"] - float(sum(r.sum() for r in ref)) / tokens) < TOL, probe


def test_reload_and_drop_touch_only_their_slot(pool, adapters, base_model, prompt_ids):
    import ray

    pm1, pm2 = adapters[1][0], adapters[2][0]
    pm3, files3 = adapters[3]
    before = ray.get(pool.lora_state.remote())
    old0, id1 = before["slots"][0]["lora_id"], before["slots"][1]["lora_id"]
    slot1 = _gen(pool, 1, prompt_ids)

    assert _load(pool, 0, files3, version=2) == 2  # slot 0: a new adapter, a fresh id, the old one evicted
    after = ray.get(pool.lora_state.remote())
    new0 = after["slots"][0]["lora_id"]
    assert new0 > max(old0, id1) and old0 not in after["lora_ids"]
    assert after["slots"][1]["lora_id"] == id1 and id1 in after["lora_ids"]  # slot 1's adapter was not re-read
    assert after["slots"][0]["dirs"] == [f"v2_id{new0}"]
    r0 = _gen(pool, 0, prompt_ids)
    assert r0.adapter_version == 2
    assert max_lp_err(pm3, prompt_ids, r0, T) < TOL and max_lp_err(pm1, prompt_ids, r0, T) > 1e-2
    again = _gen(pool, 1, prompt_ids)
    assert again.adapter_version == 5 and max_lp_err(pm2, prompt_ids, again, T) < TOL
    assert _tokens(again) == _tokens(slot1)

    ray.get(pool.drop.remote(1))  # slot 1 back to the base model, its adapter and files gone
    state = ray.get(pool.lora_state.remote())
    start = set(before["lora_ids"]) - {old0, id1}  # the starting policy's zero adapter, left alone
    assert len(start) == 1 and set(state["lora_ids"]) == {new0, *start}
    assert state["slots"][1] == {"version": None, "lora_id": None, "dirs": []}
    r1 = _gen(pool, 1, prompt_ids)
    assert r1.adapter_version is None and max_lp_err(base_model, prompt_ids, r1, T) < TOL
    assert max_lp_err(pm3, prompt_ids, _gen(pool, 0, prompt_ids), T) < TOL  # slot 0 untouched


def test_a_bad_adapter_breaks_only_its_slot(pool, adapters, prompt_ids):
    import ray

    pm3, files3 = adapters[3]
    bad = dict(files3, **{"adapter_model.safetensors": b"\x00garbage, not safetensors" * 10})
    with pytest.raises(ray.exceptions.RayTaskError):
        ray.get(pool.load_policy.remote(2, PolicyUpdate("adapter", 9, bad)))
    assert ray.get(pool.broken.remote(2))
    with pytest.raises(ray.exceptions.RayTaskError, match="slot 2 unusable"):
        _gen(pool, 2, prompt_ids)
    assert max_lp_err(pm3, prompt_ids, _gen(pool, 0, prompt_ids), T) < TOL
    with pytest.raises(ValueError, match="slot must be"):
        ray.get(pool.generate.remote(SLOTS, prompt_ids, REQUEST))
    ray.get(pool.drop.remote(2))  # a freed slot is usable again: the base model
    assert ray.get(pool.broken.remote(2)) is None and _gen(pool, 2, prompt_ids).adapter_version is None
    assert ray.get(pool.health.remote())["ok"]
