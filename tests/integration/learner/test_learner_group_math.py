"""A 2-rank learner group (real torch.distributed over gloo, FSDP2-sharded models) gives the same gradients, the
same step-1 weights and the same metrics as one unsharded rank on the same batch, for LoRA and for full
fine-tuning, with token counts that differ between the ranks (so the ranks also run different numbers of real
micro-batches and pad with zero-weight passes). Token-mean over the whole mini-batch is what makes this exact:
each rank divides by the whole mini-batch's token count, and the group sums the gradients."""

from __future__ import annotations

import socket
from unittest import mock

import pytest
import torch
import torch.multiprocessing as mp
from torch.optim.optimizer import register_optimizer_step_pre_hook

from orchestrator.config.trial import TrialConfig
from tests.integration.learner.test_learner_interventions import COMPLETIONS, PROMPTS, _encode
from tests.tolerance import adam_tolerance, assert_close_to_scale, close_to_scale, scale_tolerance
from workers.checkpoint.blob import CorruptCheckpoint, dump_blob, load_blob
from workers.learner.inputs import LearnerBatch, RunSettings
from workers.learner.learner import Learner
from workers.learner.ranks import ONE_RANK, Ranks, split_rows

pytestmark = pytest.mark.integration

REWARDS = [[1.0, 0.0, 0.0, 0.5], [1.0, 0.0, 0.25, 1.0]]
# (name, trial config overrides): LoRA with GRPO; LoRA with a GAE critic (its own adapter on the shared base);
# full fine-tuning with a full critic and KL to the frozen reference copy; full fine-tuning with a LoRA critic on
# the trained weights
VARIANTS = [
    ("lora", {"learner": {"optim": {"lr": 1e-2}}}),
    ("lora_gae", {"learner": {"optim": {"lr": 1e-2, "mini_batch_size": 5, "ppo_epochs": 2},
                              "critic": {"lr": 1e-3}},
                  "credit": {"advantage_mode": "gae"}}),
    ("full_gae_kl", {"learner": {"mode": "full", "optim": {"lr": 1e-3, "mini_batch_size": 5},
                                 "critic": {"lr": 1e-3}},
                     "credit": {"advantage_mode": "gae"}, "interventions": {"kl": {"coef": 0.05}}}),
    ("full_lora_critic", {"learner": {"mode": "full", "optim": {"lr": 1e-3, "mini_batch_size": 5},
                                      "critic": {"model": "lora", "lr": 1e-3}},
                          "credit": {"advantage_mode": "gae"}}),
]

# fractions of tokens past a clip edge: after an Adam step the ranks' weights differ by up to ~1% of lr (see
# _assert_same), so a token whose value or ratio lands that close to the edge may count on one side only
EDGE_COUNTS = ("critic/vf_clip_frac", "train/clip_frac")
CHECKPOINTED = ("lora_gae", "full_gae_kl", "full_lora_critic")
FROM_ONE_RANK = "lora_gae"  # the variant whose one-rank (single-blob) checkpoint the group restores
# a metric whose terms are larger than its value: the token mean of whitened advantages (terms ~1, mean ~0)
METRIC_SCALE = {"credit/adv_token_mean": "credit/adv_token_abs_mean"}


def _averaged_over_ranks():
    """Injected error: FSDP's default reduction, the ranks' mean instead of their sum (each rank's loss already
    carries the whole mini-batch's denominators, so the mean halves every gradient)."""
    from torch.distributed.fsdp import FSDPModule

    return mock.patch.object(FSDPModule, "set_gradient_divide_factor", lambda self, factor: None)


def _micro_batch_dropped():
    """Injected error: rank 0's first micro-batch runs as a zero-weight padding pass."""
    from workers.learner.passes.forward import PolicyForward

    passes = PolicyForward.passes

    def dropped(self, b, rows):
        out = passes(self, b, rows)
        if self.layout.ranks.rank == 0:
            out[0] = (out[0][0], False)
        return out

    return mock.patch.object(PolicyForward, "passes", dropped)


INJECTED = {"averaged_over_ranks": _averaged_over_ranks, "micro_batch_dropped": _micro_batch_dropped}


def _config(overrides: dict) -> TrialConfig:
    base = {"model": {"name": "tiny"}, "task": {"name": "arithmetic"}}
    cfg = TrialConfig.model_validate({**base, **overrides})
    cfg.learner.optim.micro_batch_size = 2
    return cfg


def _learner(model_dir: str, cfg: TrialConfig, ranks: Ranks = ONE_RANK, init: str | None = None) -> Learner:
    return Learner(model_dir, learner=cfg.learner, credit=cfg.credit, run=RunSettings(seed=0, total_steps=10),
                   interventions=cfg.interventions, ranks=ranks, init_method=init)


def _batch(tok) -> LearnerBatch:
    p_ids, c_ids = _encode(tok, PROMPTS, COMPLETIONS)
    return LearnerBatch(prompt_ids=p_ids, response_ids=c_ids, rollout_logprobs=[[-1.5] * len(c) for c in c_ids],
                        rewards=REWARDS, temperature=1.0, step=0)


def _full(t: torch.Tensor) -> torch.Tensor:
    return (t.full_tensor() if hasattr(t, "full_tensor") else t).detach().clone()


def _trained(learner: Learner) -> list[tuple[str, torch.nn.Parameter]]:
    named = [("policy." + n, p) for n, p in learner.model.named_parameters() if p.requires_grad]
    if learner.critic is not None and learner.critic.module is not learner.model:
        named += [("critic." + n, p) for n, p in learner.critic.module.named_parameters()]
    elif learner.critic is not None:
        named += [("critic_head." + n, p) for n, p in learner.critic.head.named_parameters()]
    return named


def _outcome(learner: Learner) -> dict:
    """Metrics, every trained weight after one step, and each weight's gradient (gathered from the shards) at
    every optimizer update with that update's Adam lr and eps. Only the first update's gradient is a pure sum
    over the same weights on both sides: from the second PPO mini-batch on, each side's gradient is taken at
    weights that already differ by rounding; those gradients only tell which weights Adam may move by rounding
    (tests/tolerance.py:adam_tolerance)."""
    named = _trained(learner)
    updates: dict[str, list[torch.Tensor]] = {}
    adam: dict[str, tuple[float, float]] = {}

    def snapshot(optimizer, args, kwargs) -> None:  # every rank calls it at the same update: the gather is collective
        groups = {id(p): group for group in optimizer.param_groups for p in group["params"]}
        for n, p in named:
            if id(p) in groups and p.grad is not None:
                updates.setdefault(n, []).append(_full(p.grad))
                lr, eps = groups[id(p)]["lr"], groups[id(p)]["eps"]
                adam[n] = (max(lr, adam.get(n, (0.0, 0.0))[0]), eps)

    hook = register_optimizer_step_pre_hook(snapshot)
    try:
        out = learner.train_step(_batch(learner.tokenizer))
    finally:
        hook.remove()
    return {"metrics": out.metrics, "weights": {n: _full(p) for n, p in named},
            "grads": {n: g[0] for n, g in updates.items()}, "updates": updates, "adam": adam}


def _rank(rank: int, world: int, init: str, model_dir: str, out_file: str, one_rank_file: str) -> None:
    """Each variant: one step; then (checkpointed variants) the merged checkpoint files and a second step. Last,
    a fresh group restores a one-rank LoRA learner's checkpoint (its single blob) and takes the next step."""
    import torch.distributed as dist

    torch.set_num_threads(1)
    results = {}
    for name, overrides in VARIANTS:
        learner = _learner(model_dir, _config(overrides), Ranks(rank, world), init)
        results[name] = _outcome(learner)
        results[name]["policy"] = learner.export_policy(1)  # collective: gathered from the shards onto rank 0
        if name in CHECKPOINTED:
            parts: list = [None] * world
            dist.all_gather_object(parts, learner.checkpoint_files())
            results[name]["checkpoint"] = {k: v for part in parts for k, v in part.items()}
            results[name]["after"] = _outcome(learner)
    results["injected"] = {}
    for name, inject in INJECTED.items():  # the errors the comparison exists to catch, on the LoRA variant
        with inject():
            results["injected"][name] = _outcome(_learner(model_dir, _config(dict(VARIANTS)["lora"]),
                                                          Ranks(rank, world), init))
    learner = _learner(model_dir, _config(dict(VARIANTS)[FROM_ONE_RANK]), Ranks(rank, world), init)
    learner.restore(torch.load(one_rank_file)["checkpoint"], "one-rank checkpoint")
    results["from_one_rank"] = _outcome(learner)
    state = load_blob(torch.load(one_rank_file)["checkpoint"]["learner.pt"], "one-rank checkpoint")
    del state["critic"]  # as a GRPO learner saves it: this GAE learner must refuse it, on every rank alike
    try:
        learner.restore({"learner.pt": dump_blob(state)}, "grpo checkpoint")
    except CorruptCheckpoint as exc:
        results["no_critic"] = str(exc)
    if rank == 0:
        torch.save(results, out_file)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def one_rank(tiny_model_dir, tmp_path_factory) -> tuple[str, dict]:
    """An unsharded LoRA + GAE learner's checkpoint after one step (the single-blob format) and its next step."""
    learner = _learner(tiny_model_dir, _config(dict(VARIANTS)[FROM_ONE_RANK]))
    _outcome(learner)
    files = learner.checkpoint_files()
    assert sorted(files) == ["learner.pt"]
    path = tmp_path_factory.mktemp("one") / "one_rank.pt"
    torch.save({"checkpoint": files}, path)
    return str(path), _outcome(learner)


@pytest.fixture(scope="module")
def two_ranks(tiny_model_dir, tmp_path_factory, one_rank) -> dict:
    out = tmp_path_factory.mktemp("group") / "two_ranks.pt"
    mp.spawn(_rank, args=(2, f"tcp://127.0.0.1:{_free_port()}", tiny_model_dir, str(out), one_rank[0]), nprocs=2)
    return torch.load(out, weights_only=False)


def test_the_batch_splits_unevenly(tiny_model_dir):
    """The premise: the two ranks get different token counts and different numbers of micro-batches."""
    from workers.learner.batch import collate
    from workers.models.loading import load_tokenizer

    b = collate(_batch(load_tokenizer(tiny_model_dir)), 0)
    lengths = b.attn.sum(-1)
    shares = split_rows(torch.arange(b.size), lengths, 2)
    tokens = [int(lengths[s].sum()) for s in shares]
    assert sorted(torch.cat(shares).tolist()) == list(range(b.size)) and tokens[0] != tokens[1]
    five = split_rows(torch.arange(5), lengths, 2)  # a PPO mini-batch of 5 rows: 3 and 2 rows, 2 and 1 passes
    assert sorted(len(s) for s in five) == [2, 3]


@pytest.mark.parametrize("variant", [v[0] for v in VARIANTS])
def test_two_ranks_equal_one(two_ranks, tiny_model_dir, variant):
    one = _outcome(_learner(tiny_model_dir, _config(dict(VARIANTS)[variant])))
    _assert_same(one, two_ranks[variant], variant)


@pytest.mark.parametrize("fault", INJECTED)
def test_an_injected_error_fails_the_comparison(two_ranks, tiny_model_dir, fault):
    """The tolerance is rounding-sized: a gradient summed wrongly over the ranks, or a micro-batch lost, misses it
    by orders of magnitude, and `_assert_same` fails on the gradients."""
    one = _outcome(_learner(tiny_model_dir, _config(dict(VARIANTS)["lora"])))
    wrong = two_ranks["injected"][fault]
    with pytest.raises(AssertionError, match=r"^grad "):
        _assert_same(one, wrong, "lora")
    worst = max(float((wrong["grads"][n] - g).abs().max()) / scale_tolerance(g) for n, g in one["grads"].items())
    assert worst > 100, f"{fault}: the error is only {worst:.3g}x the tolerance"


@pytest.mark.parametrize("variant", ["lora", "full_gae_kl", "full_lora_critic"])
def test_the_exported_policy_is_gathered_from_the_shards(two_ranks, tiny_model_dir, variant):
    """What the rollout workers get from rank 0 of the group (LoRA adapter files, or the full weights with their
    checksum) equals what one rank exports after the same step; never the critic's adapter."""
    from safetensors.torch import load

    one = _learner(tiny_model_dir, _config(dict(VARIANTS)[variant]))
    _outcome(one)
    a, b = one.export_policy(1), two_ranks[variant]["policy"]
    assert a.kind == b.kind == ("adapter" if variant == "lora" else "weights")
    assert sorted(set(a.files) - {"README.md"}) == sorted(b.files)  # PEFT's model card: only on one rank
    if variant == "lora":  # the same config (PEFT keeps target_modules as a set: its order varies by process)
        import json

        ca, cb = (json.loads(x.files["adapter_config.json"]) for x in (a, b))
        ca["target_modules"], cb["target_modules"] = sorted(ca["target_modules"]), sorted(cb["target_modules"])
        assert ca == cb
    for name in a.files:
        if name.endswith(".safetensors"):
            ta, tb = load(a.files[name]), load(b.files[name])
            assert sorted(ta) == sorted(tb) and not any("critic" in k for k in ta)
            for k in ta:
                lr = dict(VARIANTS)[variant]["learner"]["optim"]["lr"]  # the weights' Adam bound (_assert_same)
                torch.testing.assert_close(tb[k], ta[k], rtol=1e-5, atol=1e-2 * lr)
    if variant != "lora":  # the checksum the workers will compare against is that of the weights sent
        from workers.sync.full_weights import weights_checksum

        sent = {k: v for name, data in b.files.items() if name.endswith(".safetensors")
                for k, v in load(data).items()}
        assert b.checksum == weights_checksum(sent, torch.float32)


@pytest.mark.parametrize("variant", CHECKPOINTED)
def test_a_two_rank_checkpoint_resumes_on_one_rank(two_ranks, tiny_model_dir, variant):
    """The 2 ranks' DCP shards (each rank wrote its own) restore into one unsharded learner: its next step equals
    the 2-rank group's next step (weights, Adam moments, scheduler and counters all came back)."""
    files = two_ranks[variant]["checkpoint"]
    assert sum(1 for k in files if k.endswith(".distcp")) == 2, sorted(files)  # one shard file per rank
    learner = _learner(tiny_model_dir, _config(dict(VARIANTS)[variant]))
    learner.restore(files, "two-rank checkpoint")
    _assert_same(_outcome(learner), two_ranks[variant]["after"], variant)


def test_a_one_rank_checkpoint_resumes_on_two_ranks(two_ranks, one_rank):
    """A one-rank LoRA learner's checkpoint (adapters, critic head and both Adam states in one blob, keyed as PEFT
    and torch save them) restored on a 2-rank group: the group's next step equals the one rank's next step."""
    _assert_same(one_rank[1], two_ranks["from_one_rank"], FROM_ONE_RANK)
    assert two_ranks["no_critic"] == ("grpo checkpoint/learner.pt: holds no critic (saved without one); resume it "
                                      "with the credit.advantage_mode it was saved with")


def test_a_lora_checkpoint_does_not_resume_in_full_mode(one_rank, tiny_model_dir):
    learner = _learner(tiny_model_dir, _config(dict(VARIANTS)["full_gae_kl"]))
    with pytest.raises(CorruptCheckpoint, match=r"^lora run/learner.pt: saved by a LoRA learner .*learner.mode lora$"):
        learner.restore(torch.load(one_rank[0])["checkpoint"], "lora run")


def _assert_same(one: dict, two: dict, variant: str) -> None:
    """The group's outcome equals one rank's up to summation order (tests/tolerance.py): the ranks sum the same
    terms as one rank, split differently and all-reduced, so each first-update gradient is compared at a few
    hundred float32 epsilons of its tensor's largest element (measured: <= 29 on three CPU kernel paths)."""
    assert set(one["weights"]) == set(two["weights"]) and set(one["grads"]) == set(two["grads"])
    assert len(one["grads"]) > 0
    for n, g in one["grads"].items():
        assert_close_to_scale(two["grads"][n], g, what=f"grad {n}")
    # AdamW divides by sqrt(v): a gradient that is zero up to float rounding still moves its weight by up to lr;
    # the weights are compared to what Adam makes of the gradients' rounding, element by element
    for n, w in one["weights"].items():
        if n not in one["updates"]:  # never updated: untouched on both sides
            torch.testing.assert_close(two["weights"][n], w, rtol=0, atol=0, msg=lambda m, n=n: f"weight {n}: {m}")
            continue
        lr, eps = one["adam"][n]
        bound = adam_tolerance(one["updates"][n], two["updates"][n], lr, eps)
        over = (two["weights"][n] - w).abs() > bound
        assert not over.any(), (f"weight {n}: {int(over.sum())} of {w.numel()} elements beyond Adam's rounding "
                                f"bound (largest excess {float(((two['weights'][n] - w).abs() - bound).max()):.3g})")
    assert any(float(g.abs().sum()) > 0 for n, g in one["grads"].items() if n.startswith("policy.")), \
        "the step trained no policy weight: equal weights would prove nothing"
    tokens = one["metrics"]["train/tokens"]
    for key, value in one["metrics"].items():
        if key in EDGE_COUNTS:  # a value within the ranks' float noise of the clip edge flips one token
            assert abs(two["metrics"][key] - value) <= 1.0 / tokens + 1e-9, key
        elif isinstance(value, float):  # means and norms of what the step summed: rounding of their own size
            scale = abs(one["metrics"][METRIC_SCALE[key]]) if key in METRIC_SCALE else abs(value)
            assert close_to_scale(two["metrics"][key], value, scale), (key, two["metrics"][key], value)
