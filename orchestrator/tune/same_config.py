"""Whether a resumed trial runs the config it started with (campaign.json's rows, a lone trial's trial_config.json).

The config saved at the start is read again by today's schema before the comparison: a field the code gained
since is then at its default, whatever task kind it belongs to and inside lists (mix members, eval sets) too, so
upgrading the code mid-campaign never blocks a resume; a value that differs from what the trial started with does.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from orchestrator.config.errors import format_validation
from orchestrator.config.trial import TrialConfig

# where a trial writes, how it is tracked, where its plugins were found (a job's uploaded working dir lands in a new
# place on each cluster start; the plugin's code is the code, like the package's): not what it runs
UNSTABLE = ("wandb", "output_dir", "plugins")


def _stable(config: dict) -> dict:
    return {k: v for k, v in config.items() if k not in UNSTABLE}


def _read_today(config: dict, now: dict) -> tuple[dict, str | None]:
    """`config` validated by today's schema (its unstable keys taken from `now`, so plugins import from where they
    are now), or as it was with the reason when today's schema refuses it (a field since removed, say)."""
    try:
        merged = {**config, **{k: now[k] for k in UNSTABLE if k in now}}
        return _stable(TrialConfig.model_validate(merged).model_dump(mode="json")), None
    except ValidationError as err:
        return _stable(config), format_validation("the saved config", err)


def _first_difference(before: Any, now: Any, path: str = "", saved_keys: bool = False) -> str | None:
    """The first key path where the two differ, with both values; `saved_keys`: only at keys `before` has (it is
    the saved config as written: a key it lacks is one the code gained)."""
    if isinstance(before, dict) and isinstance(now, dict):
        for key in sorted(set(before) | (set() if saved_keys else set(now)), key=str):
            if before.get(key, ...) != now.get(key, ...):
                found = _first_difference(before.get(key, ...), now.get(key, ...),
                                          f"{path}.{key}" if path else key, saved_keys)
                if found:
                    return found
        return None
    if isinstance(before, list) and isinstance(now, list) and len(before) == len(now):
        return next((d for i, (a, b) in enumerate(zip(before, now, strict=True))
                     if (d := _first_difference(a, b, f"{path}[{i}]", saved_keys))), None)
    return f"{path}: {_shown(before)} -> {_shown(now)}"


def _shown(value: Any) -> str:
    return "(absent)" if value is ... else repr(value)


def config_change(before: dict, now: dict) -> str | None:
    """None when a trial started with `before` would run the same with `now` (both dumped trial configs), else the
    first differing key path with its two values (for the refusal's message)."""
    (a, refused), (b, _) = _read_today(before, now), _read_today(now, now)
    if a == b:
        return None
    return _first_difference(a, b, saved_keys=refused is not None) or f"today's schema refuses {refused}"
