"""One trial's step loop, as a Ray Tune function trainable. Owns no math.

Per step: prompts -> generate (k rollout workers) -> score -> drop uninformative groups -> learner.train_step
-> export adapter -> load it on every worker -> report. The SEPA controller runs here: lambda for step t is
read before the step, and the step's correct rate / execution uncertainty are observed after it.
Everything needed to continue sits in the checkpoint: learner state (adapter, optimizer, scheduler, RNG),
SEPA controller, task cursor, adapter version and step.
"""

from __future__ import annotations

import json
import math
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import ray
import torch
from ray import tune
from ray.util import get_current_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from orchestrator import storage as store
from orchestrator.config import ModelConfig, TrialConfig
from orchestrator.episodes import episode_metrics, play_episodes
from orchestrator.evaluation import evaluate
from orchestrator.sampling import action_ids, sample, step_seed
from orchestrator.tracking import TrialTracker
from workers.credit import SepaConfig, SepaController
from workers.envs.tiny_agent import build_tiny_agent
from workers.filters import nonfinite_groups, rv_filter
from workers.learner import Learner
from workers.models import build_tiny_model, load_tokenizer
from workers.reasoner import build_tiny_reasoner
from workers.rollout import RolloutWorker
from workers.tasks import make_task

STATE_FILE, LEARNER_FILE, METRICS_FILE = "trial_state.json", "learner.pt", "metrics.jsonl"
EVENTS_FILE, PLACEMENT_FILE = "events.jsonl", "placement.json"


# models built locally (deterministic, cached under the temp dir by name and seed) instead of loaded by name
LOCAL_MODELS = {"tiny": build_tiny_model, "tiny-agent": build_tiny_agent, "tiny-reasoner": build_tiny_reasoner}


def resolve_model(cfg: ModelConfig) -> str:
    """Hub name / local path as given; a LOCAL_MODELS name is built (once) on whichever node asks."""
    builder = LOCAL_MODELS.get(cfg.name)
    if builder is None:
        return cfg.name
    root = Path(tempfile.gettempdir()) / f"credit-orchestrator-{cfg.name}-{cfg.tiny_seed}"
    return str(builder(root, seed=cfg.tiny_seed))


def _where() -> dict:
    ctx = ray.get_runtime_context()
    return {"placement_group": ctx.get_placement_group_id(), "gpu_ids": [str(g) for g in ray.get_gpu_ids()]}


def _engine_dtype(dtype: str) -> str:
    """'auto' is decided where the engine runs: bf16 on a real GPU, fp32 on CPU (logical GPUs included)."""
    if dtype != "auto":
        return dtype
    return "bfloat16" if torch.cuda.is_available() else "float32"


@ray.remote
class _RolloutActor(RolloutWorker):
    def __init__(self, model_cfg: dict, dtype: str, **kw):
        super().__init__(resolve_model(ModelConfig(**model_cfg)), dtype=_engine_dtype(dtype), **kw)

    def placement(self) -> dict:
        return _where()


@ray.remote
class _LearnerActor(Learner):
    def __init__(self, model_cfg: dict, **kw):
        super().__init__(resolve_model(ModelConfig(**model_cfg)), **kw)

    def placement(self) -> dict:
        return _where()


def sepa_settings(cfg: TrialConfig) -> SepaConfig:
    """The schedule that drives lambda: the trial's `sepa:` where SEPA (or a plugin transform) runs, else off,
    so conditions without SEPA log lambda 0 even when a shared base carries SEPA settings."""
    c = cfg.credit
    uses = "sepa" in c.stages or (isinstance(c.transform_mode, str) and "." in c.transform_mode)
    return c.sepa if (c.sepa is not None and uses) else SepaConfig(steps=0)


def _placement(pg, bundle: int) -> dict:
    if pg is None:
        return {}
    return {"scheduling_strategy": PlacementGroupSchedulingStrategy(placement_group=pg, placement_group_bundle_index=bundle)}


def bundles(cfg: TrialConfig) -> list[dict[str, float]]:
    """Placement-group bundles: [driver, worker x k, learner]."""
    r = cfg.resources

    def b(cpu: float, gpu: float) -> dict[str, float]:
        return {"CPU": cpu, **({"GPU": gpu} if gpu else {})}

    return [b(r.driver_cpus, 0)] + [b(r.worker_cpus, r.worker_gpus)] * cfg.rollout.num_workers + [
        b(r.learner_cpus, r.learner_gpus)
    ]


def _placement_record(pg, workers, learner) -> dict:
    """Where the trial's actors run: their placement group and GPU ids (checked by tests, handy on a cluster)."""
    ctx = ray.get_runtime_context()
    return {
        "placement_group": pg.id.hex() if pg is not None else None,
        "driver": _where(),
        "workers": ray.get([w.placement.remote() for w in workers]),
        "learner": ray.get(learner.placement.remote()),
        "node_id": ctx.get_node_id(),
    }


def run_trial(config: dict) -> None:
    """Tune function trainable: runs `config` (a TrialConfig as a dict) to its last step.

    Writes `metrics.jsonl` (whole, after every step: a restore rewinds it to the checkpoint, so the file never
    has gaps or repeats), `events.jsonl` and `placement.json` to `output_dir` (a path or URI).
    """
    cfg = TrialConfig.model_validate(config)
    out_dir = cfg.output_dir or tempfile.mkdtemp(prefix=f"trial-{cfg.name}-")
    metrics_loc = store.join(out_dir, METRICS_FILE)
    start, version, state, rows, pending = 0, 0, None, [], None
    from orchestrator.pipeline import OneStepOff, load_pending
    ckpt = tune.get_checkpoint()
    if ckpt is not None:
        # verified (weights-only learner state, manifest checksums); a damaged newest checkpoint falls back to
        # an older kept one, recorded in events.jsonl; none usable, or a crafted one: one line naming the file
        restored = store.restore_checkpoint(ckpt, events=store.join(out_dir, EVENTS_FILE), state_file=STATE_FILE,
                                            learner_file=LEARNER_FILE, metrics_file=METRICS_FILE)
        state, learner_blob, rows = restored.state, restored.learner, restored.rows
        if cfg.rollout.mode == "one_step_off":
            with restored.checkpoint.as_directory() as d:
                pending = load_pending(d)  # orchestrator/pipeline.py
        start, version = state["step"] + 1, state["adapter_version"]
    store.append_line(store.join(out_dir, EVENTS_FILE), {"event": "start", "from_step": start, "time": time.time()})
    store.write_text(metrics_loc, "".join(json.dumps(r) + "\n" for r in rows))
    if start >= cfg.steps:
        return  # restored from the final checkpoint: nothing left to run

    pg = get_current_placement_group()
    k = cfg.rollout.num_workers
    model_cfg = cfg.model.model_dump()
    workers = [
        _RolloutActor.options(num_cpus=cfg.resources.worker_cpus, num_gpus=cfg.resources.worker_gpus,
                              **_placement(pg, 1 + i)).remote(
            model_cfg, dtype=cfg.model.dtype, seed=cfg.seed, max_model_len=cfg.model.max_model_len,
            max_lora_rank=cfg.learner.lora.rank, engine=cfg.rollout.engine.model_dump())
        for i in range(k)
    ]
    learner = _LearnerActor.options(num_cpus=cfg.resources.learner_cpus, num_gpus=cfg.resources.learner_gpus,
                                    **_placement(pg, 1 + k)).remote(
        model_cfg, learner=cfg.learner.model_dump(), credit=cfg.credit.model_dump(), seed=cfg.seed,
        total_steps=cfg.steps, dtype=cfg.model.dtype, interventions=cfg.interventions.model_dump())
    tokenizer = load_tokenizer(resolve_model(cfg.model))
    task = make_task(cfg.task, cfg.seed)
    sepa = SepaController(sepa_settings(cfg))
    if state is not None:
        ray.get(learner.load_state_dict.remote(learner_blob))
        task.load_state_dict(state["task"])
        sepa.load_state_dict(state["sepa"])
        if version:
            files = ray.get(learner.export_adapter.remote(version))
            ray.get([w.load_adapter.remote(files, version) for w in workers])
    ray.get([w.ready.remote() for w in workers] + [learner.ready.remote()])
    store.write_text(store.join(out_dir, PLACEMENT_FILE), json.dumps(_placement_record(pg, workers, learner)))
    tracker = TrialTracker(cfg)
    for row in rows:  # steps before the checkpoint that no earlier attempt got written (killed writer)
        tracker.log(row)

    actions = action_ids(cfg, task, tokenizer)
    pipe = OneStepOff(cfg, workers, learner, tokenizer, task, actions, pending) \
        if cfg.rollout.mode == "one_step_off" else None
    for step in range(start, cfg.steps):
        row = {}
        if cfg.eval.every and (step % cfg.eval.every == 0 or step == cfg.steps - 1):
            row.update(evaluate(cfg, step, workers, tokenizer, task, actions))
        if pipe is not None:  # generates step + 1 while the learner trains on step
            row = {**pipe.step(step, sepa, version), **row}
        else:
            row = {**_one_step(cfg, step, workers, learner, tokenizer, task, sepa, version, actions), **row}
        version = int(row.pop("_version"))
        samples = row.pop("_uncertainty", None)
        if samples is not None:
            write_uncertainty(out_dir, step, samples)
        rows.append(row)
        store.write_text(metrics_loc, "".join(json.dumps(r) + "\n" for r in rows))
        tracker.log(row)
        print(f"[{cfg.name}] step {step + 1}/{cfg.steps} correct {row['train/correct_rate']:.3f} "
              f"reward {row['train/reward_mean']:.3f} lambda {row['credit/sepa_lambda']:.3f} "
              f"gen {row['time/generate_s']:.1f}s train {row['time/train_s']:.1f}s", flush=True)
        if (step + 1) % cfg.checkpoint.every == 0 or step + 1 == cfg.steps:
            with tempfile.TemporaryDirectory() as d:
                (Path(d) / LEARNER_FILE).write_bytes(ray.get(learner.state_dict.remote()))
                (Path(d) / METRICS_FILE).write_text("".join(json.dumps(r) + "\n" for r in rows))
                if pipe is not None:
                    pipe.save(d)  # the prefetched batch of step + 1
                (Path(d) / STATE_FILE).write_text(json.dumps({
                    "step": step, "adapter_version": version, "task": task.state_dict(),
                    "sepa": sepa.state_dict(), "config": cfg.model_dump(mode="json"),
                }))
                store.seal_checkpoint(d)  # sha256 manifest: a torn or damaged checkpoint is detected on restore
                tune.report(row, checkpoint=tune.Checkpoint.from_directory(d))
        else:
            tune.report(row)
    tracker.finish()
    task.close()
    store.append_line(store.join(out_dir, EVENTS_FILE), {"event": "end", "step": cfg.steps - 1, "time": time.time()})


def write_uncertainty(out_dir: str, step: int, samples: dict[str, list[float]]) -> None:
    """Per-token uncertainty before/after the token stages (the report's mechanistic histogram)."""
    import io

    buf = io.BytesIO()
    np.savez_compressed(buf, **{k: np.asarray(v, dtype=np.float32) for k, v in samples.items()})
    store.write_bytes(store.join(out_dir, "uncertainty", f"step_{step}.npz"), buf.getvalue())


@dataclass
class Rollouts:
    """One step's samples in groups (group i shares a prompt or a level). Lists are `[N][G][*]` / `[N][G]`;
    response ids, loss mask and log-probs are aligned (single-turn: the completion, all in the loss mask)."""

    prompt_ids: list[list[list[int]]]
    response_ids: list[list[list[int]]]
    loss_mask: list[list[list[bool]]]
    logprobs: list[list[list[float]]]
    rewards: list[list[float]]
    correct: list[list[bool]]
    num_tokens: int
    versions: set
    metrics: dict
    extra: dict = field(default_factory=dict)  # per-sequence extras for the learner ([N][G][*] lists)


def _collect_single_turn(cfg: TrialConfig, step: int, workers, tokenizer, task, actions) -> Rollouts:
    """Prompts -> one completion per sample -> the task's binary rewards."""
    ro = cfg.rollout
    problems = task.next_batch(ro.prompts_per_step)
    prompt_ids = [tokenizer(p.prompt)["input_ids"] for p in problems]
    results = sample(cfg, workers, prompt_ids, n=ro.n, temperature=ro.temperature,
                     seeds=[step_seed(cfg.seed, step, j) for j in range(len(workers))], tokenizer=tokenizer,
                     actions=actions)
    groups = [g for res in results for g in res["completions"]]
    sampler_floor = [math.exp(lp) for g in groups for c in g for lp in c.get("action_logprobs", {}).values()]
    t0 = time.perf_counter()
    rewards, errors, timeouts = [], 0, 0
    for prob, group in zip(problems, groups, strict=True):
        texts = [tokenizer.decode(c["token_ids"], skip_special_tokens=True) for c in group]
        scored = task.score([prob] * len(group), texts)
        rewards.append(scored.rewards)
        errors, timeouts = errors + scored.grader_errors, timeouts + scored.grader_timeouts
    metrics = {"train/grader_errors": errors, "train/grader_timeouts": timeouts,
               "time/score_s": time.perf_counter() - t0,
               **({"floor/sampler_min_valid_prob": min(sampler_floor)} if sampler_floor else {})}
    return Rollouts(
        prompt_ids=[[p] * len(g) for p, g in zip(prompt_ids, groups, strict=True)],
        response_ids=[[c["token_ids"] for c in g] for g in groups],
        loss_mask=[[[True] * len(c["token_ids"]) for c in g] for g in groups],
        logprobs=[[c["logprobs"] for c in g] for g in groups],
        rewards=rewards, correct=[[r > 0.5 for r in g] for g in rewards],
        num_tokens=sum(res["num_tokens"] for res in results),
        versions={res["adapter_version"] for res in results}, metrics=metrics,
    )


def _collect_episodes(cfg: TrialConfig, step: int, workers, tokenizer, task) -> Rollouts:
    """Levels -> `n` multi-turn episodes per level (a group plays one level) -> episode returns."""
    ro = cfg.rollout
    levels = task.next_levels(ro.prompts_per_step)
    episodes = [task.episode(level, g, ro) for level in levels for g in range(ro.n)]
    trajs, info = play_episodes(cfg, workers, tokenizer, episodes, seed=cfg.seed, step=step,
                                temperature=ro.temperature)
    groups = [trajs[i:i + ro.n] for i in range(0, len(trajs), ro.n)]

    def per_group(fn):
        return [[fn(t) for t in g] for g in groups]

    return Rollouts(
        prompt_ids=per_group(lambda t: t.prompt_ids), response_ids=per_group(lambda t: t.response_ids),
        loss_mask=per_group(lambda t: t.loss_mask), logprobs=per_group(lambda t: t.logprobs),
        rewards=per_group(lambda t: t.episode_return), correct=per_group(lambda t: t.success),
        num_tokens=info["num_tokens"], versions=info["versions"],
        metrics={**episode_metrics(trajs), "env/turns_max": info["turns"]},
        extra={"turn_rewards": per_group(lambda t: t.turn_rewards),
               "reward_positions": per_group(lambda t: t.reward_positions)},
    )


def _collect(cfg: TrialConfig, step: int, workers, tokenizer, task, actions: list[int] | None) -> Rollouts:
    """One step's groups (single-turn or episodes); `time/generate_s` (scoring excluded) in its metrics."""
    t0 = time.perf_counter()
    if cfg.task.agentic:
        roll = _collect_episodes(cfg, step, workers, tokenizer, task)
    else:
        roll = _collect_single_turn(cfg, step, workers, tokenizer, task, actions)
    roll.metrics["time/generate_s"] = time.perf_counter() - t0 - roll.metrics.get("time/score_s", 0.0)
    return roll


def _prepare(cfg: TrialConfig, step: int, roll: Rollouts, sepa: SepaController, version: int,
             actions: list[int] | None) -> tuple[dict, dict | None, float]:
    """Check the adapter `roll` was sampled with (`version`), drop uninformative groups, and build the step's
    row and learner batch (None when no group is kept). Returns (row, batch, correct rate)."""
    ro = cfg.rollout
    expected = version or None
    if roll.versions - {expected}:
        raise RuntimeError(f"a rollout worker sampled with adapter {sorted(roll.versions - {expected}, key=str)}, "
                           f"expected {expected}")
    finite = nonfinite_groups(roll.rewards, roll.logprobs, roll.loss_mask)  # NaN/inf never reach the learner
    rewards = finite.rewards  # a dropped group's rewards count as 0 in the statistics below
    flat = [r for g in rewards for r in g]
    correct_rate = sum(c for g in roll.correct for c in g) / len(flat)
    rv = cfg.interventions.rv_filter
    filtered = rv_filter(torch.tensor(rewards, dtype=torch.float64), rv)  # keeps everything unless enabled
    uniform = [len(set(g)) == 1 and i not in finite.bad for i, g in enumerate(rewards)]
    keep = [i for i in filtered.keep if i not in finite.bad and not (ro.skip_uninformative and uniform[i])]

    lam = sepa.lambda_for(step)
    metrics = dict(roll.metrics)
    t_gen = metrics.pop("time/generate_s")
    row: dict = {
        "step": step,
        "train/correct_rate": correct_rate,
        "train/reward_mean": sum(flat) / len(flat),
        "train/groups_kept": len(keep),
        "train/groups_skipped_all_correct": sum(1 for i, u in enumerate(uniform) if u and all(roll.correct[i])),
        "train/groups_skipped_all_wrong": sum(1 for i, u in enumerate(uniform) if u and not all(roll.correct[i])),
        "train/completion_len": roll.num_tokens / len(flat),
        "rollout/tokens_per_s": roll.num_tokens / max(t_gen, 1e-9),
        "rollout/adapter_version": version,
        "credit/sepa_lambda": lam,
        "credit/sepa_gate_open": float(sepa.gate_open),
        **(filtered.metrics if rv.enabled else {}),
        **finite.metrics,
        **metrics,
        "time/generate_s": t_gen,
    }
    if not keep:
        return row, None, correct_rate

    def rows(groups):
        return [x for i in keep for x in groups[i]]

    batch = {
        "prompt_ids": rows(roll.prompt_ids), "response_ids": rows(roll.response_ids),
        "loss_mask": rows(roll.loss_mask), "rollout_logprobs": rows(roll.logprobs),
        "rewards": [rewards[i] for i in keep], **{k: rows(v) for k, v in roll.extra.items()},
        "temperature": ro.temperature, "sepa_lambda": lam, "step": step,
        "loss_scale": filtered.loss_scale, "action_token_ids": actions,
        "want_uncertainty": "sepa" in cfg.credit.stages,  # the report's mechanistic histogram
    }
    return row, batch, correct_rate


def _absorb(row: dict, out: dict | None, sepa: SepaController, correct_rate: float) -> None:
    """The learner's result into the row (metrics, uncertainty samples); SEPA observes the step."""
    exec_values = None
    if out is not None:
        row.update(out["metrics"])
        exec_values = out["exec_values"]
        row["_uncertainty"] = out["uncertainty"]
    sepa.observe(correct_rate, exec_values)


def _push_adapter(learner, workers, version: int) -> int:
    """Export the learner's adapter as `version` and load it on every worker; returns `version`."""
    files = ray.get(learner.export_adapter.remote(version))
    ray.get([w.load_adapter.remote(files, version) for w in workers])
    return version


def _one_step(cfg: TrialConfig, step: int, workers, learner, tokenizer, task, sepa: SepaController,
              version: int, actions: list[int] | None = None) -> dict:
    """Collect (single-turn or episodes) -> drop uninformative groups -> train -> push the new adapter."""
    roll = _collect(cfg, step, workers, tokenizer, task, actions)
    row, batch, correct_rate = _prepare(cfg, step, roll, sepa, version, actions)
    t0 = time.perf_counter()
    out = ray.get(learner.train_step.remote(batch)) if batch is not None else None
    _absorb(row, out, sepa, correct_rate)
    row["time/train_s"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    if batch is not None:  # a new policy only when the learner stepped
        version = _push_adapter(learner, workers, version + 1)
    row["time/sync_s"] = time.perf_counter() - t0
    row["_version"] = version
    return row
