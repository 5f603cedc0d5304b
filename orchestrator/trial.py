"""One trial's step loop, as a Ray Tune function trainable. Owns no math.

Per step: prompts -> generate (k rollout workers) -> score -> drop uninformative groups -> learner.train_step
-> export adapter -> load it on every worker -> report. The SEPA controller runs here: lambda for step t is
read before the step, and the step's correct rate / execution uncertainty are observed after it.
Everything needed to continue sits in the checkpoint: learner state (adapter, optimizer, scheduler, RNG),
SEPA controller, task cursor, adapter version and step.
"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path

import ray
from ray import tune
from ray.util import get_current_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from orchestrator.config import ModelConfig, TrialConfig
from workers.credit import SepaConfig, SepaController
from workers.learner import Learner
from workers.models import build_tiny_model, load_tokenizer
from workers.rollout import RolloutWorker, shard
from workers.tasks import make_task

STATE_FILE, LEARNER_FILE, METRICS_FILE = "trial_state.json", "learner.pt", "metrics.jsonl"


def resolve_model(cfg: ModelConfig) -> str:
    """Hub name / local path as given; 'tiny' is built locally (deterministically) on whichever node asks."""
    if cfg.name != "tiny":
        return cfg.name
    root = Path(tempfile.gettempdir()) / f"credit-orchestrator-tiny-{cfg.tiny_seed}"
    return str(build_tiny_model(root, seed=cfg.tiny_seed))


@ray.remote
class _RolloutActor(RolloutWorker):
    def __init__(self, model_cfg: dict, **kw):
        super().__init__(resolve_model(ModelConfig(**model_cfg)), **kw)


@ray.remote
class _LearnerActor(Learner):
    def __init__(self, model_cfg: dict, **kw):
        super().__init__(resolve_model(ModelConfig(**model_cfg)), **kw)


def step_seed(seed: int, step: int, shard_idx: int) -> int:
    """Sampling seed of one shard at one step: a pure function of (seed, step, shard), so resumes replay."""
    return (seed * 1_000_003 + step * 9_973 + shard_idx * 101) % (2**31 - 1)


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


def _load_metrics(path: Path, before_step: int) -> None:
    """Keep only rows of steps < before_step (a restored trial re-runs the later ones)."""
    if not path.exists():
        return
    rows = [ln for ln in path.read_text().splitlines() if ln.strip() and json.loads(ln)["step"] < before_step]
    path.write_text("".join(r + "\n" for r in rows))


def run_trial(config: dict) -> None:
    """Tune function trainable: runs `config` (a TrialConfig as a dict) to its last step."""
    cfg = TrialConfig.model_validate(config)
    out_dir = Path(cfg.output_dir or tempfile.mkdtemp(prefix=f"trial-{cfg.name}-"))
    out_dir.mkdir(parents=True, exist_ok=True)
    metrics_path = out_dir / METRICS_FILE
    pg = get_current_placement_group()
    k = cfg.rollout.num_workers
    model_cfg = cfg.model.model_dump()
    dtype = "float32" if cfg.model.dtype == "auto" and cfg.resources.worker_gpus == 0 else (
        "bfloat16" if cfg.model.dtype == "auto" else cfg.model.dtype)
    workers = [
        _RolloutActor.options(num_cpus=cfg.resources.worker_cpus, num_gpus=cfg.resources.worker_gpus,
                              **_placement(pg, 1 + i)).remote(
            model_cfg, dtype=dtype, seed=cfg.seed, max_model_len=cfg.model.max_model_len,
            max_lora_rank=cfg.learner.lora.rank)
        for i in range(k)
    ]
    learner = _LearnerActor.options(num_cpus=cfg.resources.learner_cpus, num_gpus=cfg.resources.learner_gpus,
                                    **_placement(pg, 1 + k)).remote(
        model_cfg, learner=cfg.learner.model_dump(), credit=cfg.credit.model_dump(), seed=cfg.seed,
        total_steps=cfg.steps, dtype=cfg.model.dtype)
    tokenizer = load_tokenizer(resolve_model(cfg.model))
    task = make_task(cfg.task, cfg.seed)
    sepa = SepaController(cfg.credit.sepa or SepaConfig(steps=0))
    start, version = 0, 0

    ckpt = tune.get_checkpoint()
    if ckpt is not None:
        with ckpt.as_directory() as d:
            state = json.loads((Path(d) / STATE_FILE).read_text())
            ray.get(learner.load_state_dict.remote((Path(d) / LEARNER_FILE).read_bytes()))
        task.load_state_dict(state["task"])
        sepa.load_state_dict(state["sepa"])
        start, version = state["step"] + 1, state["adapter_version"]
        if version:
            files = ray.get(learner.export_adapter.remote(version))
            ray.get([w.load_adapter.remote(files, version) for w in workers])
    _load_metrics(metrics_path, start)
    ray.get([w.ready.remote() for w in workers] + [learner.ready.remote()])

    for step in range(start, cfg.steps):
        row = _one_step(cfg, step, workers, learner, tokenizer, task, sepa, version)
        version = int(row.pop("_version"))
        with metrics_path.open("a") as f:
            f.write(json.dumps(row) + "\n")
        print(f"[{cfg.name}] step {step + 1}/{cfg.steps} correct {row['train/correct_rate']:.3f} "
              f"reward {row['train/reward_mean']:.3f} lambda {row['credit/sepa_lambda']:.3f} "
              f"gen {row['time/generate_s']:.1f}s train {row['time/train_s']:.1f}s", flush=True)
        if (step + 1) % cfg.checkpoint.every == 0 or step + 1 == cfg.steps:
            with tempfile.TemporaryDirectory() as d:
                (Path(d) / LEARNER_FILE).write_bytes(ray.get(learner.state_dict.remote()))
                (Path(d) / STATE_FILE).write_text(json.dumps({
                    "step": step, "adapter_version": version, "task": task.state_dict(),
                    "sepa": sepa.state_dict(), "config": cfg.model_dump(),
                }))
                tune.report(row, checkpoint=tune.Checkpoint.from_directory(d))
        else:
            tune.report(row)
    task.close()


def _one_step(cfg: TrialConfig, step: int, workers, learner, tokenizer, task, sepa: SepaController,
              version: int) -> dict:
    ro = cfg.rollout
    problems = task.next_batch(ro.prompts_per_step)
    prompt_ids = [tokenizer(p.prompt)["input_ids"] for p in problems]
    t0 = time.perf_counter()
    parts = shard(list(range(len(problems))), len(workers))
    futures = [
        w.generate.remote([prompt_ids[i] for i in idx], n=ro.n, temperature=ro.temperature, top_p=ro.top_p,
                          max_tokens=ro.max_tokens, seed=step_seed(cfg.seed, step, j),
                          stop_token_ids=[tokenizer.eos_token_id])
        for j, (w, idx) in enumerate(zip(workers, parts, strict=True)) if idx
    ]
    results = ray.get(futures)
    t_gen = time.perf_counter() - t0
    expected = version or None
    for res in results:
        if res["adapter_version"] != expected:
            raise RuntimeError(f"a rollout worker sampled with adapter {res['adapter_version']}, expected {expected}")
    groups = [g for res in results for g in res["completions"]]
    n_tokens = sum(res["num_tokens"] for res in results)

    t0 = time.perf_counter()
    rewards, texts = [], []
    grader_errors = grader_timeouts = 0
    for prob, group in zip(problems, groups, strict=True):
        comp_texts = [tokenizer.decode(c["token_ids"], skip_special_tokens=True) for c in group]
        scored = task.score([prob] * len(group), comp_texts)
        rewards.append(scored.rewards)
        grader_errors += scored.grader_errors
        grader_timeouts += scored.grader_timeouts
        texts.append(comp_texts)
    t_score = time.perf_counter() - t0
    flat = [r for g in rewards for r in g]
    correct_rate = sum(r > 0.5 for r in flat) / len(flat)
    keep = [i for i, g in enumerate(rewards) if not (ro.skip_uninformative and len(set(g)) == 1)]

    lam = sepa.lambda_for(step)
    row: dict = {
        "step": step,
        "train/correct_rate": correct_rate,
        "train/reward_mean": sum(flat) / len(flat),
        "train/groups_kept": len(keep),
        "train/groups_skipped_all_correct": sum(1 for g in rewards if len(set(g)) == 1 and g[0] > 0.5),
        "train/groups_skipped_all_wrong": sum(1 for g in rewards if len(set(g)) == 1 and g[0] <= 0.5),
        "train/grader_errors": grader_errors,
        "train/grader_timeouts": grader_timeouts,
        "train/completion_len": n_tokens / len(flat),
        "rollout/tokens_per_s": n_tokens / max(t_gen, 1e-9),
        "rollout/adapter_version": version,
        "credit/sepa_lambda": lam,
        "credit/sepa_gate_open": float(sepa.gate_open),
        "time/generate_s": t_gen,
        "time/score_s": t_score,
    }
    t0 = time.perf_counter()
    exec_values = None
    if keep:
        batch = {
            "prompt_ids": [prompt_ids[i] for i in keep for _ in groups[i]],
            "completion_ids": [c["token_ids"] for i in keep for c in groups[i]],
            "rollout_logprobs": [c["logprobs"] for i in keep for c in groups[i]],
            "rewards": [rewards[i] for i in keep],
            "temperature": ro.temperature, "sepa_lambda": lam, "step": step,
        }
        out = ray.get(learner.train_step.remote(batch))
        row.update(out["metrics"])
        exec_values = out["exec_values"]
    row["time/train_s"] = time.perf_counter() - t0
    sepa.observe(correct_rate, exec_values)

    t0 = time.perf_counter()
    if keep:  # a new policy only when the learner stepped
        version += 1
        files = ray.get(learner.export_adapter.remote(version))
        ray.get([w.load_adapter.remote(files, version) for w in workers])
    row["time/sync_s"] = time.perf_counter() - t0
    row["_version"] = version
    return row
