"""The shared learner (workers/learner/pool/): every slot is the separate learner, bit for bit. Four slots of
different seeds, credit and interventions trained interleaved, a reused slot, checkpoints across shared and
separate, a failed or NaN step in one slot; each against `Learner` trained alone on the same batches (tiny Qwen3,
in-process, no Ray). Equality is `torch.equal` / `==`, never a tolerance."""

from __future__ import annotations

import math
import threading
import weakref

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
    (14, {"gradient_checkpointing": True}, {"advantage_mode": "maxrl"}, {"entropy_bonus": {"coeff": 0.01}}),
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
    """Slot k's twin: a separate learner built and trained alone, its results and final state (with the bytes
    of the adapter it exports)."""
    learner = _separate(model, k)
    results = [learner.train_step(_batch(learner.tokenizer, k, s)) for s in range(steps)]
    return results, {**_state(learner, SlotRng.capture()), **_exported(learner.export_policy(steps).files)}


def _exported(files: dict[str, bytes]) -> dict[str, torch.Tensor]:
    return {f"export.{name}": torch.frombuffer(bytearray(data), dtype=torch.uint8) for name, data in files.items()}


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
        _assert_same_state({**_state(pool.learner(k), pool.rng(k)),
                            **_exported(pool.export_policy(k, STEPS).files)}, state)
    # the frozen base is one copy: every slot's base weights are the same tensors
    base = {id(t) for t in pool.base.tensors()}
    for k in range(len(SETUPS)):
        frozen = [p for p in pool.learner(k).model.parameters() if not p.requires_grad]
        assert frozen and all(id(p) in base for p in frozen)
    ptrs = [{p.data_ptr() for p in pool.learner(k).model.parameters() if not p.requires_grad} for k in range(4)]
    assert ptrs[0] == ptrs[1] == ptrs[2] == ptrs[3]


def test_an_export_runs_beside_another_slots_step_and_changes_neither(model, twins):
    """Slot 1's export (what a trial's push reads) completes while slot 0's training step holds the learner; a
    checkpoint of slot 1 (a call that swaps the random streams in) waits for that step. Both slots still equal their
    separate twins bit for bit: slot 0's step result, slot 1's exported adapter."""
    pool = SharedLearner(model, slots=2)
    pool.open(0, **_settings(0))
    pool.open(1, **_settings(1))
    tok = pool.learner(0).tokenizer
    pool.train_step(1, _batch(tok, 1, 0))
    inside, release, got = threading.Event(), threading.Event(), {}
    step = pool.learner(0).train_prepared  # the part of the step under the learner's lock

    def held_step(prepared):  # slot 0's step, paused inside the learner's lock until the test releases it
        inside.set()
        assert release.wait(60)
        return step(prepared)

    pool.learner(0).train_prepared = held_step
    train = threading.Thread(target=lambda: got.setdefault("step", pool.train_step(0, _batch(tok, 0, 0))))
    train.start()
    assert inside.wait(60)
    export = threading.Thread(target=lambda: got.setdefault("export", pool.export_policy(1, 1)))
    export.start()
    export.join(60)
    assert "export" in got and "step" not in got  # the export did not wait for slot 0's step
    checkpoint = threading.Thread(target=lambda: got.setdefault("checkpoint", pool.checkpoint_files(1)))
    checkpoint.start()
    checkpoint.join(0.5)
    assert "checkpoint" not in got
    release.set()
    train.join(120)
    checkpoint.join(120)
    assert "checkpoint" in got
    _assert_same_result(got["step"], twins[0][0][0])
    busy = pool.stats()  # what the pool's usage line reports
    assert busy["train_s"] > 0 and busy["export_s"] > 0 and busy["checkpoint_s"] > 0
    assert busy["train_s"] + busy["checkpoint_s"] < busy["up_s"]
    twin = _separate(model, 1)
    twin.train_step(_batch(twin.tokenizer, 1, 0))
    assert got["export"].files == twin.export_policy(1).files


def test_a_reused_slot_starts_like_a_fresh_learner(model):
    """A slot closed after its trial trained (moments, counters, RNG advanced) and opened for another trial gives
    that trial's first update bit for bit as a fresh separate learner; so does `open` over a slot still held."""
    want, state = _alone(model, 2, steps=1)
    pool = SharedLearner(model, slots=2)
    pool.open(0, **_settings(0))
    pool.open(1, **_settings(1))
    tok = pool.learner(0).tokenizer
    for s in range(2):
        pool.train_step(0, _batch(tok, 0, s))
        pool.train_step(1, _batch(tok, 1, s))
    gone = weakref.ref(next(p for p in pool.learner(0).model.parameters() if p.requires_grad))
    pool.close(0)
    assert not pool.is_open(0) and pool.is_open(1)
    assert gone() is None  # the closed trial's adapter is freed, not kept beside the new one
    with pytest.raises(ValueError, match="LoRA adapters only"):  # full fine-tuning would train the shared base
        pool.open(0, **{**_settings(2), "learner": LearnerConfig(mode="full")})
    assert not pool.is_open(0)
    for k in (0, 1):  # slot 1: no close first, open clears what the slot held
        pool.open(k, **_settings(2))
        _assert_same_result(pool.train_step(k, _batch(tok, 2, 0)), want[0])
        _assert_same_state({**_state(pool.learner(k), pool.rng(k)), **_exported(pool.export_policy(k, 1).files)},
                           state)


def test_checkpoints_move_between_a_slot_and_a_separate_learner(model, twins):
    """A separate learner's checkpoint after 2 steps restored into a slot (beside a busy neighbour) continues as
    the separate learner does; a slot's checkpoint restored into a fresh separate learner likewise; the two
    checkpoints are the same bytes. The slot's setup has a LoRA critic (its adapter, head and optimizer)."""
    k = 1
    separate = _separate(model, k)
    tok = separate.tokenizer
    for s in range(2):
        separate.train_step(_batch(tok, k, s))
    saved_separate = separate.checkpoint_files()

    pool = SharedLearner(model, slots=2)
    pool.open(0, **_settings(0))
    pool.train_step(0, _batch(tok, 0, 0))
    pool.open(1, **_settings(k))
    pool.train_step(1, _batch(tok, 3, 0))  # a state of its own, which the restore replaces
    pool.restore(1, saved_separate, "separate")
    pool.train_step(0, _batch(tok, 0, 1))
    want, state = twins[k]
    _assert_same_result(pool.train_step(1, _batch(tok, k, 2)), want[2])
    _assert_same_state({**_state(pool.learner(1), pool.rng(1)), **_exported(pool.export_policy(1, STEPS).files)},
                       state)

    pool.open(1, **_settings(k))
    for s in range(2):
        pool.train_step(1, _batch(tok, k, s))
    saved_slot = pool.checkpoint_files(1)
    assert saved_slot.keys() == saved_separate.keys() == {"learner.pt"}
    assert saved_slot == saved_separate
    # a pool of several learners: a retry may take a slot on another learner (another process, its own copy of
    # the base) and restores the checkpoint there; it continues as the separate learner does
    other = SharedLearner(model, slots=2)
    other.open(0, **_settings(k))
    other.restore(0, saved_slot, "slot")
    _assert_same_result(other.train_step(0, _batch(tok, k, 2)), want[2])
    del other
    resumed = _separate(model, k)
    resumed.train_step(_batch(tok, 3, 0))
    resumed.restore(saved_slot, "slot")
    _assert_same_result(resumed.train_step(_batch(tok, k, 2)), want[2])
    _assert_same_state({**_state(resumed, SlotRng.capture()), **_exported(resumed.export_policy(STEPS).files)},
                       state)


def test_a_failed_or_nan_step_in_one_slot_leaves_the_others_untouched(model, twins):
    """Slot 1's step raises (a malformed batch) and slot 2's loss is NaN: its step raises FloatingPointError before
    the optimizer steps (the trial fails; its adapter keeps its last finite weights); slot 0, stepping between
    them, ends equal to its separate twin, and the process's own random streams are never moved by any slot's
    call."""
    pool = SharedLearner(model, slots=3)
    for k in range(3):
        pool.open(k, **_settings(k))
    tok = pool.learner(0).tokenizer
    outer = SlotRng.capture()
    before = {n: p.detach().clone() for n, p in pool.learner(2).model.named_parameters() if p.requires_grad}
    results = []
    for s in range(STEPS):
        results.append(pool.train_step(0, _batch(tok, 0, s)))
        good = _batch(tok, 1, s)
        with pytest.raises(ValueError):
            pool.train_step(1, LearnerBatch(**{**good.__dict__, "rewards": good.rewards[:1]}))
        with pytest.raises(FloatingPointError, match="not applied"):
            pool.train_step(2, LearnerBatch(**{**_batch(tok, 2, s).__dict__, "loss_scale": float("nan")}))
    after = {n: p for n, p in pool.learner(2).model.named_parameters() if p.requires_grad}
    assert before.keys() == after.keys() and all(torch.equal(before[n], after[n]) for n in before)
    want, state = twins[0]
    for got, ref in zip(results, want, strict=True):
        _assert_same_result(got, ref)
    _assert_same_state({**_state(pool.learner(0), pool.rng(0)), **_exported(pool.export_policy(0, STEPS).files)},
                       state)
    now = SlotRng.capture()
    assert torch.equal(now.torch_cpu, outer.torch_cpu) and now.python == outer.python
