"""The PPO details that match verl (volcengine/verl core_algos.py / ray_trainer.py, re-derived here from their
formulas): dual clip and log-ratio clamp, vf_clip_frac at 1 and 4 mini-batches, the ratio's anchor, critic
warmup, eval-mode scoring, and the settings that refuse what the learner cannot reproduce."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.config.trial import TrialConfig
from workers.credit import CreditConfig
from workers.learner.batch import collate
from workers.learner.config import LearnerConfig
from workers.learner.critic import clipped_value_loss
from workers.learner.inputs import LearnerBatch, RunSettings
from workers.learner.learner import Learner
from workers.learner.metrics import critic_metrics
from workers.models.loading import build_tiny_model
from workers.objectives.losses import ppo_token_loss


def verl_policy_loss(logp, old, adv, clip=0.2, clip_c=3.0):
    """verl's compute_policy_loss_vanilla per token, written from its formulas."""
    ratio = torch.exp(torch.clamp(logp - old, -20.0, 20.0))
    l1, l2 = -adv * ratio, -adv * torch.clamp(ratio, 1 - clip, 1 + clip)
    clip1 = torch.maximum(l1, l2)
    clip2 = torch.minimum(-adv * clip_c, clip1)
    return torch.where(adv < 0, clip2, clip1), l2 > l1


floats = st.floats(-30.0, 30.0, allow_nan=False, width=32)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(floats, floats, st.floats(-5.0, 5.0, allow_nan=False, width=32)), min_size=1, max_size=16))
def test_default_policy_loss_is_verls(rows):
    logp, old, adv = (torch.tensor(c, dtype=torch.float64) for c in zip(*rows, strict=True))
    ours, ours_clipped = ppo_token_loss(logp, old, adv)  # defaults: dual clip 3, clamp +-20
    ref, ref_clipped = verl_policy_loss(logp, old, adv)
    assert torch.allclose(ours, ref, rtol=1e-12, atol=1e-12) and torch.equal(ours_clipped, ref_clipped)


def test_dual_clip_and_clamp_closed_forms():
    adv = torch.tensor([-1.0, -1.0, 2.0])
    loss, _ = ppo_token_loss(torch.tensor([100.0, 0.5, 100.0]), torch.zeros(3), adv)
    # A < 0, huge ratio: capped at -A * 3; A < 0, ratio e^0.5: -A * e^0.5 < 3; A > 0: -A * 1.2
    assert loss.tolist() == pytest.approx([3.0, float(torch.exp(torch.tensor(0.5))), -2.4])
    assert LearnerConfig().loss.dual_clip == 3.0


@pytest.mark.parametrize("n_mini", [1, 4])
def test_vf_clip_frac_is_verls_mean_over_mini_batches(n_mini):
    """verl: vf_clipfrac = masked mean of (clipped loss > unclipped) per update, averaged over updates. Equal
    mini-batches: the same as clipped tokens over tokens x epochs."""
    gen = torch.Generator().manual_seed(n_mini)
    b, t, epochs = 8, 5, 2
    mask = torch.rand(b, t, generator=gen) > 0.2
    mask[:, 0] = True
    mask[:, 1:] = mask[0, 1:]  # every row the same token count, so verl's unweighted mean is well defined
    old, returns = torch.randn(b, t, generator=gen), torch.randn(b, t, generator=gen)
    verl_fracs, clipped, steps = [], 0.0, 0
    for _ in range(epochs):
        for rows in torch.randperm(b, generator=gen).split(b // n_mini):
            v = old[rows] + torch.randn(len(rows), t, generator=gen)  # the critic moved since the scoring pass
            _, was = clipped_value_loss(v, old[rows], returns[rows], 0.5)
            m = mask[rows]
            verl_fracs.append(float((was & m).sum()) / float(m.sum()))
            clipped += float((was & m).sum())
            steps += 1
    sums = {"value_loss": 0.0, "value_clipped": clipped, "critic_grad_norm": 0.0, "critic_steps": steps}
    frac = critic_metrics(old, returns, mask, sums, ppo_epochs=epochs)["critic/vf_clip_frac"]
    assert frac == pytest.approx(sum(verl_fracs) / len(verl_fracs), rel=1e-12) and 0.2 < frac < 1.0


def test_skip_uninformative_defaults_off_under_gae():
    assert TrialConfig().rollout.skip_uninformative is True
    assert TrialConfig(credit={"advantage_mode": "gae"}).rollout.skip_uninformative is False
    assert TrialConfig(credit={"advantage_mode": "gae"}, rollout={"skip_uninformative": True}
                       ).rollout.skip_uninformative is True


def test_top_p_below_one_needs_the_rollout_anchor():
    with pytest.raises(ValueError, match="rollout.top_p 0.9 needs learner.old_logprobs 'rollout'"):
        TrialConfig(rollout={"top_p": 0.9})
    assert TrialConfig(rollout={"top_p": 0.9}, learner={"old_logprobs": "rollout"}).rollout.top_p == 0.9
    with pytest.raises(ValueError, match="rollout.tis_cap"):
        TrialConfig(rollout={"tis_cap": 2.0}, learner={"old_logprobs": "rollout"})


# --- the learner (tiny Llama, in process) --------------------------------------------------------------------
@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return str(build_tiny_model(tmp_path_factory.mktemp("tiny"), seed=0))


def _learner(model_dir, gae=False, dropout=0.0, **learner):
    cfg = LearnerConfig(**learner).model_dump()
    cfg["lora"]["dropout"] = dropout
    cfg["critic"]["lr"] = 1e-3
    credit = CreditConfig(advantage_mode="gae") if gae else CreditConfig()
    return Learner(model_dir, learner=LearnerConfig.model_validate(cfg), credit=credit,
                   run=RunSettings(seed=0, total_steps=10))


def _batch(lps=None):
    prompts = [[14, 15, 16], [17, 18], [14, 16], [19, 20, 21]]
    responses = [[5, 6, 7, 8], [9, 10, 3], [11, 12], [6, 7, 8, 9, 3]]
    lps = lps or [[-2.0] * len(r) for r in responses]
    return LearnerBatch(prompt_ids=prompts, response_ids=responses, rollout_logprobs=lps,
                        rewards=[[1.0, 0.0], [0.0, 1.0]], temperature=1.0, step=0)


def _eval_logprobs(learner, batch):
    b = collate(batch, learner.tokenizer.pad_token_id)
    learner.model.eval()
    with torch.no_grad():
        lp, _ = learner._logprobs(b.seqs, b.attn, b.start, b.t, 1.0, False)
    learner.model.train()
    return [row[:len(r)].tolist() for row, r in zip(lp, batch.response_ids, strict=True)]


def test_recompute_anchors_the_ratio_to_the_recomputed_old_policy(model_dir):
    """vLLM's log-probs 0.5 nats off the learner's: the ratio to pi_old (recomputed) starts at 1, so nothing is
    clipped at one mini-batch and one epoch; a ratio to the rollout's log-probs would clip every token."""
    learner = _learner(model_dir)
    own = _eval_logprobs(learner, _batch())
    m = learner.train_step(_batch([[x - 0.5 for x in r] for r in own])).metrics
    assert m["train/logprob_gap_mean"] == pytest.approx(0.5, abs=1e-5)
    assert m["train/clip_frac"] == 0.0


def test_scoring_pass_runs_without_lora_dropout(model_dir):
    learner = _learner(model_dir, dropout=0.5)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in learner.model.named_parameters():
            if "lora_B" in name:  # a trained adapter, so dropout on its input changes the output
                p.copy_(torch.randn(p.shape, generator=gen) * 0.5)
    batch = _batch(_eval_logprobs(learner, _batch()))
    assert learner.train_step(batch).metrics["train/logprob_gap_max"] < 1e-5


def test_critic_warmup_counts_as_verl(model_dir):
    """verl updates the actor when critic_warmup <= global_steps (from 1): warmup 2 = one critic-only step."""
    learner = _learner(model_dir, gae=True, critic={"warmup_steps": 2})
    steps = [learner.train_step(dataclasses.replace(_batch(), step=s)).metrics for s in range(2)]
    assert [m["train/optimizer_steps"] for m in steps] == [0, 1]
    assert all(m["critic/optimizer_steps"] == 1 for m in steps)
    assert not any(k.startswith("credit/groups_skipped") for k in steps[0])  # GAE skips no group
