"""The campaign's pre-launch memory check, per distinct trial shape: the learner's GPUs
(orchestrator/preflight/learner_memory.py) and the engine's (orchestrator/preflight/engine_memory.py), as the
lines `plan` and `run` print, or the one-line refusal (exit 2) of the first shape that cannot fit."""

from __future__ import annotations

from orchestrator.preflight.engine_memory import colocated_variant, engine_line
from orchestrator.preflight.learner_memory import (
    check_learner_memory,
    gpu_memory_gib,
    learner_memory,
    model_counts,
)
from orchestrator.preflight.shared_memory import shared_lines


def check_campaign_learners(campaign, local_only: bool = False, resolve=None,
                            shared_slots: int | None = None) -> list[str]:
    """The pre-launch memory check of each distinct trial shape of the campaign (model, learner, resources,
    engine, the critic and KL): per shape the learner's line (`check_learner_memory`), the engine's share per GPU
    (orchestrator/preflight/engine_memory.py), for a separate trial what colocated would need, and for a LoRA
    trial the shared pool's GPUs (orchestrator/preflight/shared_memory.py): with the campaign's
    resources.shared_base slots (refused when they do not fit), else with `shared_slots` when given (`plan`'s
    other option, not refused). UserError for the first that cannot fit; shapes whose model config cannot be read
    here are left out. `resolve`: model settings -> the path its config is read from (default: the trial's own
    resolution)."""
    from orchestrator.trial.actors.models import resolve_model_quietly

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
