"""The leak guard on the real pool (orchestrator/trial/actors/leak_guard.py, checked where the pool's learner hands
a step back: orchestrator/trial/actors/shared.py:PoolLearnerClient.result): a trial's slot of a running pool
(orchestrator/pool/lifecycle.py, shared.py:connect) steps through the trial's own step sequence under its own
adapter, then its engines' adapter is swapped for another one (the trial's own with its LoRA B matrices drawn at
random, under the version the trial expects, as a leak between slots would look to the trial): that step fails
with one line naming the slot, the trial, the gap and the bound. Prints both gaps (the guard's margins)."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load, save

from orchestrator.actors.models import resolve_model
from orchestrator.config.trial import TrialConfig, sepa_settings
from orchestrator.pool.lifecycle import running_pools
from orchestrator.trial.actors.calls import Calls
from orchestrator.trial.actors.context import TrialContext
from orchestrator.trial.actors.leak_guard import GAP_METRIC, LEAK_GAP, AdapterLeak
from orchestrator.trial.actors.shared import connect
from orchestrator.trial.step.sequence import TrainingStep
from orchestrator.trial.step.trial_source import trial_source
from workers.credit import SepaController
from workers.models.loading import load_tokenizer
from workers.sync.policy import PolicyUpdate
from workers.tasks import make_task

ADAPTER = "adapter_model.safetensors"


def _other_adapter(update: PolicyUpdate, version: int) -> PolicyUpdate:
    """`update`'s adapter with every LoRA B matrix drawn at random (seeded), labelled `version`."""
    tensors = load(update.files[ADAPTER])
    gen = torch.Generator().manual_seed(1)
    swapped = {k: torch.randn(v.shape, generator=gen, dtype=v.dtype) if "lora_B" in k else v
               for k, v in tensors.items()}
    assert any("lora_B" in k for k in tensors), sorted(tensors)
    files = {**update.files, ADAPTER: save(swapped, metadata={"format": "pt"})}
    return PolicyUpdate(update.kind, version, files, update.checksum)


def test_a_step_sampled_under_another_adapter_fails_on_the_guard(ray_local, reasoner_dir, tmp_path, capsys):
    cfg = TrialConfig(name="leak_s0", output_dir=str(tmp_path / "out"), steps=4, model={"name": "tiny-reasoner"},
                      task={"name": "chain"},
                      rollout={"prompts_per_step": 4, "n": 4, "max_tokens": 24, "skip_uninformative": False,
                               "num_workers": 1, "engine": {"in_process": True}},
                      resources={"worker_cpus": 0.5, "learner_cpus": 0.5, "driver_cpus": 0.25,
                                 "shared_base": {"slots": 1}},
                      wandb={"mode": "disabled"})
    with running_pools([cfg]):
        calls = Calls()
        slot = connect(cfg, calls)
        try:
            task = make_task(cfg.task, cfg.seed)
            ctx = TrialContext(cfg, [], slot.learner, load_tokenizer(resolve_model(cfg.model)), task, None, calls,
                               engines=slot.engines)
            step, sepa = TrainingStep.for_trial(ctx, trial_source(ctx)), SepaController(sepa_settings(cfg))
            own = step.run(0, sepa, 0)  # the trial's own adapter (v0): through the guard
            assert own.version == 1 and own.row[GAP_METRIC] < LEAK_GAP / 100
            slot.engines.load_policy(_other_adapter(slot.learner.export_policy(1), 1))
            with pytest.raises(AdapterLeak) as e:
                step.run(1, sepa, 1)
        finally:
            slot.close()
            task.close()
    message = str(e.value)
    gap = float(message.split(" are ")[1].split(" nats")[0])
    assert "\n" not in message and message.startswith(f"slot {slot.slot} of trial leak_s0 (epoch {slot.lease.epoch})")
    assert f"over the bound {LEAK_GAP:g}" in message and gap > 2 * LEAK_GAP
    with capsys.disabled():
        print(f"\nlog-prob gap per token: own adapter {own.row[GAP_METRIC]:.3g}, another adapter {gap:.3g} "
              f"(bound {LEAK_GAP:g})")
