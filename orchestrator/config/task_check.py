"""Before launch: a trial's dataset files are read and its task plugin is built and called once (a dry run), so
a missing file or a broken plugin is one line and exit code 2, not a failed trial."""

from __future__ import annotations

import json

from orchestrator.config.trial import TrialConfig

SOURCES = "data_source labels of "  # `checked` also keeps a dataset's held-out labels, under this prefix


def _key(task) -> str:
    return json.dumps(task.model_dump(mode="json"), sort_keys=True)


def check_task_plugin(trial: TrialConfig, checked: dict[str, str]) -> str:
    """'' when the trial's task is built in, its dataset files read, or its plugin passes a dry run
    (workers/tasks/plugins.py), else why not; `checked` remembers each distinct task config's answer."""
    from workers.tasks import make_task
    from workers.tasks.config import DatasetConfig, PluginTaskConfig
    from workers.tasks.mix import MixConfig, members
    from workers.tasks.plugins import PluginError, dry_check

    for i, task in enumerate(members(trial.task)):  # a mix: each member (its message says which)
        if not isinstance(task, PluginTaskConfig | DatasetConfig):
            continue
        key = _key(task)
        if key not in checked:
            try:
                if isinstance(task, DatasetConfig):  # the file(s) read, every row's fields found
                    built = make_task(task, trial.seed)
                    checked[SOURCES + key] = json.dumps(sorted({p.source.replace("/", "_") for p in built.heldout()
                                                                if p.source}))
                    built.close()
                else:
                    dry_check(task, trial.seed)
                checked[key] = ""
            except (PluginError, ValueError, ImportError) as exc:
                checked[key] = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        if checked[key]:
            return f"mix[{i}].task: {checked[key]}" if isinstance(trial.task, MixConfig) else checked[key]
    return ""


def check_eval_sets(trial: TrialConfig, checked: dict[str, str]) -> tuple[str, str]:
    """('', '') when every `eval.sets` entry with a task of its own passes `check_task_plugin` and no set is named
    like a `data_source` label of the trial's held-out problems (both would log `eval/<name>/pass@1`), else (its
    key path, why not). Call after `check_task_plugin(trial, checked)`, which read the labels."""
    from workers.tasks.mix import members

    labels = sorted({label for t in members(trial.task)
                     for label in json.loads(checked.get(SOURCES + _key(t), "[]"))})
    for i, s in enumerate(trial.eval.sets):
        if s.name in labels:
            return f"eval.sets.{i}.name", (f"{s.name!r} is a data_source label of the trial's held-out problems "
                                           f"(eval/{s.name}/pass@1 is theirs); a set's name must not be one of: "
                                           f"{', '.join(labels)}")
    for i, s in enumerate(trial.eval.sets):
        if s.task is not None:
            why = check_task_plugin(trial.model_copy(update={"task": s.task}), checked)
            if why:
                return f"eval.sets.{i}.task", why
    return "", ""
