"""Campaign files: loading and the pure expansion into trial configs (the schema: orchestrator/campaign/schema.py).

A campaign is a grid: conditions (named overrides of `base`) x seeds x an optional sweep (key path -> values),
every combination one trial named `<condition>_s<seed>[_<sweep label>]`. Expansion is pure and deterministic:
the same file gives the same trials in the same order, and every trial config is validated here, so a bad
campaign fails before anything launches.
"""

from __future__ import annotations

import copy
import difflib
import itertools
import re
import typing
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from orchestrator import storage as store
from orchestrator.campaign.schema import Campaign, CampaignConfig, ExpandedTrial
from orchestrator.campaign.sections import CONTRAST, MEASURE
from orchestrator.campaign.shared import check_shared_base
from orchestrator.config.errors import UserError, first_error, format_validation
from orchestrator.config.files import load_yaml
from orchestrator.config.task_check import check_eval_sets, check_task_plugin
from orchestrator.config.trial import TrialConfig


# ----------------------------------------------------------------------------------------------- key paths
def _field_model(model: type[BaseModel], name: str) -> type[BaseModel] | None:
    """The pydantic model a field holds (unwrapping `X | None`), or None for a plain value or free-form dict."""
    ann = model.model_fields[name].annotation
    if name == "task" and model is TrialConfig:
        return None  # a union chosen by task.name: its keys are checked when the trial is validated
    return next((c for c in (ann, *typing.get_args(ann)) if isinstance(c, type) and issubclass(c, BaseModel)), None)


def _allowed_keys(model: type[BaseModel], loc: tuple) -> list[str]:
    """Field names valid at `loc` inside `model` (for "did you mean" on unknown keys)."""
    current: type[BaseModel] | None = model
    for part in loc[:-1]:
        if current is None or str(part) not in current.model_fields:
            return []
        current = _field_model(current, str(part))
    return list(current.model_fields) if current is not None else []


def _suggest(word: str, allowed: list[str]) -> str:
    close = difflib.get_close_matches(word, allowed, n=1)
    return f" (did you mean '{close[0]}'?)" if close else (f"; allowed: {', '.join(allowed)}" if allowed else "")


def _validation_message(source: str, model: type[BaseModel], err: ValidationError) -> str:
    first = first_error(err)
    # `seeds` is a list or a table: pydantic names the branch in the key path, the user never wrote it
    msg = format_validation(source, err).replace(": seeds.table.", ": seeds.").replace(": seeds.list", ": seeds")
    if first["type"] == "extra_forbidden":
        msg += _suggest(str(first["loc"][-1]), _allowed_keys(model, first["loc"]))
    return msg


def check_key_path(path: str) -> str | None:
    """None when `path` (dotted) names a field of TrialConfig, else the reason."""
    current: type[BaseModel] | None = TrialConfig
    for part in path.split("."):
        if current is None:
            return None  # inside a free-form dict: anything goes
        if part not in current.model_fields:
            return "unknown key" + _suggest(part, list(current.model_fields))
        current = _field_model(current, part)
    return None


# ----------------------------------------------------------------------------------------------- expansion
def deep_merge(base: dict, override: dict) -> dict:
    """Tables merge key by key; any other value (lists included) replaces the base value whole."""
    out = copy.deepcopy(base)
    for k, v in override.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = deep_merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


def set_path(data: dict, path: str, value: Any) -> None:
    """Set a dotted key path; the value is stored whole (a swept table replaces the table)."""
    *parents, last = path.split(".")
    node = data
    for p in parents:
        if not isinstance(node.get(p), dict):
            node[p] = {}
        node = node[p]
    node[last] = copy.deepcopy(value)


def _fmt(value: Any, index: int) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, int | str) and re.fullmatch(r"[A-Za-z0-9_.+-]+", str(value)):
        return str(value)
    return f"v{index}"  # tables, lists, odd strings: position in the sweep list


def sweep_points(sweep: dict[str, list[Any]]) -> list[tuple[dict[str, Any], str]]:
    """Every combination of swept values with its short label, in file order."""
    if not sweep:
        return [({}, "")]
    keys = list(sweep)
    lasts = [k.split(".")[-1] for k in keys]
    short = [k.split(".")[-1] if lasts.count(k.split(".")[-1]) == 1 else ".".join(k.split(".")[-2:]) for k in keys]
    points = []
    for combo in itertools.product(*(list(enumerate(sweep[k])) for k in keys)):
        values = {k: v for k, (_, v) in zip(keys, combo, strict=True)}
        label = "_".join(f"{s}{_fmt(v, i)}" for s, (i, v) in zip(short, combo, strict=True))
        points.append((values, label))
    return points


def _origin(loc: tuple, condition: str, override: dict, sweep_values: dict) -> str:
    """Which part of the campaign file a failing trial-config key came from."""
    dotted = ".".join(str(p) for p in loc)
    for key in sweep_values:
        if loc and (dotted == key or dotted.startswith(key + ".") or key.startswith(dotted + ".")):
            return f"sweep.{key}"
    node, matched = override, 0
    for part in loc:
        if not (isinstance(node, dict) and part in node):
            break
        node, matched = node[part], matched + 1
    if not loc:  # a check across keys: base and the condition's override both feed it
        return f"conditions.{condition} (merged with base)" if override else "base"
    prefix = f"conditions.{condition}" if matched else "base"
    return f"{prefix}.{dotted}"


def run_id(directory: str, trial: str) -> str:
    """A W&B run id stable across resumes and distinct between two campaigns stored in different places."""
    import hashlib

    digest = hashlib.sha1(directory.encode()).hexdigest()[:8]
    return re.sub(r"[^A-Za-z0-9_-]", "-", f"{trial}-{digest}")


def plugin_paths(cfg: CampaignConfig, campaign_dir: Path) -> list[str]:
    """The campaign's plugin directories, absolute (relative ones from the campaign file's directory)."""
    paths = cfg.plugins.paths if "plugins" in cfg.model_fields_set else ["."]
    return [str((campaign_dir / Path(p).expanduser()).resolve()) for p in paths]


def expand(cfg: CampaignConfig, source: str = "<campaign>", directory: str = "",
           plugins: list[str] | None = None) -> list[ExpandedTrial]:
    """All trials of the campaign, validated, in order condition -> sweep point -> seed; `plugins`: the absolute
    plugin directories every trial gets (`plugins.paths`)."""
    from workers.credit import CreditError, resolve_plugins

    checked: dict[str, str] = {}
    for key in ("name", "seed", "output_dir", "labels", "plugins"):
        if key in cfg.base:
            raise UserError(f"{source}: base.{key}: set by the campaign for each trial; remove it from base")
    for key in cfg.sweep:
        why = check_key_path(key)
        if why:
            raise UserError(f"{source}: sweep.{key}: {why}")
        if key.split(".")[0] in ("name", "seed", "output_dir", "labels", "wandb", "plugins"):
            raise UserError(f"{source}: sweep.{key}: cannot be swept (set by the campaign)")
    for cond, override in cfg.conditions.items():
        for key in ("name", "seed", "output_dir", "labels", "plugins"):
            if key in override:
                raise UserError(f"{source}: conditions.{cond}.{key}: set by the campaign; remove it")

    cfg.report.contrast_pairs(list(cfg.conditions), source)
    trials: list[ExpandedTrial] = []
    seen: dict[str, str] = {}
    for cond, override in cfg.conditions.items():
        merged = deep_merge(cfg.base, override)
        for values, label in sweep_points(cfg.sweep):
            for seed in cfg.seed_list():
                name = f"{cond}_s{seed}" + (f"_{label}" if label else "")
                data = copy.deepcopy(merged)
                for key, value in values.items():
                    set_path(data, key, value)
                if cfg.resources is not None:
                    if cfg.resources.placement != "colocated":  # colocated: one engine per learner rank
                        data.setdefault("rollout", {})["num_workers"] = cfg.resources.rollout_workers
                    data["resources"] = cfg.resources.model_dump(exclude={"rollout_workers"})
                data.update(name=name, seed=seed, labels={"condition": cond, "seed": seed, **values})
                if plugins:
                    data["plugins"] = {"paths": list(plugins)}
                if directory:
                    data["output_dir"] = store.trial_dir(directory, name)
                data["wandb"] = {**cfg.wandb.model_dump(), "group": cfg.name, "job_type": cond,
                                 "tags": [*cfg.wandb.tags, f"seed:{seed}", f"condition:{cond}"],
                                 "dir": cfg.wandb.dir or (directory if directory and not store.is_uri(directory)
                                                          else None),
                                 "run_id": run_id(directory, name) if directory else None}
                where = f"trial {name}: "
                try:
                    trial_cfg = TrialConfig.model_validate(data)
                except ValidationError as err:
                    loc = first_error(err)["loc"]
                    origin = _origin(loc, cond, override, values)
                    msg = _validation_message(source, TrialConfig, err)
                    dotted = ".".join(str(p) for p in loc) or "<root>"
                    raise UserError(msg.replace(f"{source}: {dotted}", f"{source}: {origin}", 1)
                                    + f" ({where.rstrip(': ')})") from None
                try:
                    resolve_plugins(trial_cfg.credit)
                except CreditError as exc:
                    origin = f"conditions.{cond}.credit" if "credit" in override else "base.credit"
                    raise UserError(f"{source}: {origin}: {exc} ({where.rstrip(': ')})") from None
                why = check_task_plugin(trial_cfg, checked)
                if why:
                    origin = f"conditions.{cond}.task" if "task" in override else "base.task"
                    raise UserError(f"{source}: {origin}: {why} ({where.rstrip(': ')})")
                at, why = check_eval_sets(trial_cfg, checked)
                if why:
                    raise UserError(f"{source}: {at}: {why} ({where.rstrip(': ')})")
                if name in seen:
                    raise UserError(f"{source}: sweep: trial name {name!r} repeats ({seen[name]}); sweep values "
                                    "must give distinct labels")
                seen[name] = name
                trials.append(ExpandedTrial(name, cond, seed, values, trial_cfg.model_dump(mode="json"), trial_cfg))
    return trials


def load_campaign(path: str | Path) -> Campaign:
    """Read, validate and expand a campaign file; every user mistake raises UserError (one line)."""
    source = str(path)
    data = load_yaml(path)
    try:
        cfg = CampaignConfig.model_validate(data)
    except ValidationError as err:
        raise UserError(_validation_message(source, CampaignConfig, err)) from None
    try:
        storage = store.resolve(cfg.storage, Path(path).resolve().parent)
    except KeyError as exc:
        raise UserError(f"{source}: storage: environment variable {exc.args[0]} is not set "
                        "(use ${VAR:-default} for a fallback)") from None
    directory = store.join(storage, cfg.name)
    # every trial carries the paths; validating it puts them on sys.path before its task plugin is imported
    trials = expand(cfg, source, directory, plugin_paths(cfg, Path(path).resolve().parent))
    check_schedule(cfg, trials, source)
    check_shared_base(cfg, trials, source)
    return Campaign(cfg, source, directory, storage, trials)


def load_ran_campaign(path: str) -> Campaign:
    """A campaign YAML that has run (its directory holds campaign.json), for the commands that read what it
    wrote (`samples`, `export`, `eval`); UserError when it has not run."""
    campaign = load_campaign(path)
    if store.read_text(store.join(campaign.directory, store.CAMPAIGN_FILE)) is None:
        raise UserError(f"{path}: campaign '{campaign.config.name}' has not run yet (no {campaign.directory}"
                        "/campaign.json); start it with: python -m orchestrator run " + path)
    return campaign


def check_schedule(cfg: CampaignConfig, trials: list[ExpandedTrial], source: str) -> None:
    """schedule / budget / seeds.adaptive / report.primary / report.primary_sweep against the trials they govern
    (one line each, before launch)."""
    sched, budget, adaptive = cfg.schedule, cfg.budget, cfg.adaptive
    if adaptive is not None and cfg.report.primary not in (None, adaptive.measure):
        raise UserError(f"{source}: report.primary: with seeds.adaptive the primary result is the stop's own "
                        f"({adaptive.contrast} on {adaptive.measure}); leave report.primary out or set it to "
                        f"{adaptive.measure}")
    ps = cfg.report.primary_sweep
    if ps is not None:
        where = f"{source}: report.primary_sweep"
        if not cfg.sweep:
            raise UserError(f"{where}: the campaign has no sweep; leave it out")
        if ps.condition is not None and ps.condition not in cfg.conditions:
            raise UserError(f"{where}.condition: {ps.condition!r} is not a condition ({', '.join(cfg.conditions)})")
        if ps.key is not None and ps.key not in cfg.sweep:
            raise UserError(f"{where}.key: {ps.key!r} is not swept ({', '.join(cfg.sweep)})")
    m = MEASURE.match(cfg.report.primary or "final")
    if m.group(2) is not None:
        short = next((t for t in trials if int(m.group(3)) > t.trial.steps - 1), None)
        if short is not None:
            raise UserError(f"{source}: report.primary: {cfg.report.primary} needs step {m.group(3)}; trial "
                            f"{short.name} runs steps 0..{short.trial.steps - 1}")
    if sched.mode == "lockstep":
        if sched.round_steps is None:
            raise UserError(f"{source}: schedule.round_steps: lockstep needs round_steps (a multiple of "
                            "checkpoint.every)")
        for t in trials:
            every = t.trial.checkpoint.every
            if sched.round_steps % every:
                raise UserError(f"{source}: schedule.round_steps: {sched.round_steps} is not a multiple of "
                                f"checkpoint.every ({every}, trial {t.name}); a trial may pause only at a checkpoint")
    elif sched.round_steps is not None:
        raise UserError(f"{source}: schedule.round_steps: only with mode: lockstep")
    if budget is not None:
        if sched.mode != "lockstep":
            raise UserError(f"{source}: budget: needs schedule: {{mode: lockstep, round_steps: k}} (a budget ends "
                            "the campaign at a round boundary, so every trial stops at the same step)")
        if budget.gpu_hours is None and budget.deadline is None:
            raise UserError(f"{source}: budget: give gpu_hours or deadline")
    if adaptive is not None:
        other, base = CONTRAST.match(adaptive.contrast).groups()
        for name in (other, base):
            if name not in cfg.conditions:
                raise UserError(f"{source}: seeds.adaptive.contrast: {name!r} is not a condition; conditions: "
                                + ", ".join(cfg.conditions))
        if other == base:
            raise UserError(f"{source}: seeds.adaptive.contrast: compares {base} with itself")
        if cfg.sweep:
            raise UserError(f"{source}: seeds.adaptive: not with a sweep (the contrast pairs seeds of two "
                            "conditions; run one campaign per swept value)")
        m = MEASURE.match(adaptive.measure)
        if m.group(2) is not None:
            hi = int(m.group(3))
            for t in trials:
                if t.condition in (other, base) and hi > t.trial.steps - 1:
                    raise UserError(f"{source}: seeds.adaptive.measure: {adaptive.measure} needs step {hi}; trial "
                                    f"{t.name} runs steps 0..{t.trial.steps - 1}")


def trial_table(trials: list[ExpandedTrial]) -> str:
    """The plain-text table `expand` prints."""
    from orchestrator.config.placement import tune_bundles

    rows = [("trial", "condition", "seed", "sweep", "steps", "placement: bundles")]
    for t in trials:
        c = t.trial
        b = tune_bundles(c)  # a shared-base trial: its driver only (the pool holds the engines and learner)
        cpus, gpus = sum(x.get("CPU", 0) for x in b), sum(x.get("GPU", 0) for x in b)
        sweep = ", ".join(f"{k}={v}" for k, v in t.sweep.items()) or "-"
        rows.append((t.name, t.condition, str(t.seed), sweep, str(c.steps),
                     f"{'shared' if c.resources.shared_base else c.resources.placement}: {len(b)} bundles, "
                     f"{cpus:g} CPU, {gpus:g} GPU"))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)
