"""The in-process `Learner` with interventions on a hand-made batch (tiny model, no Ray, no vLLM).

Every check is against an independent computation: our own padding and indexing, plain autograd on the
direct penalty, a whole-batch learner versus a micro-batched one.

Setup shared by the tests: the LoRA B matrices start at zero (PEFT's init), where the policy equals the
reference, the KL gradient of k3 is exactly zero and the A matrices get no gradient. So the adapter is first
perturbed by a fixed random amount (`_perturb`), after the rollout log-probs have been scored with the
unperturbed policy: the policy has "moved since sampling", so pi_old / pi_rollout differs from 1 (the PPO ratio is
to the recomputed pi_old and starts at 1; the truncated importance weight sees the move and some truncate).
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from tests.tolerance import assert_close_to_scale, close_to_scale
from workers.credit import CreditConfig
from workers.learner.config import LearnerConfig
from workers.learner.inputs import LearnerBatch, RunSettings
from workers.learner.learner import Learner
from workers.models.loading import load_tokenizer
from workers.objectives.interventions import InterventionsConfig
from workers.objectives.losses import entropy_from_logits

pytestmark = pytest.mark.integration

PROMPTS = ["what is 3 + 4 ?", "what is 12 * 3 - 5 ?"]  # different lengths: right padding of whole sequences
COMPLETIONS = [
    ["7 <eos>", "the answer is 7 <eos>", "so 8", "let me check : 3 + 4 = 7 ."],
    ["31 <eos>", "wait , 36 - 5 = 31 so 31", "3", "the key insight is 9 <eos>"],
]
MC_COMPLETIONS = [["B <eos>", "A so", "C", "D the answer"], ["A <eos>", "B", "C <eos>", "B so it is"]]
REWARDS = [[1.0, 1.0, 0.0, 0.0], [1.0, 0.0, 0.0, 1.0]]
TEMPERATURE = 0.9
_CLIP_GRAD_NORM = torch.nn.utils.clip_grad_norm_


def _learner(model_dir: str, interventions: dict, *, micro_batch_size: int = 64, grad_clip: float = 1.0,
             aggregation: str = "token-mean", optim: dict | None = None) -> Learner:
    cfg = LearnerConfig().model_dump()
    cfg["optim"].update(micro_batch_size=micro_batch_size, grad_clip=grad_clip, lr=1e-2, **(optim or {}))
    cfg["loss"]["aggregation"] = aggregation
    return Learner(model_dir, learner=LearnerConfig.model_validate(cfg), credit=CreditConfig(),
                   run=RunSettings(seed=0, total_steps=10),
                   interventions=InterventionsConfig.model_validate(interventions))


def _lora(learner: Learner) -> dict[str, torch.Tensor]:
    return {n: p for n, p in learner.model.named_parameters() if p.requires_grad}


def _encode(tok, prompts: list[str], completions: list[list[str]]) -> tuple[list[list[int]], list[list[int]]]:
    p_ids, c_ids = [], []
    for prompt, group in zip(prompts, completions, strict=True):
        for text in group:
            p_ids.append(tok(prompt)["input_ids"])
            words = text.split()
            eos = [tok.eos_token_id] if words[-1] == "<eos>" else []
            c_ids.append(tok(" ".join(w for w in words if w != "<eos>"))["input_ids"] + eos)
    assert tok.unk_token_id not in {i for row in p_ids + c_ids for i in row}
    return p_ids, c_ids


def _inputs(tok, p_ids, c_ids):
    """Right-padded prompt+completion, attention mask, completion starts, completion mask (own padding code)."""
    width = max(len(p) + len(c) for p, c in zip(p_ids, c_ids, strict=True))
    seqs = torch.full((len(p_ids), width), tok.pad_token_id, dtype=torch.long)
    attn = torch.zeros_like(seqs)
    t_comp = max(len(c) for c in c_ids)
    mask = torch.zeros(len(p_ids), t_comp, dtype=torch.bool)
    for b, (p, c) in enumerate(zip(p_ids, c_ids, strict=True)):
        seqs[b, : len(p) + len(c)] = torch.tensor(p + c)
        attn[b, : len(p) + len(c)] = 1
        mask[b, : len(c)] = True
    return seqs, attn, torch.tensor([len(p) for p in p_ids]), mask


def _completion_logits(learner: Learner, seqs, attn, starts, t_comp: int) -> torch.Tensor:
    """`[B, t_comp, V]` logits predicting each completion token, with gradient (independent indexing)."""
    logits = learner.model(input_ids=seqs, attention_mask=attn).logits
    rows = []
    for b in range(seqs.shape[0]):
        pos = [min(int(starts[b]) - 1 + t, seqs.shape[1] - 2) for t in range(t_comp)]
        rows.append(logits[b, pos])
    return torch.stack(rows)


def _perturb(learner: Learner) -> None:
    g = torch.Generator().manual_seed(1234)
    with torch.no_grad():
        for _, p in sorted(_lora(learner).items()):
            p.add_(0.05 * torch.randn(p.shape, generator=g))


def _batch(learner: Learner, completions=COMPLETIONS, rewards=REWARDS, *, floor=None, temperature=TEMPERATURE,
           action_ids=None) -> LearnerBatch:
    """The trial loop's batch, rollout log-probs scored by the (unperturbed) learner itself; then perturbs."""
    p_ids, c_ids = _encode(learner.tokenizer, PROMPTS, completions)
    seqs, attn, starts, mask = _inputs(learner.tokenizer, p_ids, c_ids)
    with torch.no_grad():
        lp, _ = learner._logprobs(seqs, attn, starts, mask.shape[1], temperature, False, floor)
    rollout = [lp[b, : len(c)].tolist() for b, c in enumerate(c_ids)]
    _perturb(learner)
    return LearnerBatch(prompt_ids=p_ids, response_ids=c_ids, rollout_logprobs=rollout, rewards=rewards,
                        temperature=temperature, sepa_lambda=0.0, step=0, loss_scale=1.0,
                        action_token_ids=action_ids)


def _capture_grads(learner: Learner, monkeypatch) -> dict[str, torch.Tensor]:
    """Records the LoRA gradients the optimizer will see: wraps `clip_grad_norm_` (called once per step, right
    before `optimizer.step`) and copies the gradients after clipping."""
    grads: dict[str, torch.Tensor] = {}

    def clip(*args, **kwargs):
        norm = _CLIP_GRAD_NORM(*args, **kwargs)  # the original, so that a second capture replaces the first
        grads.update({n: p.grad.detach().clone() for n, p in _lora(learner).items()})
        return norm

    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", clip)
    return grads


def _assert_close_dicts(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], *, rtol: float, atol: float):
    assert a.keys() == b.keys() and a
    for n in a:
        torch.testing.assert_close(a[n], b[n], rtol=rtol, atol=atol, msg=lambda m, n=n: f"{n}: {m}")


def _assert_same_sums(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]):
    """Gradients of the same loss summed in another order (micro-batches, chunks): tests/tolerance.py."""
    assert a.keys() == b.keys() and a
    for n in a:
        assert_close_to_scale(a[n], b[n], what=n)


# -- a. KL: no reference pass unless the KL is used or measured ------------------------------------------------
@pytest.mark.parametrize(("kl", "passes", "keys", "absent"), [
    ({"coef": 0.0}, False, [], ["kl/ref", "kl/ref_k3", "loss/kl"]),
    ({"coef": 0.5}, True, ["kl/ref", "kl/ref_k3", "loss/kl"], []),
    ({"coef": 0.0, "measure": True}, True, ["kl/ref", "kl/ref_k3"], ["loss/kl"]),
])
def test_reference_pass_only_when_kl_used_or_measured(tiny_model_dir, kl, passes, keys, absent):
    learner = _learner(tiny_model_dir, {"kl": kl}, micro_batch_size=3)
    batch = _batch(learner)
    metrics = learner.train_step(batch).metrics
    if passes:
        assert learner.reference_passes == math.ceil(8 / 3)  # one per micro-batch of the scoring pass
    else:
        assert learner.reference_passes == 0
    for k in keys:
        assert k in metrics and math.isfinite(metrics[k]), k
    for k in absent:
        assert k not in metrics, k
    if "kl/ref" in metrics:  # the adapter was perturbed: the policy is not the reference any more
        assert metrics["kl/ref_k3"] > 0


# -- b. micro-batches reproduce the whole-batch gradient ---------------------------------------------------------
FULL_IV = {
    "entropy_bonus": {"coeff": 0.05},
    "kl": {"coef": 0.3, "estimator": "low_var_kl"},
    "entropy_floor": {"all": {"floor": 10.0, "coef": 0.5}},  # above log(V): always binds
}


@pytest.mark.parametrize(("aggregation", "micro"), [
    ("token-mean", 2), ("seq-mean-token-mean", 3),
    # verl's dynamic batch size: micro-batches by a token budget, and the log-prob / entropy pass in chunks of 5
    # positions (each recomputed in backward) instead of the whole micro-batch's logits
    ("token-mean", {"max_tokens_per_micro_batch": 40, "logits_chunk": 5}),
    ("seq-mean-token-mean", {"max_tokens_per_micro_batch": 1, "logits_chunk": 5}),
])
def test_micro_batches_match_whole_batch(tiny_model_dir, monkeypatch, aggregation, micro):
    """Gradients are compared, not only parameters: Adam's first update is lr * g / (|g| + eps) ~ lr * sign(g),
    blind to a wrong scale. Tolerances: gradients and metrics to summation order (float32 sums in another order,
    tests/tolerance.py); parameters after the step atol 1e-4 = 1% of lr, because for |g| ~ eps = 1e-8 Adam
    turns float noise of ~1e-11 in g into ~1e-3 lr (observed max 9e-6)."""
    whole = _learner(tiny_model_dir, FULL_IV, micro_batch_size=8, aggregation=aggregation)
    by = {"optim": micro} if isinstance(micro, dict) else {"micro_batch_size": micro}
    split = _learner(tiny_model_dir, FULL_IV, aggregation=aggregation, **by)
    _assert_close_dicts(_lora(whole), _lora(split), rtol=0, atol=0)  # same seed, same init
    batches = [dataclasses.replace(_batch(whole), tis_cap=1.05), dataclasses.replace(_batch(split), tis_cap=1.05)]
    if isinstance(micro, dict):  # chunked log-probs differ from the whole pass's in the last bits: one batch
        batches[1] = batches[0]
    assert batches[0] == batches[1]
    g_whole = _capture_grads(whole, monkeypatch)
    m_whole = whole.train_step(batches[0]).metrics
    g_split = _capture_grads(split, monkeypatch)
    m_split = split.train_step(batches[1]).metrics

    assert m_whole["entropy/all_floor_penalty"] > 0  # the floor binds
    assert m_whole["kl/ref"] != 0 and 0 < m_whole["tis/truncated_frac"] < 1  # KL and the IS weights are live
    assert max(float(g.abs().max()) for n, g in g_whole.items() if "lora_A" in n) > 0
    for k in ("loss/total", "loss/policy", "loss/kl", "loss/entropy_bonus", "train/grad_norm",
              "train/clip_frac", "entropy/all_floor_penalty", "kl/ref", "tis/weight_mean"):
        assert close_to_scale(m_split[k], m_whole[k], abs(m_whole[k])), (k, m_split[k], m_whole[k])
    _assert_same_sums(g_split, g_whole)
    _assert_close_dicts(_lora(split), _lora(whole), rtol=0, atol=1e-4)


# -- c. the entropy-floor surrogate has the gradient of the direct penalty -------------------------------------
@pytest.mark.parametrize("micro", [8, 3])
def test_entropy_floor_gradient_equals_direct_penalty(tiny_model_dir, monkeypatch, micro):
    floor, coef = 10.0, 0.7
    learner = _learner(tiny_model_dir, {"entropy_floor": {"all": {"floor": floor, "coef": coef}}},
                       micro_batch_size=micro, grad_clip=1e9)
    uniform = [[1.0] * 4, [0.0] * 4]  # zero advantages: the policy-gradient term contributes nothing
    batch = _batch(learner, rewards=uniform)

    seqs, attn, starts, mask = _inputs(learner.tokenizer, batch.prompt_ids, batch.response_ids)
    learner.model.train()
    learner.model.zero_grad(set_to_none=True)
    ent = entropy_from_logits(_completion_logits(learner, seqs, attn, starts, mask.shape[1]), TEMPERATURE)
    mean_h = ent[mask].mean()
    penalty = coef * torch.relu(floor - mean_h).square()
    penalty.backward()
    direct = {n: p.grad.detach().clone() for n, p in _lora(learner).items()}
    learner.model.zero_grad(set_to_none=True)

    grads = _capture_grads(learner, monkeypatch)
    metrics = learner.train_step(batch).metrics
    assert close_to_scale(metrics["entropy/all_mean"], float(mean_h.detach()), float(mean_h.detach()))
    assert close_to_scale(metrics["entropy/all_floor_penalty"], float(penalty.detach()), float(penalty.detach()))
    assert metrics["loss/policy"] == 0.0
    assert sum(float(g.norm()) for g in direct.values()) > 1e-3  # a real gradient to compare
    _assert_same_sums(grads, direct)


# -- d. probability floor at the action position in the learner ----------------------------------------------
def test_learner_probability_floor_holds(tiny_model_dir):
    min_prob, temp = 0.2, 0.25  # a low temperature sharpens the distribution so that the floor binds
    learner = _learner(tiny_model_dir, {"probability_floor": {"min_prob": min_prob}})
    tok = load_tokenizer(tiny_model_dir)
    actions = tok.convert_tokens_to_ids(["A", "B", "C", "D"])
    assert len(set(actions)) == 4 and tok.unk_token_id not in actions
    floor = (actions, min_prob)
    batch = _batch(learner, completions=MC_COMPLETIONS, floor=floor, temperature=temp, action_ids=actions)

    # independent: the unfloored probabilities of the actions, restricted to the action set, at the action position
    seqs, attn, starts, mask = _inputs(tok, batch.prompt_ids, batch.response_ids)
    with torch.no_grad():
        first = _completion_logits(learner, seqs, attn, starts, 1)[:, 0]
    plain = torch.softmax(first[:, actions] / temp, dim=-1)
    assert float(plain.min()) < min_prob  # the floor has something to do

    metrics = learner.train_step(batch).metrics
    assert metrics["floor/learner_min_valid_prob"] >= min_prob - 1e-6
    assert metrics["floor/learner_min_valid_prob"] == pytest.approx(min_prob, abs=1e-5)  # binding: exactly f
    # the sampled first tokens are valid actions and keep at least the floor's probability
    assert math.exp(metrics["floor/action_logprob_min"]) >= min_prob - 1e-6
