"""Full fine-tuning on a 2-rank learner group, end to end on the real stack: local Ray and Tune, a vLLM-CPU worker
that reloads the full weights every step, two FSDP2 learner ranks over gloo in the trial's placement group, PPO with
a full critic (RAGEN's shape).

After each sync the worker's log-probs equal the learner's (the learner's scoring pass recomputes the log-probs of
the tokens the worker sampled), the policy version advances every step. A trial whose learner rank 1 is frozen
(SIGSTOP, found by its pid in placement.json) while rank 0 waits on it fails its deadline (timeouts:), records
which rank froze, loses its actors, and resumes from its checkpoint (sharded by 2 ranks) to the same metrics as one
never stopped. (A 2-rank checkpoint restored
on 1 rank: tests/integration/learner/test_learner_group_math.py.)"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

import pytest
import torch

from orchestrator.config.trial import TrialConfig
from orchestrator.tune.launch import run_single_trial
from tests.integration.trial.test_faults import jsonl, proc_state, wait_for_rows
from tests.integration.trial.test_trial import rows, stable

pytestmark = pytest.mark.integration

BASE = dict(steps=3, seed=5, checkpoint={"every": 1}, model={"name": "tiny"}, task={"name": "arithmetic"},
            rollout={"num_workers": 1, "prompts_per_step": 4, "n": 4, "max_tokens": 6},
            learner={"mode": "full", "optim": {"lr": 1e-3, "micro_batch_size": 4}, "critic": {"lr": 1e-3}},
            credit={"advantage_mode": "gae"},  # the full critic too; and every group trains (no uniform skip)
            eval={"every": 0}, interventions={"kl": {"measure": True}}, resources={"learner_ranks": 2, "learner_cpus": 0.5, "worker_cpus": 0.5,
                                           "driver_cpus": 0.25})


@pytest.fixture(scope="module")
def runs(ray_local, tmp_path_factory) -> dict:
    storage = tmp_path_factory.mktemp("full")
    plain = TrialConfig(name="plain", output_dir=str(storage / "plain"), **BASE)
    assert run_single_trial(plain, storage) is not None
    stopped = TrialConfig(name="stopped", output_dir=str(storage / "stopped"),
                          timeouts={"multiple": 5.0, "min_s": 45.0, "first_s": 300.0, "warmup": 1}, **BASE)
    out, frozen, errors = Path(stopped.output_dir), [], []

    def injector() -> None:
        try:
            wait_for_rows(out, 1, 2)  # steps 0-1 done
            pid = json.loads((out / "placement.json").read_text())["learner_ranks"][1]["pid"]
            os.kill(pid, signal.SIGSTOP)  # this trial's rank 1 only, by the pid it recorded
            frozen.append(pid)
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=injector, daemon=True)
    thread.start()
    t0 = time.monotonic()
    result = run_single_trial(stopped, storage, max_failures=1)
    elapsed = time.monotonic() - t0
    thread.join(timeout=5)
    assert not errors and frozen, errors
    assert result is not None
    print(f"frozen learner rank: trial done in {elapsed:.0f} s", flush=True)
    return {"plain": rows(plain.output_dir), "stopped": rows(stopped.output_dir), "storage": storage,
            "frozen": frozen, "events": jsonl(out / "events.jsonl"),
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


def test_a_frozen_rank_fails_its_deadline_and_resumes_to_the_same_metrics(runs):
    events = runs["events"]
    hangs = [e for e in events if e["event"] == "hang"]
    assert len(hangs) == 1, events
    hang = hangs[0]
    assert hang["phase"] in ("train", "checkpoint", "sync") and hang["frozen"] == ["learner[1]"], hang
    assert "learner[0]" in hang["health"]  # rank 0 answered: busy in the collective, not frozen
    starts = [e["from_step"] for e in events if e["event"] == "start"]
    assert starts[0] == 0 and len(starts) == 2 and starts[1] in (1, 2), events  # from its newest checkpoint
    assert all(proc_state(pid) in (None, "Z") for pid in runs["frozen"])  # killed with the trial's actors
    assert [r["step"] for r in runs["stopped"]] == [0, 1, 2]
    assert [stable(r) for r in runs["plain"]] == [stable(r) for r in runs["stopped"]]


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

    from orchestrator.actors.models import resolve_model
    from orchestrator.cli import main
    from orchestrator.storage import filesystem
    from orchestrator.trial.artifacts.restore import verified_checkpoint
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
