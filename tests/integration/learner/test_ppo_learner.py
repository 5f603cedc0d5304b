"""PPO + GAE in the in-process learner (tiny model, no Ray, no vLLM): the critic learns, policy + critic state
round-trips, mini-batches and epochs take the counted optimizer steps, and multi-turn batches with observation
gaps train through GAE."""

from __future__ import annotations

import math

import pytest
import torch

from tests.integration.learner.test_learner_interventions import COMPLETIONS, PROMPTS, REWARDS, _encode
from tests.tolerance import assert_close_to_scale
from workers.credit import CreditConfig
from workers.learner.config import LearnerConfig
from workers.learner.inputs import LearnerBatch, RunSettings
from workers.learner.learner import Learner

pytestmark = pytest.mark.integration


def _learner(model_dir, *, mini=None, epochs=1, critic_lr=1e-3, warmup=0, lr=1e-2, mode="lora",
             **credit) -> Learner:
    cfg = LearnerConfig(mode=mode).model_dump()
    cfg["optim"].update(lr=lr, mini_batch_size=mini, ppo_epochs=epochs, micro_batch_size=3)
    cfg["critic"].update(lr=critic_lr, warmup_steps=warmup, model="lora")
    return Learner(model_dir, learner=LearnerConfig.model_validate(cfg),
                   credit=CreditConfig(advantage_mode="gae", **credit), run=RunSettings(seed=0, total_steps=20))


def _batch(learner: Learner, step: int = 0) -> LearnerBatch:
    p_ids, c_ids = _encode(learner.tokenizer, PROMPTS, COMPLETIONS)
    return LearnerBatch(prompt_ids=p_ids, response_ids=c_ids, rollout_logprobs=[[-1.0] * len(c) for c in c_ids],
                        rewards=REWARDS, temperature=1.0, step=step)


def test_critic_value_loss_falls_on_a_fixed_batch(tiny_model_dir):
    learner = _learner(tiny_model_dir, lr=1e-9)
    losses = [learner.train_step(_batch(learner, s)).metrics["loss/value"] for s in range(12)]
    assert losses[-1] < 0.5 * losses[0], losses
    m = learner.train_step(_batch(learner, 12)).metrics
    assert m["critic/explained_variance"] > 0.5 and math.isfinite(m["critic/grad_norm"])


def test_policy_and_critic_state_round_trip(tiny_model_dir):
    a = _learner(tiny_model_dir)
    for s in range(2):
        a.train_step(_batch(a, s))
    blob = a.state_dict()
    b = _learner(tiny_model_dir)
    b.load_state_dict(blob)
    ma, mb = a.train_step(_batch(a, 2)).metrics, b.train_step(_batch(b, 2)).metrics
    assert ma == mb
    with torch.no_grad(), a.critic.active(), b.critic.active():
        x = torch.tensor([[5, 6, 7, 8]])
        one = torch.ones_like(x)
        assert torch.equal(a.critic.values(x, one, torch.tensor([1]), 3), b.critic.values(x, one, torch.tensor([1]), 3))
    files = a.export_adapter(1)
    assert "adapter_model.safetensors" in files and not any("critic" in f for f in files)


@pytest.mark.parametrize("mini, epochs", [(None, 1), (3, 1), (3, 2), (8, 3), (5, 1)])
def test_optimizer_steps_per_training_step(tiny_model_dir, mini, epochs):
    learner = _learner(tiny_model_dir, mini=mini, epochs=epochs)
    size = sum(len(g) for g in REWARDS)
    calls = {"policy": 0}
    real = learner.optimizer.step

    def counted(*a, **k):
        calls["policy"] += 1
        return real(*a, **k)

    learner.optimizer.step = counted
    m = learner.train_step(_batch(learner)).metrics
    want = math.ceil(size / (mini or size)) * epochs
    assert calls["policy"] == want == m["train/optimizer_steps"] == m["critic/optimizer_steps"]


def test_critic_warmup_freezes_the_policy(tiny_model_dir):
    learner = _learner(tiny_model_dir, warmup=3)  # verl's critic_warmup 3: two critic-only steps
    before = {n: p.detach().clone() for n, p in learner.model.named_parameters() if "default" in n}
    for s in range(2):
        m = learner.train_step(_batch(learner, s)).metrics
        assert m["train/optimizer_steps"] == 0 and m["critic/optimizer_steps"] == 1
    assert all(torch.equal(p, before[n]) for n, p in learner.model.named_parameters() if "default" in n)
    assert learner.train_step(_batch(learner, 2)).metrics["train/optimizer_steps"] == 1


def test_multi_turn_gae_batch_trains_only_sampled_tokens(tiny_model_dir):
    """Observation ids between turns get no advantage and no loss; turn_end rewards land on turn ends."""
    learner = _learner(tiny_model_dir, gae={"reward_placement": "turn_end", "whiten": False})
    tok = learner.tokenizer
    obs = tok("so then check", add_special_tokens=False)["input_ids"]
    turn = tok("the answer is 7", add_special_tokens=False)["input_ids"]
    prompt = tok("what is 3 + 4 ?")["input_ids"]
    resp = turn + obs + turn
    mask = [True] * len(turn) + [False] * len(obs) + [True] * len(turn)
    ends = [len(turn) - 1, len(resp) - 1]
    batch = LearnerBatch(prompt_ids=[prompt] * 2, response_ids=[resp] * 2, loss_mask=[mask] * 2,
                         rollout_logprobs=[[-1.0] * len(resp)] * 2, rewards=[[0.9, -0.1]],
                         turn_rewards=[[1.0, -0.1], [-0.1, 0.0]], reward_positions=[ends, ends], temperature=1.0)
    from workers.learner.batch import collate

    b = collate(batch, tok.pad_token_id)
    scored = learner._score(b, 1.0, None)
    adv, returns = learner._gae(batch, b, scored.values)
    assert (adv[~b.mask] == 0).all() and (returns[~b.mask] == 0).all()
    # gamma = lam = 1: the first turn's tokens see both turns' rewards, the second turn's only its own
    first, second = slice(0, len(turn)), slice(len(turn) + len(obs), len(resp))
    v = scored.values
    assert torch.allclose(adv[0, first] + v[0, first], torch.full((len(turn),), 0.9), atol=1e-5)
    assert torch.allclose(adv[0, second] + v[0, second], torch.full((len(turn),), -0.1), atol=1e-5)
    m = learner.train_step(batch).metrics
    assert math.isfinite(m["loss/value"]) and m["train/tokens"] == 2 * 2 * len(turn)


def test_a_lora_critic_on_a_full_policy(tiny_model_dir):
    """learner.mode full with critic.model lora: the critic's adapter rides on the weights the policy trains.
    A critic-only step moves the critic (adapter and head) and no policy weight, and leaves no gradient on the
    policy's weights (they are frozen while the critic learns); the policy's log-probs never pass through the
    critic's adapter (they equal a plain transformers model's holding the same weights); a full step trains the
    policy, and what vLLM gets is the transformers model's state dict, without the critic's adapter."""
    from workers.learner.batch import collate
    from workers.models.loading import load_model

    learner = _learner(tiny_model_dir, mode="full", lr=1e-3, warmup=2)  # step 0 trains the critic only
    critic, model = learner.critic, learner.model
    policy = {n: p.detach().clone() for n, p in model.named_parameters() if not critic.owns(n)}
    adapter = {n: p.detach().clone() for n, p in model.named_parameters() if critic.owns(n)}
    assert policy and adapter and all(p.requires_grad for p in model.parameters())
    m = learner.train_step(_batch(learner, 0)).metrics
    assert m["train/optimizer_steps"] == 0 and m["critic/optimizer_steps"] == 1
    named = dict(model.named_parameters())
    assert all(torch.equal(named[n], w) for n, w in policy.items())
    assert all(named[n].grad is None for n in policy), "the value loss reached the policy's weights"
    assert any(not torch.equal(named[n], w) for n, w in adapter.items() if "lora_B" in n)  # now non-zero

    def plain_logprobs(state: dict) -> torch.Tensor:
        """The response log-probs under a transformers model (no PEFT) holding `state`."""
        hf = load_model(tiny_model_dir)
        hf.load_state_dict(state)
        b = collate(_batch(learner), learner.tokenizer.pad_token_id)
        learner_model, learner.model = learner.model, hf
        try:
            with torch.no_grad():
                return learner._logprobs(b.seqs, b.attn, b.start, b.t, 1.0, False)[0]
        finally:
            learner.model = learner_model

    b = collate(_batch(learner), learner.tokenizer.pad_token_id)
    with torch.no_grad():
        lp = learner._logprobs(b.seqs, b.attn, b.start, b.t, 1.0, False)[0]
    exported = learner.export_policy(1)
    from safetensors.torch import load

    sent = {k: v for name, data in exported.files.items() if name.endswith(".safetensors")
            for k, v in load(data).items()}
    assert sorted(sent) == sorted(load_model(tiny_model_dir).state_dict())  # vLLM's names; no adapter
    assert_close_to_scale(lp, plain_logprobs(sent), what="log-probs of the exported weights")  # another module

    with critic.active(), torch.no_grad():  # the critic's own view: the adapter is on there
        v = critic.values(b.seqs, b.attn, b.start, b.t)
    m = learner.train_step(_batch(learner, 1)).metrics
    assert m["train/optimizer_steps"] == 1 and m["critic/optimizer_steps"] == 1
    named = dict(model.named_parameters())
    assert any(not torch.equal(named[n], w) for n, w in policy.items())  # the full policy trained
    with critic.active(), torch.no_grad():
        assert not torch.allclose(critic.values(b.seqs, b.attn, b.start, b.t), v)


def test_a_full_policy_with_a_lora_critic_resumes_exactly(tiny_model_dir):
    """The checkpoint (DCP shards: the policy part without the critic's adapter, the critic part only its adapter
    and head) restores into a fresh learner whose next step equals the uninterrupted one."""
    a = _learner(tiny_model_dir, mode="full", lr=1e-3)
    for s in range(2):
        a.train_step(_batch(a, s))
    files = a.checkpoint_files()
    keys = set(__import__("workers.checkpoint.shard_files", fromlist=["read_metadata"]).read_metadata(
        {k.split("/", 1)[1]: v for k, v in files.items() if "/" in k}, "ckpt").state_dict_metadata)
    critic_model = {k for k in keys if k.startswith("critic.model.")}
    assert critic_model and all(".critic." in k or k.startswith("critic.model.head.") for k in critic_model)
    assert not any(".critic." in k for k in keys if k.startswith("policy."))  # the base is saved once
    b = _learner(tiny_model_dir, mode="full", lr=1e-3)
    b.restore(files)
    ma, mb = a.train_step(_batch(a, 2)).metrics, b.train_step(_batch(b, 2)).metrics
    assert ma == mb
