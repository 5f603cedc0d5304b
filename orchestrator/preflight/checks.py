"""The checks a campaign (or a single trial) passes before anything launches: the cluster can hold its trials,
its storage survives a job's upload, every model setting fits its model (`check_model_limits`: a
`model.max_model_len` beyond the model's position limit would otherwise fail inside the rollout actor with vLLM's
validation error), every learner its GPUs, every agentic trial's first turn its context. Each failure is one UserError line (exit 2), nothing started."""

from __future__ import annotations

import json
import os
from pathlib import Path

from orchestrator import storage as store
from orchestrator.actors.models import local_tokenizer
from orchestrator.campaign.schema import Campaign
from orchestrator.config.errors import UserError
from orchestrator.config.trial import ModelConfig, TrialConfig
from orchestrator.preflight.cluster import check_campaign


def refuse_storage_inside(campaign: Campaign, working_dir: Path) -> None:
    """A job's working dir is uploaded afresh for every job: storage inside it could never be resumed."""
    if not store.is_uri(campaign.storage) and Path(campaign.storage).is_relative_to(working_dir):
        raise UserError(f"{campaign.source}: storage: {campaign.storage} lies inside the uploaded working dir, "
                        "which is new for every job (a re-submit could not resume); use an absolute path or a URI")


def check_episodes(source: str, trials: list[tuple[str, TrialConfig]]) -> None:
    """Before launch: every agentic trial's first turn (longest first prompt + rollout.max_tokens) fits
    model.max_model_len; UserError (one line, exit 2) naming the file and the trial otherwise."""
    from orchestrator.config.members import member_trials
    from orchestrator.trial.collect.episodes import check_episode_fits

    seen: dict[str, str | None] = {}
    for name, cfg in ((n, part) for n, whole in trials for _, part in member_trials(whole)):  # a mix: each member
        if not cfg.task.agentic:
            continue
        key = json.dumps([cfg.model.model_dump(mode="json"), cfg.task.model_dump(mode="json"), cfg.seed,
                          cfg.rollout.max_tokens, cfg.rollout.max_actions_per_turn,
                          cfg.rollout.max_actions_per_episode])
        if key not in seen:
            tok = local_tokenizer(cfg.model)
            seen[key] = None if tok is None else check_episode_fits(cfg, tok)
        if seen[key]:
            raise UserError(f"{source}: trial {name}: {seen[key]}")


def check_cluster(campaign: Campaign) -> None:
    """User errors a cluster can reveal before anything launches (exit 2, nothing started): resources and storage
    against what the cluster can grow to (orchestrator/preflight/cluster.py: the autoscaler's node types count)."""
    check_campaign(campaign)
    if os.environ.get("RAY_JOB_SUBMISSION_ID"):  # running as a Ray job: cwd is the uploaded working dir
        refuse_storage_inside(campaign, Path.cwd().resolve())


def check_campaign_models(campaign: Campaign) -> None:
    """Each distinct model setting of the campaign against the model's own config (`check_model_limits`),
    and each learner setup against its GPUs' memory (orchestrator/learner_memory; its estimates are printed)."""
    from orchestrator.preflight.memory_check import check_campaign_learners

    seen = set()
    for t in campaign.trials:
        key = t.trial.model.model_dump_json()
        if key not in seen:
            seen.add(key)
            check_model_limits(t.trial.model, campaign.source, where=f"trial {t.name}: model")
    for line in check_campaign_learners(campaign):
        print(line, flush=True)


# where configs keep the position limit (the first one present counts, as in vLLM's derivation)
POSITION_KEYS = ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length", "max_sequence_length")


def position_limit(model_path: str) -> tuple[str, int] | None:
    """(config key, value) of the model's position limit, or None when its config cannot be read here (a hub
    model not in the local cache on a machine without network: the engine checks it where it starts)."""
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(model_path)
    except (OSError, ValueError):
        return None
    config = getattr(config, "text_config", None) or config
    for key in POSITION_KEYS:
        value = getattr(config, key, None)
        if isinstance(value, int) and value > 0:
            return key, value
    return None


def check_model_limits(model: ModelConfig, source: str, where: str = "model") -> None:
    """Refuse (UserError, one line naming `source`, the key, the value and the limit) a max_model_len the model
    cannot hold. Local model names are built (cached) to read their config."""
    from orchestrator.actors.models import resolve_model_quietly

    found = position_limit(resolve_model_quietly(model))
    if found is not None and model.max_model_len > found[1]:
        raise UserError(f"{source}: {where}.max_model_len: {model.max_model_len} exceeds the model's position limit "
                        f"{found[1]} ({found[0]} in {model.name}'s config); allowed: at most {found[1]}")
