"""Task and environment plugins named by `module:Class` (`task: {name: my_tasks.countdown:Countdown, ...}`).

A single-turn plugin subclasses `workers.tasks.base.Task`, a multi-turn one `workers.envs.plugin.TextEnv`; each
carries a nested pydantic `Config` whose fields are the other `task:` keys. `plugin_config` imports the class and
validates those keys (errors located under `task.`); `dry_check` builds the task once and calls it as a trial
would (a batch, a score of the right length, one step of every action) so a broken plugin stops before launch.
Plugin modules are found on `sys.path`: `add_plugin_paths` puts a campaign's `plugins.paths` there.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from workers.envs.plugin import PluginError, load_class
from workers.tasks.config import PluginTaskConfig, plugin_config, plugin_kind


def add_plugin_paths(paths: list[str]) -> None:
    """Put plugin directories first on `sys.path` (idempotent)."""
    for p in reversed([str(p) for p in paths]):
        if p not in sys.path:
            sys.path.insert(0, p)


def _dry_task(task: Any) -> None:
    from workers.tasks.base import ScoreResult

    batch = task.next_batch(2)
    if len(batch) != 2:
        raise PluginError(f"next_batch(2) returned {len(batch)} problems")
    raw = getattr(type(task).score, "__wrapped__", type(task).score)  # the plugin's own, not the guard
    result = raw(task, batch, [batch[0].answer, ""])
    if not isinstance(result, ScoreResult):
        raise PluginError(f"score returned {type(result).__name__}, not a ScoreResult")
    if len(result.rewards) != 2:
        raise PluginError(f"score of 2 completions returned {len(result.rewards)} rewards (one per completion)")
    task.heldout(2)
    state = task.state_dict()
    json.dumps(state)
    task.load_state_dict(state)


def _dry_env(cfg: PluginTaskConfig) -> None:
    from workers.envs.plugin import PluginEnv

    cls = load_class(cfg.name)
    probe = PluginEnv(cls(cfg.config, 0))
    if not probe.action_names or not all(isinstance(a, str) and a for a in probe.action_names):
        raise PluginError("actions must be a non-empty sequence of action names")
    for action in probe.action_ids:
        env = PluginEnv(cls(cfg.config, 0))
        env.reset(0)
        for text in (env.instruction, env.state_text()):
            if not isinstance(text, str):
                raise PluginError(f"instruction and state_text() must be text, got {type(text).__name__}")
        _, reward, _, _, _ = env.step(action)
        float(reward)
        env.state_text()


def dry_check(cfg: PluginTaskConfig, seed: int = 0) -> None:
    """Build the plugin's task once and call it as a trial would; any failure is one PluginError line."""
    from workers.tasks import make_task

    try:
        task = make_task(cfg, seed)
        try:
            _dry_env(cfg) if cfg.kind == "env" else _dry_task(task)
        finally:
            task.close()
    except PluginError:
        raise
    except Exception as exc:  # noqa: BLE001 - the plugin's code failed: say where, in one line
        what = "env" if cfg.kind == "env" else "task"
        first = str(exc).splitlines()[0] if str(exc) else ""
        raise PluginError(f"{what} {cfg.name} failed a dry run ({type(exc).__name__}: {first})") from None


__all__ = ["PluginError", "add_plugin_paths", "dry_check", "load_class", "plugin_config", "plugin_kind"]
