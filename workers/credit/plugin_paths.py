"""Plugins named by dotted path ('pkg.mod.fn'): imported, checked, and every one a config names resolved before a
trial starts. Pure importlib (no torch), so a campaign is checked without importing the tensor code."""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from typing import Any

from workers.credit.config import CreditConfig
from workers.credit.errors import CreditError

BUILTIN_ADVANTAGES = ("grpo", "maxrl")  # workers/credit/episode.py: BUILTIN


def load_plugin(path: str, role: str) -> Callable[..., Any]:
    """Import `path` ('pkg.mod.fn'); any failure becomes a one-line CreditError naming the role."""
    module_name, _, attr = path.rpartition(".")
    if not module_name:
        raise CreditError(f"{role}: {path!r} is not a dotted path like 'package.module.function'")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # noqa: BLE001 - any import-time failure is the plugin's problem, reported as such
        raise CreditError(f"{role}: cannot import module {module_name!r} ({type(exc).__name__}: {exc})") from exc
    fn = getattr(module, attr, None)
    if fn is None:
        raise CreditError(f"{role}: module {module_name!r} has no attribute {attr!r}")
    if not callable(fn):
        raise CreditError(f"{role}: {path!r} is not callable")
    return fn


def positional_arity(fn: Callable[..., Any]) -> int:
    """How many positional arguments `fn` accepts (a large number for *args)."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return 1
    if any(p.kind is p.VAR_POSITIONAL for p in params):
        return 99
    return sum(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in params)


def resolve_plugins(config: CreditConfig) -> dict[str, Any]:
    """Import every plugin the config names (to fail early, before a trial starts)."""
    found: dict[str, Any] = {}
    if config.advantage_mode not in BUILTIN_ADVANTAGES and not config.uses_critic:
        found["advantage_mode"] = load_plugin(config.advantage_mode, "advantage_mode")
    if isinstance(config.transform_mode, str) and config.transform_mode != "none" and not config.stages:
        found["transform_mode"] = load_plugin(config.transform_mode, "transform_mode")
    if config.algorithm_mode:
        found["algorithm_mode"] = load_plugin(config.algorithm_mode, "algorithm_mode")
    if config.planning_detector:
        found["planning_detector"] = load_plugin(config.planning_detector, "planning_detector")
    return found
