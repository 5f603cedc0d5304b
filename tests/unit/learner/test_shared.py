"""The shared learner (workers/learner/pool/): every slot is the separate learner, bit for bit. Four slots of
different seeds, credit and interventions trained interleaved, a reused slot, checkpoints across shared and
separate, a failed or NaN step in one slot; each against `Learner` trained alone on the same batches (tiny Qwen3,
in-process, no Ray). Equality is `torch.equal` / `==`, never a tolerance."""

from __future__ import annotations

import math

import pytest
import torch

from workers.credit import CreditConfig
from workers.learner.config import LearnerConfig
from workers.learner.inputs import LearnerBatch, RunSettings, StepResult
from workers.learner.learner import Learner
from workers.learner.pool.base import SlotRng
from workers.learner.pool.shared import SharedLearner
from workers.objectives.interventions import InterventionsConfig
from workers.tiny.local import local_model_path

STEPS = 3
# (seed, learner, credit, interventions): LoRA dropout in every slot, so a step draws from the global RNG
SETUPS = [
    (11, {}, {}, {}),
    (12, {"critic": {"lr": 1e-3}}, {"advantage_mode": "gae"}, {}),  # a LoRA critic: GAE, a second adapter + head
    (13, {"optim": {"mini_batch_size": 2}}, {"transform_mode": "gtpo"}, {"kl": {"coef": 0.1}}),
    (14, {}, {"advantage_mode": "maxrl"}, {"entropy_bonus": {"coeff": 0.01}}),
]
TEXTS = ["7", "the answer is 7", "so 8", "let me check: 3 + 4 = 7.", "31", "wait, 36 - 5 = 31", "9", "B so it is"]


@pytest.fixture(scope="module")
def model() -> str:
    return local_model_path("tiny-qwen3", 0)


def _settings(k: int) -> dict:
    seed, learner, credit, iv = SETUPS[k]
    cfg = {**learner, "lora": {"rank": 8, "dropout": 0.1}, "optim": {"lr": 1e-2, **learner.get("optim", {})}}
    return {"learner": LearnerConfig.model_validate(cfg), "credit": CreditConfig.model_validate(credit),
            "interventions": InterventionsConfig.model_validate(iv), "run": RunSettings(seed=seed, total_steps=10)}


def _separate(model: str, k: int) -> Learner:
    return Learner(model, **_settings(k))


def _batch(tok, k: int, step: int) -> LearnerBatch:
    """Slot `k`'s batch of `step`: 2 groups of 4, texts and rewards differing by slot and step."""
    prompt = [tok(f"what is {k} + {step} ?")["input_ids"], tok("what is 12 * 3 - 5 ?")["input_ids"]]
    picks = [TEXTS[(k + step + i) % len(TEXTS)] for i in range(8)]
    responses = [tok(t)["input_ids"] + [tok.eos_token_id] for t in picks]
    rewards = [[float((i + k + step) % 2) for i in range(4)], [float((i + k) % 3 == 0) for i in range(4)]]
    return LearnerBatch(prompt_ids=[prompt[i // 4] for i in range(8)], response_ids=responses,
                        rollout_logprobs=[[-1.0] * len(r) for r in responses], rewards=rewards,
                        temperature=0.9, step=step)


def _state(learner: Learner, rng: SlotRng) -> dict:
    """Everything a slot owns: trained weights (adapters, critic head), every optimizer's state and
    hyperparameters, the LR, the step counters and the random streams."""
    out = {f"w.{n}": p.detach() for n, p in learner.model.named_parameters() if p.requires_grad}
    optimizers = {"policy": learner.optimizer}
    if learner.critic is not None:
        out.update({f"head.{n}": p.detach() for n, p in learner.critic.head.named_parameters()})
        optimizers["critic"] = learner.critic.optimizer
    for name, opt in optimizers.items():
        sd = opt.state_dict()
        for i, st in sd["state"].items():
            for key in ("exp_avg", "exp_avg_sq", "step"):
                out[f"{name}.{i}.{key}"] = st[key]
        out[f"{name}.lr"] = torch.tensor([g["lr"] for g in sd["param_groups"]], dtype=torch.float64)
    out["lr_last"] = torch.tensor(learner.scheduler.get_last_lr(), dtype=torch.float64)
    out["counters"] = torch.tensor([learner.steps_done, learner.optimizer_steps])
    out["torch_rng"] = rng.torch_cpu
    out["python_rng"] = torch.tensor(rng.python[1])
    return out


def _assert_same_state(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    different = [k for k in a if not torch.equal(a[k], b[k])]
    assert not different, different


def _assert_same_result(a: StepResult, b: StepResult) -> None:
    assert a.metrics.keys() == b.metrics.keys()
    different = [k for k, v in a.metrics.items()
                 if not (v == b.metrics[k] or (math.isnan(v) and math.isnan(b.metrics[k])))]
    assert not different, different
    assert torch.equal(a.exec_values, b.exec_values)
    assert a.episode_advantages == b.episode_advantages and a.token_advantage_means == b.token_advantage_means


def _alone(model: str, k: int, steps: int = STEPS) -> tuple[list[StepResult], dict]:
    """Slot k's twin: a separate learner built and trained alone, its results and final state."""
    learner = _separate(model, k)
    results = [learner.train_step(_batch(learner.tokenizer, k, s)) for s in range(steps)]
    return results, _state(learner, SlotRng.capture())


@pytest.fixture(scope="module")
def twins(model) -> list[tuple[list[StepResult], dict]]:
    return [_alone(model, k) for k in range(len(SETUPS))]


def test_four_interleaved_slots_equal_their_separate_twins(model, twins):
    pool = SharedLearner(model, slots=len(SETUPS))
    for k in range(len(SETUPS)):
        pool.open(k, **_settings(k))
    tok = pool.learner(0).tokenizer
    results = {k: [] for k in range(len(SETUPS))}
    for s in range(STEPS):  # slot 0 step 0, slot 1 step 0, ..., slot 0 step 1, ...
        for k in range(len(SETUPS)):
            results[k].append(pool.train_step(k, _batch(tok, k, s)))
    for k, (want, state) in enumerate(twins):
        for got, ref in zip(results[k], want, strict=True):
            _assert_same_result(got, ref)
        _assert_same_state(_state(pool.learner(k), pool.rng(k)), state)
    # the frozen base is one copy: every slot's base weights are the same tensors
    base = {id(t) for t in pool.base.tensors()}
    for k in range(len(SETUPS)):
        frozen = [p for p in pool.learner(k).model.parameters() if not p.requires_grad]
        assert frozen and all(id(p) in base for p in frozen)
    ptrs = [{p.data_ptr() for p in pool.learner(k).model.parameters() if not p.requires_grad} for k in range(4)]
    assert ptrs[0] == ptrs[1] == ptrs[2] == ptrs[3]
