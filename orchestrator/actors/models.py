"""The model a trial loads: a hub name or local path as given, or a tiny model built here (cached:
workers/tiny/local.py). Light: importing it imports no torch, so the pre-launch checks can use it."""

from __future__ import annotations

from orchestrator.config.trial import ModelConfig
from workers.tiny.local import local_model_path


def resolve_model(cfg: ModelConfig) -> str:
    """Hub name / local path as given; a local model's name is built (once) on whichever node asks."""
    return local_model_path(cfg.name, cfg.tiny_seed) or cfg.name


def resolve_model_quietly(cfg: ModelConfig) -> str:
    """`resolve_model` for the pre-launch checks: a local model built now (first use on this machine) writes its
    progress bars to a buffer, so the check's answer (or its one-line user error) is all the user sees."""
    import contextlib
    import io

    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        return resolve_model(cfg)


def local_tokenizer(cfg: ModelConfig):
    """The model's tokenizer when it is on this machine (a local model is built), else None (a hub name not
    downloaded here: what needs it is checked again where the trial runs). For the checks made before launch."""
    from pathlib import Path

    from workers.tiny.local import is_local_model

    if is_local_model(cfg.name) or Path(cfg.name).expanduser().is_dir():
        from workers.models.loading import load_tokenizer

        return load_tokenizer(resolve_model_quietly(cfg))
    try:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(cfg.name, local_files_only=True)
    except (OSError, ValueError):
        return None
