"""Model settings checked against the model's own files before launch: a `model.max_model_len` beyond the
model's position limit would otherwise fail inside the rollout actor with vLLM's validation error."""

from __future__ import annotations

from orchestrator.config.errors import UserError
from orchestrator.config.trial import ModelConfig

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
