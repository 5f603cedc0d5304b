"""Step time of a trial from its token counts when no pilot campaign was measured: generate / score / train.

time = generated tokens x 2P / generate rate + scored tokens x sP / score rate + trained tokens x tP / train rate
(P: the model's parameters; 2P FLOPs a token forward), each rate in FLOP/s for the trial's GPUs of that role.
The learner's factors s and t count its passes (`learner_flops`):
- scoring (no grad): the policy 2P, the KL reference 2P (KL on or measured), the critic 2P (GAE);
- training, per PPO epoch: a model whose weights train 6P (forward 2P, activation gradients 2P, weight gradients
  2P); one whose base is frozen 4P (LoRA: the adapter's own gradients are negligible), for the policy and for the
  critic (a LoRA critic's base is frozen in its passes under either mode); gradient checkpointing adds a
  recomputed forward, 2P per trained model. The rates are effective FLOP/s per device: a device's dense bf16 peak times the
fraction a workload of that kind reaches (decode-heavy generation far less than training). They are stated
assumptions, not a fit to this project's runs: `plan --pilot DIR` replaces the whole model by the pilot's
measured `time/*` per step, and the plan says which of the two it used; `plan --calibration FILE`
(orchestrator/config/calibration.py) replaces the assumed rates by measured ones: generation at the engine's
measured decode throughput for the sequences one engine holds a step, every learner token at the measured
learner rate, and a LoRA step's adapter export + load (`sync`), the start-up by the measured one.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from orchestrator.config.trial import TrialConfig

if TYPE_CHECKING:
    from orchestrator.config.calibration import Calibration

# dense bf16 peak FLOP/s (vendor spec sheets) and the assumed share of it each kind of work reaches
PEAK = {"H100": 989e12, "H200": 989e12, "A100": 312e12, "L40S": 362e12, "cpu": 1e12}
EFFICIENCY = {"generate": 0.05, "score": 0.35, "train": 0.30}
TINY_PARAMS = {"tiny": 0.55e6, "tiny-reasoner": 2.0e6, "tiny-agent": 2.0e6}  # built in workers/models/loading.py


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
    """Tokens one step moves (upper bounds: every generation at max_tokens, unless measured lengths were given)."""

    generations: int
    generated: float  # tokens sampled by the rollout workers
    scored: float  # tokens the learner runs forward only (old / reference log-probs)
    trained: float  # tokens the policy's update runs forward + backward (x PPO epochs; the critic's in learner_flops)
    eval_generated: float  # eval tokens per step, averaged over the trial


def step_tokens(cfg: TrialConfig, prompt_tokens: float = 256, completion_tokens: float | None = None) -> StepTokens:
    """Token counts of one step; `prompt_tokens` is an assumed prompt length (a pilot or a calibration measures
    it), `completion_tokens` a measured mean completion length (None: every completion at max_tokens)."""
    r = cfg.rollout
    gens = r.prompts_per_step * r.n
    turns = r.max_turns if cfg.task.agentic else 1
    completion = r.max_tokens if completion_tokens is None else min(completion_tokens, r.max_tokens)
    gen = gens * completion * turns
    seq = gens * (prompt_tokens * turns + completion * turns)
    epochs = cfg.learner.optim.ppo_epochs
    scored = seq if cfg.learner.old_logprobs != "rollout" else 0
    evals = 0.0
    if cfg.eval.every:
        looks = len(range(0, cfg.steps, cfg.eval.every)) + (1 if (cfg.steps - 1) % cfg.eval.every else 0)
        evals = looks * cfg.eval.problems * cfg.eval.n * completion * turns / cfg.steps
    return StepTokens(gens, gen, scored, seq * epochs, evals)


def learner_flops(cfg: TrialConfig) -> tuple[float, float]:
    """(scoring, training) FLOPs per token in units of P, from the learner's passes (module docstring)."""
    lrn, iv = cfg.learner, cfg.interventions
    critic = cfg.credit.uses_critic
    score = 2.0 + (2.0 if iv.kl.is_active or iv.kl.measure else 0.0) + (2.0 if critic else 0.0)
    recompute = 2.0 if lrn.gradient_checkpointing else 0.0
    train = (6.0 if lrn.mode == "full" else 4.0) + recompute
    if critic:
        train += (6.0 if lrn.critic.model == "full" else 4.0) + recompute
    return score, train


def device_kind(name: str | None) -> str:
    if not name:
        return "H100"
    key = next((k for k in PEAK if k.lower() in name.lower()), None)
    return key or "H100"


def step_seconds(cfg: TrialConfig, device: str = "H100", cal: Calibration | None = None) -> dict[str, float] | None:
    """Estimated seconds per step by part (generate, score, train; with a calibration `cal` also sync, a LoRA
    step's adapter export + load, and other, the rest of a step's measured wall), or None when the model size is
    unknown. With `cal`, a trial of the model and task it measured takes its measured lengths."""
    if cal is not None:
        tok = step_tokens(cfg, **cal.lengths(cfg.model.name, cfg.task.name))
        engines, ranks = cfg.rollout.num_workers, cfg.resources.learner_ranks
        per_engine = cfg.rollout.prompts_per_step * cfg.rollout.n / engines  # sequences one engine decodes at once
        return {"generate": (tok.generated + tok.eval_generated) / (cal.decode_rate(per_engine) * engines),
                "score": tok.scored / cal.learner_tokens_per_s / ranks,
                "train": tok.trained / cal.learner_tokens_per_s / ranks,
                "sync": cal.adapter_export_s + cal.adapter_load_s if cfg.learner.mode == "lora" else 0.0,
                "other": cal.step_overhead_s}
    p = model_params(cfg.model.name)
    if p is None:
        return None
    tok = step_tokens(cfg)
    peak = PEAK[device]
    gen_devices = max(cfg.resources.worker_gpus, 1.0) * cfg.rollout.num_workers
    learn_devices = max(cfg.resources.learner_gpus, 1.0) * cfg.resources.learner_ranks  # the group's devices
    score_f, train_f = learner_flops(cfg)
    gen = (tok.generated + tok.eval_generated) * 2 * p / (peak * EFFICIENCY["generate"] * gen_devices)
    score = tok.scored * score_f * p / (peak * EFFICIENCY["score"] * learn_devices)
    train = tok.trained * train_f * p / (peak * EFFICIENCY["train"] * learn_devices)
    return {"generate": gen, "score": score, "train": train}


def step_wall(cfg: TrialConfig, device: str = "H100", cal: Calibration | None = None) -> float | None:
    """Seconds per step from `step_seconds`'s parts: their sum, or when generation runs ahead of the learner
    (one_step_off, async with max_staleness > 0: orchestrator/trial/step/sequence.py) the next step's generation
    overlapped with this step's scoring and training, max(generate, score + train), plus the evaluation's
    generation, which runs before the step and overlaps nothing. At steady state one batch is sampled per step
    whatever k >= 1, so the model is the same for every k >= 1. A calibration's other work (grading, collating,
    the calls) is the driver's, after both: added. None when the model size is unknown."""
    parts = step_seconds(cfg, device, cal)
    if parts is None:
        return None
    if cfg.rollout.staleness_bound == 0:
        return sum(parts.values())
    tok = step_tokens(cfg, **(cal.lengths(cfg.model.name, cfg.task.name) if cal is not None else {}))
    evaluate = parts["generate"] * tok.eval_generated / max(tok.generated + tok.eval_generated, 1)
    learn = parts["score"] + parts["train"] + parts.get("sync", 0.0)
    return evaluate + max(parts["generate"] - evaluate, learn) + parts.get("other", 0.0)


# What a trial spends besides its steps, when no pilot measured it. Assumptions, not measurements: start-up is
# the engines' build (CUDA graphs on a GPU) and the learner's model load; a checkpoint writes the learner's state;
# a full-mode sync moves the bf16 weights through the object store; a colocated engine's sleep + wake moves its
# bf16 weights to host memory and back (level 1) or only reallocates (level 2, the sync rewrites them). The CPU
# start-up is of the order `make demo` shows on 2 cores (about 40 s of its 72-86 s trials outside the steps).
STARTUP_S = {"gpu": 90.0, "cpu": 40.0}
LOAD_BYTES_PER_S = 1e9  # weights read from disk / hub cache at start-up
CHECKPOINT_BYTES_PER_S = 0.5e9  # learner state to the storage path
CHECKPOINT_FIXED_S = 2.0  # Tune's checkpoint bookkeeping and the manifest
SYNC_BYTES_PER_S = 2e9  # full weights through the object store
HOST_COPY_BYTES_PER_S = 10e9  # pinned device <-> host copy of a sleeping engine's weights
SLEEP_WAKE_FIXED_S = 1.0  # allocator and scheduler round trips of one sleep + wake


def overhead_seconds(cfg: TrialConfig, device: str = "H100", cal: Calibration | None = None) -> dict[str, float]:
    """Modelled seconds of one trial outside its steps' generate / score / train, by part: start-up,
    checkpoints, weight syncs, (colocated) sleep + wake, and learner.offload_between_steps' copies (no-ops on a
    CPU). Evaluation's generation is in `step_seconds`; `cal`: the measured start-up replaces the modelled one."""
    p = model_params(cfg.model.name) or 0.0
    gpu = device != "cpu"
    full = cfg.learner.mode == "full"
    state = 12 * p * (1.0 if full else 0.01)  # fp32 weights + Adam's two moments; LoRA: about 1% of P trains
    checkpoints = -(-cfg.steps // cfg.checkpoint.every)
    out = {
        "startup": cal.startup_s if cal is not None else STARTUP_S["gpu" if gpu else "cpu"] + 2 * p / LOAD_BYTES_PER_S,
        "checkpoints": checkpoints * (CHECKPOINT_FIXED_S + state / CHECKPOINT_BYTES_PER_S),
        "sync": cfg.steps * (2 * p / SYNC_BYTES_PER_S if full else 0.0),
    }
    if cfg.resources.placement == "colocated":
        moved = 0.0 if full else 2 * 2 * p / HOST_COPY_BYTES_PER_S  # level 1: out and back
        out["sleep_wake"] = cfg.steps * (SLEEP_WAKE_FIXED_S + moved)
    if cfg.learner.offload_between_steps and gpu:  # Adam's moments (+ the fp32 policy) out and back, per rank
        kept = 8 * p * (1.0 if full else 0.01) + (4 * p if full else 0.0)
        out["offload"] = cfg.steps * 2 * kept / cfg.resources.learner_ranks / HOST_COPY_BYTES_PER_S
    return out
