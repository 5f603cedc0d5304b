"""Full fine-tuning on a 2-rank learner group, end to end on the real stack: local Ray and Tune, a vLLM-CPU worker
that reloads the full weights every step, two FSDP2 learner ranks over gloo in the trial's placement group, PPO with
a full critic (RAGEN's shape).

After each sync the worker's log-probs equal the learner's (the learner's scoring pass recomputes the log-probs of
the tokens the worker sampled), the policy version advances every step, a trial killed after step 1 and resumed
from its checkpoint (sharded by 2 ranks) gives the same metrics as one never killed. (A 2-rank checkpoint restored
on 1 rank: tests/integration/learner/test_learner_group_math.py.)"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import cloudpickle
import pytest
import torch

from orchestrator.config.trial import TrialConfig
from orchestrator.tune.launch import run_single_trial
from tests.integration.trial.test_trial import dies_once_after, rows, stable

pytestmark = pytest.mark.integration

BASE = dict(steps=3, seed=5, checkpoint={"every": 1}, model={"name": "tiny"}, task={"name": "arithmetic"},
            rollout={"num_workers": 1, "prompts_per_step": 4, "n": 4, "max_tokens": 6},
            learner={"mode": "full", "optim": {"lr": 1e-3, "micro_batch_size": 4}, "critic": {"lr": 1e-3}},
            credit={"advantage_mode": "gae"},  # the full critic too; and every group trains (no uniform skip)
            eval={"every": 0}, interventions={"kl": {"measure": True}}, resources={"learner_ranks": 2, "learner_cpus": 0.5, "worker_cpus": 0.5,
                                           "driver_cpus": 0.25})


@pytest.fixture(scope="module")
def runs(ray_local, tmp_path_factory) -> dict:
    from ray import tune

    from orchestrator.config.placement import bundles

    storage = tmp_path_factory.mktemp("full")
    plain = TrialConfig(name="plain", output_dir=str(storage / "plain"), **BASE)
    assert run_single_trial(plain, storage) is not None
    for module in (sys.modules[__name__], sys.modules[dies_once_after.__module__]):
        cloudpickle.register_pickle_by_value(module)
    killed = TrialConfig(name="killed", output_dir=str(storage / "killed"), **BASE)
    result = tune.Tuner(
        tune.with_resources(dies_once_after(1), tune.PlacementGroupFactory(bundles(killed), strategy="PACK")),
        param_space=killed.model_dump(),
        run_config=tune.RunConfig(name="killed", storage_path=str(storage),
                                  failure_config=tune.FailureConfig(max_failures=1)),
    ).fit()[0]
    assert result.error is None and (storage / "killed" / "failed_once").exists()
    return {"plain": rows(plain.output_dir), "killed": rows(killed.output_dir), "storage": storage,
            "placement": json.loads((Path(plain.output_dir) / "placement.json").read_text())}


def test_workers_sample_with_the_learners_weights(runs):
    plain = runs["plain"]
    assert [r["step"] for r in plain] == [0, 1, 2]
    assert [r["rollout/adapter_version"] for r in plain] == [0, 1, 2]  # a new policy after every step
    for r in plain:  # the learner's recomputed log-probs of the sampled tokens: the weights the worker used
        assert r["train/logprob_gap_max"] < 1e-4, r
    assert len(runs["placement"]["learner_ranks"]) == 2


def test_the_policy_moves_away_from_the_frozen_reference(runs):
    """KL to the frozen copy of the initial weights (measured, not penalised): zero before the first update, then
    growing as every weight trains; the log-prob gap above says the worker followed each time."""
    kl = [r["kl/ref"] for r in runs["plain"]]
    assert abs(kl[0]) < 1e-6 and kl[1] > 1e-5 and kl[2] > 1e-5, kl


def test_kill_and_resume_gives_the_same_metrics(runs):
    assert [r["step"] for r in runs["killed"]] == [0, 1, 2]
    assert [stable(r) for r in runs["plain"]] == [stable(r) for r in runs["killed"]]


def heldout_logprobs(model, cfg: TrialConfig, tokenizer) -> torch.Tensor:
    """Next-token log-probs `[N, T-1]` of the trial's first held-out prompts (padded right, 0 past each end)."""
    from workers.envs.tokens import first_prompt_ids
    from workers.tasks import make_task

    prompts = [first_prompt_ids(tokenizer, p.prompt) for p in make_task(cfg.task, cfg.seed).heldout(4)]
    width = max(map(len, prompts))
    ids = torch.tensor([p + [tokenizer.pad_token_id] * (width - len(p)) for p in prompts])
    mask = torch.tensor([[1] * len(p) + [0] * (width - len(p)) for p in prompts])
    model.eval()
    with torch.no_grad():
        lp = torch.log_softmax(model(input_ids=ids, attention_mask=mask).logits.float(), -1)
    return lp[:, :-1].gather(-1, ids[:, 1:, None])[..., 0] * mask[:, 1:]


def test_export_gathers_the_two_rank_checkpoint_into_one_model(runs, tmp_path, capsys):
    """`export` of the 2-rank full-mode trial: one safetensors model whose log-probs on the trial's held-out prompts
    equal the learner's at its last step (the 2-rank checkpoint restored on one rank by the learner's own code)."""
    from transformers import AutoModelForCausalLM

    from orchestrator.cli import main
    from orchestrator.storage import filesystem
    from orchestrator.trial.models import resolve_model
    from orchestrator.trial.restore import verified_checkpoint
    from workers.learner.inputs import RunSettings
    from workers.learner.learner import Learner

    trial_dir, out = runs["storage"] / "plain", tmp_path / "full"
    assert main(["export", str(trial_dir), "--out", str(out)]) == 0, capsys.readouterr().err
    manifest = json.loads((out / "export_manifest.json").read_text())
    assert (manifest["step"], manifest["kind"], manifest["policy_version"]) == (2, "full", 3)
    assert any(name.endswith(".safetensors") for name in manifest["files"])

    cfg = TrialConfig(name="plain", **BASE)
    _, files, _ = verified_checkpoint(*filesystem(str(trial_dir / "plain")))
    learner = Learner(resolve_model(cfg.model), learner=cfg.learner, credit=cfg.credit,
                      run=RunSettings(seed=cfg.seed, total_steps=cfg.steps), interventions=cfg.interventions)
    learner.restore({k: v for k, v in files.items() if k.startswith(("learner.pt", "learner_shards/"))}, "ck")
    want = heldout_logprobs(learner.model, cfg, learner.tokenizer)
    got = heldout_logprobs(AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32), cfg,
                           learner.tokenizer)
    base = heldout_logprobs(AutoModelForCausalLM.from_pretrained(resolve_model(cfg.model), dtype=torch.float32),
                            cfg, learner.tokenizer)
    assert (got - want).abs().max() < 1e-5
    assert (base - want).abs().max() > 1e-4  # three full-mode steps moved the weights: not the base re-exported
