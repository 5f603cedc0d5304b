"""The campaign's pre-launch memory check, per distinct trial shape: the learner's GPUs
(orchestrator/preflight/learner_memory.py) and the engine's (orchestrator/preflight/engine_memory.py), separate
and, for a LoRA trial, as a shared-base pool's (both modules' `Shared*Memory`), as the lines `plan` and `run`
print, or the one-line refusal (exit 2) of the first shape that cannot fit. A shape's model is its pool's (one pool
per base model: orchestrator/config/pool_key.py), so each pool is checked on its own GPUs."""

from __future__ import annotations

from orchestrator.config.errors import UserError
from orchestrator.preflight.engine_memory import (
    colocated_variant,
    engine_line,
    pool_engine,
    slots_fitting_engine,
)
from orchestrator.preflight.learner_memory import (
    GIB,
    RESERVE,
    check_learner_memory,
    gpu_memory_gib,
    learner_memory,
    model_counts,
    shared_learner,
    slots_fitting_learner,
)


def check_campaign_learners(campaign, local_only: bool = False, resolve=None,
                            shared_slots: int | None = None) -> list[str]:
    """The pre-launch memory check of each distinct trial shape of the campaign (model, learner, resources,
    engine, the critic and KL): per shape the learner's line (`check_learner_memory`), the engine's share per GPU
    (orchestrator/preflight/engine_memory.py), for a separate trial what colocated would need, and for a LoRA
    trial the shared pool's GPUs (`shared_lines`): with the campaign's
    resources.shared_base slots (refused when they do not fit), else with `shared_slots` when given (`plan`'s
    other option, not refused). UserError for the first that cannot fit; shapes whose model config cannot be read
    here are left out. `resolve`: model settings -> the path its config is read from (default: the trial's own
    resolution)."""
    from orchestrator.actors.models import resolve_model_quietly

    resolve = resolve or resolve_model_quietly

    shapes: dict[tuple, list] = {}
    for t in campaign.trials:
        c = t.trial
        key = (c.model.model_dump_json(), c.learner.model_dump_json(), c.resources.model_dump_json(),
               c.rollout.engine.model_dump_json(), c.credit.uses_critic,
               c.interventions.kl.is_active or c.interventions.kl.measure)
        shapes.setdefault(key, []).append(t)
    lines = []
    for trials in shapes.values():
        t = trials[0]
        c, r = t.trial, t.trial.resources
        if r.learner_gpus <= 0 and r.worker_gpus <= 0:
            continue
        path = resolve(c.model)
        counts = model_counts(path, c, local_only)
        if counts is None:
            continue
        name = t.name + (f" (and {len(trials) - 1} more trial(s) of this shape)" if len(trials) > 1 else "")
        line = check_learner_memory(c, path, campaign.source, name, local_only)
        block = [line] if line is not None else []
        have = gpu_memory_gib(c)
        if have is not None and (r.worker_gpus > 0 or r.placement == "colocated"):
            block.append("  " + engine_line(c, counts, have, campaign.source))
            if r.placement == "separate" and r.learner_gpus > 0 and r.shared_base is None:
                block.append("  " + colocated_variant(c, learner_memory(c, counts), have))
            slots = r.shared_base.slots if r.shared_base is not None else shared_slots
            if slots and c.learner.mode == "lora" and r.learner_gpus > 0 and r.worker_gpus > 0:
                block += ["  " + x for x in shared_lines(c, counts, have, slots, campaign.source,
                                                          refuse=r.shared_base is not None)]
        lines += block
    return lines


def pool_kv_tokens(cfg, slots: int, resolve=None) -> int | None:
    """Tokens the KV caches of the pool's engines hold together (None: the model's config is not on this machine,
    or the GPU's memory is not named)."""
    from orchestrator.actors.models import resolve_model_quietly

    have = gpu_memory_gib(cfg)
    counts = model_counts((resolve or resolve_model_quietly)(cfg.model), cfg, local_only=True) if have else None
    if counts is None:
        return None
    return pool_engine(cfg, counts, have, slots).kv_tokens * cfg.rollout.num_workers


def shared_lines(cfg, counts, have_gib: float, slots: int, source: str, refuse: bool) -> list[str]:
    """The pool's learner and engine GPU for `slots` trials of this shape as lines, with the most slots each GPU
    holds; `refuse` (the campaign sets resources.shared_base): UserError (one line) when `slots` do not fit."""
    usable = have_gib * (1 - RESERVE) * GIB
    mem = learner_memory(cfg, counts, 1)
    sb = cfg.resources.shared_base
    learners = sb.learners if sb is not None and sb.shape is None else 1  # auto: pool_shape.py respects the memory
    per = -(-slots // learners)  # slot s trains on learner s mod learners
    lrn = shared_learner(mem, per)
    eng = pool_engine(cfg, counts, have_gib, slots)
    adapter = eng.adapters / max(slots, 1)
    per_token = counts.kv_per_token / cfg.rollout.engine.tensor_parallel_size
    most_l = slots_fitting_learner(mem, usable)
    most_e = slots_fitting_engine(eng.share, eng.weights, adapter, per_token, cfg.model.max_model_len)
    if refuse and sb is not None and sb.shape == "auto":
        refuse = slots > most_e  # the learners auto chooses hold what they are given
    if refuse and (per > most_l or slots > most_e):
        if per > most_l and learners > 1:
            raise UserError(f"{source}: resources.shared_base.learners: {slots} slots on {learners} learners put "
                            f"{per} on a {have_gib:.0f} GiB learner GPU: it needs {lrn.describe()} of "
                            f"{usable / GIB:.1f} usable; at most {most_l} slot(s) a learner fit: learners "
                            f"{-(-slots // max(most_l, 1))} or more, in the pool of model {cfg.model.name}")
        what = (f"the pool's learner needs {lrn.describe()} of {usable / GIB:.1f} usable" if per > most_l else
                f"the pool's engine KV cache holds {eng.kv_per_slot:,} tokens a slot, less than one model.max_model_len "
                f"({cfg.model.max_model_len}) sequence")
        raise UserError(f"{source}: resources.shared_base.slots: {slots} slots on a {have_gib:.0f} GiB GPU: {what}: "
                        f"at most {min(most_l, most_e)} slot(s) fit (learner {most_l}, engine {most_e}) in the pool "
                        f"of model {cfg.model.name}"
                        + (f", or learners {-(-slots // most_l)} with these slots" if per > most_l and most_l
                           and slots <= most_e else ""))
    on = f" ({per} a learner, {learners} learners)" if learners > 1 else ""
    return [f"shared base, {slots} slot(s){on}: learner GPU {lrn.describe()} of {have_gib:.0f} GiB; at most {most_l} "
            "slot(s) fit",
            f"  engine GPU {eng.describe()}; at most {most_e} slot(s) hold a {cfg.model.max_model_len}-token sequence "
            "each"]
