"""Step time of a trial from its token counts when no pilot campaign was measured: generate / score / train.

time = generated tokens x 2P / generate rate + scored tokens x 2P / score rate + trained tokens x 6P / train rate
(P: the model's parameters; 2P FLOPs a token forward, 6P forward + backward), each rate in FLOP/s for the
trial's GPUs of that role. The rates are effective FLOP/s per device: a device's dense bf16 peak times the
fraction a workload of that kind reaches (decode-heavy generation far less than training). They are stated
assumptions, not a fit to this project's runs: `plan --pilot DIR` replaces the whole model by the pilot's
measured `time/*` per step, and the plan says which of the two it used.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from orchestrator.config import TrialConfig

# dense bf16 peak FLOP/s (vendor spec sheets) and the assumed share of it each kind of work reaches
PEAK = {"H100": 989e12, "H200": 989e12, "A100": 312e12, "L40S": 362e12, "cpu": 1e12}
EFFICIENCY = {"generate": 0.05, "score": 0.35, "train": 0.30}
TINY_PARAMS = {"tiny": 0.55e6, "tiny-reasoner": 2.0e6, "tiny-agent": 2.0e6}  # built in workers/models.py


def model_params(name: str) -> float | None:
    """Parameters from the model name ('Qwen3-4B' -> 4e9, '0.5B', '350M'), the tiny test models by table;
    None when the name does not say."""
    if name in TINY_PARAMS:
        return TINY_PARAMS[name]
    m = re.search(r"(\d+(?:\.\d+)?)\s*([BbMm])(?![a-zA-Z])", name.rsplit("/", 1)[-1])
    if not m:
        return None
    return float(m.group(1)) * (1e9 if m.group(2) in "Bb" else 1e6)


@dataclass(frozen=True)
class StepTokens:
    """Tokens one step moves (upper bounds: every generation at max_tokens)."""

    generations: int
    generated: int  # tokens sampled by the rollout workers
    scored: int  # tokens the learner runs forward only (old / reference log-probs)
    trained: int  # tokens the learner runs forward + backward (x optimizer epochs)
    eval_generated: float  # eval tokens per step, averaged over the trial


def step_tokens(cfg: TrialConfig, prompt_tokens: int = 256) -> StepTokens:
    """Token counts of one step; `prompt_tokens` is an assumed prompt length (a pilot measures it)."""
    r = cfg.rollout
    gens = r.prompts_per_step * r.n
    turns = r.max_turns if cfg.task.agentic else 1
    gen = gens * r.max_tokens * turns
    seq = gens * (prompt_tokens * turns + r.max_tokens * turns)
    epochs = cfg.learner.optim.ppo_epochs * (2 if cfg.credit.advantage_mode == "gae" else 1)  # + the critic
    scored = seq if cfg.learner.old_logprobs != "rollout" else 0
    evals = 0.0
    if cfg.eval.every:
        looks = len(range(0, cfg.steps, cfg.eval.every)) + (1 if (cfg.steps - 1) % cfg.eval.every else 0)
        evals = looks * cfg.eval.problems * cfg.eval.n * r.max_tokens * turns / cfg.steps
    return StepTokens(gens, gen, scored, seq * epochs, evals)


def device_kind(name: str | None) -> str:
    if not name:
        return "H100"
    key = next((k for k in PEAK if k.lower() in name.lower()), None)
    return key or "H100"


def step_seconds(cfg: TrialConfig, device: str = "H100") -> dict[str, float] | None:
    """Estimated seconds per step by part (generate, score, train), or None when the model size is unknown."""
    p = model_params(cfg.model.name)
    if p is None:
        return None
    tok = step_tokens(cfg)
    peak = PEAK[device]
    gen_devices = max(cfg.resources.worker_gpus, 1.0) * cfg.rollout.num_workers
    learn_devices = max(cfg.resources.learner_gpus, 1.0) * cfg.resources.learner_ranks  # the group's devices
    gen = (tok.generated + tok.eval_generated) * 2 * p / (peak * EFFICIENCY["generate"] * gen_devices)
    score = tok.scored * 2 * p / (peak * EFFICIENCY["score"] * learn_devices)
    train = tok.trained * 6 * p / (peak * EFFICIENCY["train"] * learn_devices)
    return {"generate": gen, "score": score, "train": train}
