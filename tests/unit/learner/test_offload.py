"""learner.offload_between_steps on a CPU learner (workers/learner/offload.py): the same code path as on a GPU, with
every copy a no-op, so training with it equals training without it bit for bit; and the hook really runs:
gradients dropped, every optimizer state tensor (and under full mode every weight) the host copy, brought back
for a checkpoint and sent out again after it."""

from __future__ import annotations

import pytest
import torch

from orchestrator.tracking.names import OFFLOAD
from workers.credit import CreditConfig
from workers.learner.config import LearnerConfig
from workers.learner.inputs import LearnerBatch, RunSettings
from workers.learner.learner import MODELS, POLICY, Learner
from workers.learner.offload import HOST, OPTIMIZER, nbytes
from workers.models.loading import build_tiny_model
from workers.objectives.interventions import InterventionsConfig

OFFLOAD_KEYS = set(OFFLOAD)  # the names the tracker expects (orchestrator/tracking/names.py)
# lora with a LoRA critic (two optimizers, weights stay); full with a full critic and the KL reference (three
# models' weights leave too)
SETUPS = {
    "lora_gae": ({}, {"advantage_mode": "gae"}, {}),
    "full_gae_kl": ({"mode": "full", "critic": {"model": "full"}}, {"advantage_mode": "gae"},
                    {"kl": {"measure": True}}),
}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> str:
    return str(build_tiny_model(tmp_path_factory.mktemp("tiny"), seed=0))


def _learner(model: str, setup: str, offload: bool) -> Learner:
    learner, credit, iv = SETUPS[setup]
    cfg = {**learner, "offload_between_steps": offload,
           "optim": {"lr": 1e-2, "mini_batch_size": 2}}  # two optimizer steps per training step
    return Learner(model, learner=LearnerConfig.model_validate(cfg), credit=CreditConfig.model_validate(credit),
                   interventions=InterventionsConfig.model_validate(iv), run=RunSettings(seed=0, total_steps=4))


def _batch(learner: Learner, step: int) -> LearnerBatch:
    tok = learner.tokenizer
    prompt = tok("what is 3 + 4 ?")["input_ids"]
    responses = [tok(t)["input_ids"] + [tok.eos_token_id] for t in ("7", "8", "the answer is 7", "3")]
    rewards = [[1.0, 0.0, 1.0, 0.0]] if step % 2 == 0 else [[0.0, 1.0, 0.0, 1.0]]
    return LearnerBatch(prompt_ids=[prompt] * 4, response_ids=responses,
                        rollout_logprobs=[[-1.0] * len(r) for r in responses], rewards=rewards,
                        temperature=1.0, sepa_lambda=0.0, step=step)


def _optimizers(learner: Learner) -> list[torch.optim.Optimizer]:
    return [learner.optimizer] + ([learner.critic.optimizer] if learner.critic is not None else [])


def _state(learner: Learner) -> dict[str, torch.Tensor]:
    """Every weight and every optimizer state tensor, by name."""
    out = {f"model.{k}": v for k, v in learner.model.state_dict().items()}
    if learner.critic is not None:
        out |= {f"critic.{k}": v for k, v in learner.critic.module.state_dict().items()}
    for i, opt in enumerate(_optimizers(learner)):
        for j, s in opt.state_dict()["state"].items():
            out |= {f"opt{i}.{j}.{k}": v for k, v in s.items() if isinstance(v, torch.Tensor)}
    return out


@pytest.mark.parametrize("setup", list(SETUPS))
def test_offload_between_steps_trains_bit_for_bit_as_without(tiny, setup):
    on, off = _learner(tiny, setup, True), _learner(tiny, setup, False)
    for step in range(2):
        m_on, m_off = on.train_step(_batch(on, step)).metrics, off.train_step(_batch(off, step)).metrics
        assert OFFLOAD_KEYS <= m_on.keys() and not OFFLOAD_KEYS & m_off.keys()
        rest = {k: v for k, v in m_on.items() if k not in OFFLOAD_KEYS}
        assert rest.keys() == m_off.keys()
        assert all(rest[k] == m_off[k] or (rest[k] != rest[k] and m_off[k] != m_off[k]) for k in rest), step
    assert on.optimizer_steps == off.optimizer_steps == 4
    a, b = _state(on), _state(off)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("setup", list(SETUPS))
def test_offload_hook_moves_the_state_to_the_host_and_back_for_a_checkpoint(tiny, setup):
    learner = _learner(tiny, setup, True)
    metrics = learner.train_step(_batch(learner, 0)).metrics
    hook = learner.offloader
    assert hook.offloads == 1 and metrics["time/reload_s"] >= 0.0 and metrics["time/offload_s"] >= 0.0
    full = learner.full
    groups = {OPTIMIZER, POLICY, MODELS} if full else {OPTIMIZER}
    assert set(hook.away) == groups
    # the gradients are gone; every optimizer state tensor is the host copy, recorded with the device it left
    assert all(p.grad is None for p in learner.model.parameters())
    assert all(p.grad is None for p in learner.critic.params)
    opt_tensors = [v for opt in _optimizers(learner) for s in opt.state.values() for v in s.values()
                   if isinstance(v, torch.Tensor)]
    assert opt_tensors and all(v.device == torch.device(HOST) for v in opt_tensors)
    entries = hook.away[OPTIMIZER].entries
    assert len(entries) == len(opt_tensors) and all(state[key] is v for (state, key, _), v in
                                                    zip(entries, opt_tensors, strict=True))
    moved = sum(nbytes(v) for v in opt_tensors)
    if full:  # the policy, its frozen reference and the full critic leave too
        assert learner.reference is not None
        moved += sum(nbytes(t) for m in (learner.model, learner.reference, learner.critic.model)
                     for t in [*m.parameters(), *m.buffers()])
    assert metrics["memory/offloaded_bytes"] == moved > 0
    # a checkpoint brings everything back for the call, the weight sync only the policy; both send it out again
    seen = {}

    def spy(part, method):
        read = getattr(part, method)

        def call(*args):
            seen[method] = set(hook.away)
            return read(*args)
        setattr(part, method, call)

    spy(learner.state_io, "checkpoint_files")
    spy(learner.exporter, "export_policy")
    assert learner.checkpoint_files() and learner.export_policy(1) is not None
    assert seen["checkpoint_files"] == set() and set(hook.away) == groups
    assert seen["export_policy"] == groups - {POLICY}
    # the next step brings everything back first
    learner.train_step(_batch(learner, 1))
    assert hook.offloads == 2 and learner.optimizer_steps == 4
