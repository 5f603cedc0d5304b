"""Learner speed settings change memory and passes, never the update (tiny model, fp32 CPU, no Ray, no vLLM).

- `old_logprobs: rollout` (no scoring pass) gives the update of `recompute` when the rollout log-probs equal the
  learner's, and still measures the log-prob gap (from the first update's forward);
- micro-batches by a token budget (greedy packing, columns cut) and gradient checkpointing give the update of one
  whole-batch pass;
- the LM head runs at the response positions only (no `[B, P + T, V]` logits);
- the truncated importance weight min(pi_old / pi_rollout, C): with C large and an unmoved policy the update is
  the sync one; weights and their truncation are what the log-prob shift says.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from tests.tolerance import LOGPROB_GAP, assert_close_to_scale, close_to_scale
from workers.credit import CreditConfig
from workers.learner.batch import collate
from workers.learner.config import LearnerConfig
from workers.learner.inputs import LearnerBatch, RunSettings
from workers.learner.learner import Learner
from workers.models.loading import load_tokenizer
from workers.objectives.interventions import InterventionsConfig

pytestmark = pytest.mark.integration

PROMPTS = ["what is 3 + 4 ?", "what is 12 * 3 - 5 ?"]  # different lengths
COMPLETIONS = ["7", "the answer is 7", "so 8", "let me check : 3 + 4 = 7 .",
               "31", "wait , 36 - 5 = 31 so 31", "3", "the key insight is 9"]
REWARDS = [[1.0, 1.0, 0.0, 0.0], [1.0, 0.0, 0.0, 1.0]]
T = 0.9
CREDIT = {"advantage_mode": "maxrl", "transform_mode": "gtpo_sepa", "sepa": {"steps": 10}}


def _learner(model_dir: str, **over) -> Learner:
    cfg = LearnerConfig().model_dump()
    cfg["optim"].update(lr=1e-2, grad_clip=1e9, **over.pop("optim", {}))
    cfg.update(over)
    return Learner(model_dir, learner=LearnerConfig.model_validate(cfg), credit=CreditConfig(**CREDIT),
                   run=RunSettings(seed=0, total_steps=10))


def _batch(model_dir: str, logprobs=None) -> LearnerBatch:
    tok = load_tokenizer(model_dir)
    p = [tok(x)["input_ids"] for x in PROMPTS]
    c = [tok(x)["input_ids"] + ([tok.eos_token_id] if i % 2 else []) for i, x in enumerate(COMPLETIONS)]
    return LearnerBatch(prompt_ids=[p[i // 4] for i in range(8)], response_ids=c,
                        rollout_logprobs=logprobs or [[-1.0] * len(x) for x in c], rewards=REWARDS, temperature=T,
                        sepa_lambda=0.4, step=0)


def _own_logprobs(learner: Learner, batch: LearnerBatch) -> list[list[float]]:
    """The learner's own log-probs of the batch (what vLLM returns to ~1e-6 in fp32)."""
    b = collate(batch, learner.tokenizer.pad_token_id)
    with torch.no_grad():
        lp, _ = learner._logprobs(b.seqs, b.attn, b.start, b.t, T, False)
    return [lp[i, : len(r)].tolist() for i, r in enumerate(batch.response_ids)]


def _lora(learner: Learner) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in learner.model.named_parameters() if p.requires_grad}


def _assert_same_update(a: Learner, b: Learner) -> None:
    """The last optimizer step's gradients agree up to summation order (tests/tolerance.py; Adam's first step is
    about lr * sign(g), so parameters would amplify float noise in near-zero gradient entries), and the
    parameters agree to a fraction of the step."""
    ga = {n: p.grad for n, p in a.model.named_parameters() if p.requires_grad}
    gb = {n: p.grad for n, p in b.model.named_parameters() if p.requires_grad}
    assert ga.keys() == gb.keys()
    for k in ga:
        assert_close_to_scale(gb[k], ga[k], what=f"grad {k}")
    pa, pb = _lora(a), _lora(b)
    lr = a.cfg.optim.lr
    assert max(float((pa[k] - pb[k]).abs().max()) for k in pa) < lr


def test_rollout_old_logprobs_equal_recompute(tiny_model_dir):
    rec = _learner(tiny_model_dir)
    one = _learner(tiny_model_dir, old_logprobs="rollout")
    before = _lora(rec)
    batch = _batch(tiny_model_dir, _own_logprobs(rec, _batch(tiny_model_dir)))
    m_rec = rec.train_step(batch).metrics
    m_one = one.train_step(batch).metrics
    assert max(float((p - before[k]).abs().max()) for k, p in _lora(rec).items()) > 1e-4  # it did move
    _assert_same_update(rec, one)
    for key in ("loss/policy", "train/grad_norm", "train/clip_frac", "credit/sepa_lambda"):
        assert close_to_scale(m_one[key], m_rec[key], abs(m_rec[key])), key
    # the gap is still measured (from the update's own forward), and it is ~0 here
    assert m_one["train/logprob_gap_max"] < LOGPROB_GAP and m_rec["train/logprob_gap_max"] < LOGPROB_GAP
    assert close_to_scale(m_one["policy/entropy_mean"], m_rec["policy/entropy_mean"], m_rec["policy/entropy_mean"])
    assert one.reference_passes == 0


def test_rollout_old_logprobs_measures_a_real_gap(tiny_model_dir):
    one = _learner(tiny_model_dir, old_logprobs="rollout")
    own = _own_logprobs(one, _batch(tiny_model_dir))
    shifted = [[x - 0.25 for x in row] for row in own]
    m = one.train_step(_batch(tiny_model_dir, shifted)).metrics
    assert m["train/logprob_gap_mean"] == pytest.approx(0.25, abs=1e-4)


def test_rollout_old_logprobs_refused_when_something_needs_the_scoring_pass(tiny_model_dir):
    cfg = LearnerConfig(old_logprobs="rollout")
    with pytest.raises(ValueError, match="KL"):
        Learner(tiny_model_dir, learner=cfg, credit=CreditConfig(), run=RunSettings(seed=0, total_steps=1),
                interventions=InterventionsConfig.model_validate({"kl": {"coef": 0.1}}))
    one = _learner(tiny_model_dir, old_logprobs="rollout")
    with pytest.raises(ValueError, match="needs pi_prox: old_logprobs .recompute."):
        one.train_step(dataclasses.replace(_batch(tiny_model_dir), tis_cap=2.0))


@pytest.mark.parametrize("over", [
    {"optim": {"max_tokens_per_micro_batch": 40}},
    {"optim": {"max_tokens_per_micro_batch": 1}},  # every sequence alone
    {"optim": {"micro_batch_size": 3}, "gradient_checkpointing": True},
])
def test_micro_batching_and_checkpointing_keep_the_update(tiny_model_dir, over):
    whole, other = _learner(tiny_model_dir), _learner(tiny_model_dir, **over)
    batch = _batch(tiny_model_dir, _own_logprobs(whole, _batch(tiny_model_dir)))
    m_w, m_o = whole.train_step(batch).metrics, other.train_step(batch).metrics
    _assert_same_update(whole, other)
    for key in ("loss/policy", "train/grad_norm", "policy/entropy_mean", "credit/sepa_lambda"):
        assert close_to_scale(m_o[key], m_w[key], abs(m_w[key])), key


def test_head_runs_on_the_response_window_only(tiny_model_dir):
    learner = _learner(tiny_model_dir)
    b = collate(_batch(tiny_model_dir), learner.tokenizer.pad_token_id)
    shapes = []
    head = learner.model.get_base_model().get_output_embeddings()
    handle = head.register_forward_hook(lambda m, i, o: shapes.append(tuple(o.shape)))
    try:
        learner.train_step(_batch(tiny_model_dir))
    finally:
        handle.remove()
    assert shapes and all(s[:2] == (b.size, b.t) for s in shapes), (shapes, b.seqs.shape)


def test_truncated_importance_sampling(tiny_model_dir):
    sync, off = _learner(tiny_model_dir), _learner(tiny_model_dir)
    own = _own_logprobs(sync, _batch(tiny_model_dir))
    sync.train_step(_batch(tiny_model_dir, own))
    m = off.train_step(dataclasses.replace(_batch(tiny_model_dir, own), tis_cap=1e9)).metrics
    _assert_same_update(sync, off)  # unmoved policy, C large: one_step_off's update is the sync one
    assert m["tis/weight_mean"] == pytest.approx(1.0, abs=1e-5) and m["tis/truncated_frac"] == 0.0

    # the rollout policy put 0.3 nats more on every sampled token: pi_old / pi_rollout = exp(-0.3) < 1 (kept);
    # 0.3 nats less: exp(0.3) > C = 1.2 (truncated to C)
    low = _learner(tiny_model_dir).train_step(
        dataclasses.replace(_batch(tiny_model_dir, [[x + 0.3 for x in r] for r in own]), tis_cap=1.2)).metrics
    assert low["tis/weight_mean"] == pytest.approx(math.exp(-0.3), rel=1e-4) and low["tis/truncated_frac"] == 0.0
    high = _learner(tiny_model_dir).train_step(
        dataclasses.replace(_batch(tiny_model_dir, [[x - 0.3 for x in r] for r in own]), tis_cap=1.2)).metrics
    assert high["tis/weight_mean"] == pytest.approx(1.2, rel=1e-5) and high["tis/truncated_frac"] == 1.0
    assert high["tis/ratio_max"] == pytest.approx(math.exp(0.3), rel=1e-4)
