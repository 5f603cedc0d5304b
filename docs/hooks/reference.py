"""The generated reference pages of the docs site, written from the code at every build (never committed).

- `reference/settings.md`: every campaign and trial setting (dotted key, type, default, allowed values,
  description) from the pydantic models (orchestrator/config, orchestrator/campaign, workers/*/config.py);
- `reference/cli.md`: every `python -m orchestrator` command and flag, from the real argparse parser
  (orchestrator/cli/__init__.py builds it);
- `reference/credit.md`: the credit stack's episode-level modes, named transforms, token stages, uncertainty
  kinds and every plugin entry point (credit plugins by dotted path, task and environment plugins).

Used two ways: as a MkDocs hook (`hooks:` in mkdocs.yml; `on_files` adds the pages to the build), and as a
script, `python docs/hooks/reference.py OUT_DIR`, which writes the same pages into OUT_DIR (to read them).
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import sys
import types
import typing
from pathlib import Path
from typing import Any, Literal
from unittest import mock

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

PAGES = ("reference/settings.md", "reference/cli.md", "reference/credit.md")


# ----------------------------------------------------------------------------------------------- settings
def _models(ann: Any) -> list[type]:
    """The pydantic models a field's annotation holds: itself, X | None, list[X], dict[str, X], unions."""
    from pydantic import BaseModel

    if isinstance(ann, type) and issubclass(ann, BaseModel):
        return [ann]
    out: list[type] = []
    for arg in typing.get_args(ann):
        for m in _models(arg):
            if m not in out:
                out.append(m)
    return out


def _type(ann: Any) -> str:
    """A short human name of an annotation."""
    from pydantic import BaseModel

    if ann is type(None):
        return "null"
    if isinstance(ann, type) and issubclass(ann, BaseModel):
        return "table"
    origin = typing.get_origin(ann)
    args = typing.get_args(ann)
    if origin is Literal:
        return "string" if all(isinstance(a, str) for a in args) else " | ".join(repr(a) for a in args)
    if origin is typing.Annotated:
        return _type(args[0])
    if origin in (typing.Union, types.UnionType):
        return " | ".join(dict.fromkeys(_type(a) for a in args))
    if origin in (list, tuple, set):
        return f"list of {_type(args[0])}" if args else "list"
    if origin is dict:
        return f"table of {_type(args[1])}" if len(args) == 2 else "table"
    names = {str: "string", int: "integer", float: "number", bool: "boolean", Any: "any"}
    return names.get(ann, getattr(ann, "__name__", str(ann)))


def _allowed(field: Any) -> str:
    """Allowed values: the Literal choices and the numeric / length bounds pydantic enforces."""
    ann = field.annotation
    literals: list[Any] = []

    def collect(a: Any) -> None:
        if typing.get_origin(a) is Literal:
            literals.extend(typing.get_args(a))
        for sub in typing.get_args(a) if typing.get_origin(a) in (typing.Union, types.UnionType) else ():
            collect(sub)

    collect(ann)
    parts = [" \\| ".join(f"`{v}`" for v in literals)] if literals else []
    for meta in field.metadata:
        for attr, sym in (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<"), ("min_length", "length >="),
                          ("max_length", "length <=")):
            value = getattr(meta, attr, None)
            if value is not None:
                parts.append(f"{sym} {value}")
    return ", ".join(parts)


def _default(field: Any) -> str:
    from pydantic import BaseModel
    from pydantic_core import PydanticUndefined

    if field.default_factory is not None:
        value = field.default_factory()
    elif field.default is PydanticUndefined:
        return "required"
    else:
        value = field.default
    if isinstance(value, BaseModel):
        return "(table below)"
    if value is None:
        return "`null`"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, str):
        return f'`"{value}"`' if value == "" else f"`{value}`"
    return f"`{value!r}`"


def _cell(text: str | None) -> str:
    return " ".join((text or "").split()).replace("|", "\\|")


def _doc(model: type) -> str:
    doc = model.__doc__ or ""
    from pydantic import BaseModel

    if not doc or doc == BaseModel.__doc__ or doc.startswith("Usage docs:"):
        return ""
    return inspect.cleandoc(doc)


def settings_tables(root: type, prefix: str, heading: str, skip: dict[str, str] | None = None,
                    variants: dict[str, list[tuple[str, type]]] | None = None) -> list[str]:
    """Markdown: one table per nested model, rows keyed by the full dotted path; `skip`: fields documented
    elsewhere (field -> a line saying where); `variants`: fields that are a union chosen by a value, as
    (title, model) pairs (the trial's `task`)."""
    skip, variants = skip or {}, variants or {}
    out: list[str] = []
    queue: list[tuple[str, type, str]] = [(prefix, root, "")]
    while queue:
        path, model, suffix = queue.pop(0)
        out += [f"### `{path}`{suffix}" if path else f"### {heading}", ""]
        if doc := _doc(model):
            out += [_cell(doc), ""]
        out += ["| Key | Type | Default | Allowed | Description |", "| --- | --- | --- | --- | --- |"]
        nested: list[tuple[str, type, str]] = []
        for name, field in model.model_fields.items():
            key = f"{path}.{name}" if path else name
            desc = field.description or ""
            if path == prefix and name in skip:
                desc = (desc + " " if desc else "") + skip[name]
            elif path == prefix and name in variants:
                desc = (desc + " " if desc else "") + "One of the tables below, chosen by its `name`."
                nested += [(key, m, f" ({t})") for t, m in variants[name]]
            else:
                held = _models(field.annotation)
                nested += [(key, m, "" if len(held) == 1 else f" ({m.__name__})") for m in held]
            out.append(f"| `{key}` | {_cell(_type(field.annotation))} | {_cell(_default(field))} | "
                       f"{_allowed(field)} | {_cell(desc)} |")
        out.append("")
        queue[0:0] = nested
    return out


def settings_page() -> str:
    from orchestrator.campaign.schema import CampaignConfig
    from orchestrator.config.trial import TrialConfig
    from workers.tasks.config import BUILTIN, PluginTaskConfig  # noqa: F401 - PluginTaskConfig: see below
    from workers.tasks.mix import MixConfig

    tasks = [(f"name: {c.model_fields['name'].default}", c) for c in BUILTIN] + [("mix", MixConfig)]
    lines = [
        "# Settings",
        "",
        "Every key of a campaign file and of a trial config, generated from the pydantic models at each build of "
        "this site: the dotted key, its type, its default, the values it allows and its description. A key not "
        "listed here is refused before anything launches (one line naming the key, exit code 2).",
        "",
        "## Trial settings",
        "",
        "A trial config (`python -m orchestrator trial FILE`), and a campaign's `base`, `conditions.<name>` and "
        "`sweep` keys, hold these keys (`orchestrator/config/trial.py:TrialConfig`). Every key has a default that "
        "runs the local default.",
        "",
        "`task` is one of the built-in tasks below, chosen by `task.name`; a mixed task (`task: {mix: [...]}`); or a "
        "plugin `task: {name: module:Class, ...}` whose other keys are the fields of the plugin class's own "
        "`Config` ([Tasks](../tasks.md)).",
        "",
    ]
    lines += settings_tables(TrialConfig, "", "Trial config (top level)", variants={"task": tasks})
    lines += [
        "## Campaign settings",
        "",
        "The keys of a campaign file (`orchestrator/campaign/schema.py:CampaignConfig`).",
        "",
    ]
    lines += settings_tables(CampaignConfig, "", "Campaign file (top level)", skip={
        "base": "Its keys: [Trial settings](#trial-settings).",
        "conditions": "Each condition's keys: [Trial settings](#trial-settings).",
        "sweep": "Each key is a dotted path of [Trial settings](#trial-settings).",
    })
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------------------------- the CLI
class _Parser(Exception):
    pass


def cli_parser() -> argparse.ArgumentParser:
    """The real parser `python -m orchestrator` builds, captured before it parses anything."""
    from orchestrator import cli

    def grab(self: argparse.ArgumentParser, *args: Any, **kwargs: Any) -> None:
        raise _Parser(self)

    with mock.patch.object(argparse.ArgumentParser, "parse_args", grab):
        try:
            cli.main([])
        except _Parser as got:
            return got.args[0]
    raise RuntimeError("orchestrator.cli.main did not call parse_args")


def subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _flag_row(action: argparse.Action) -> str:
    if action.option_strings:
        name = ", ".join(f"`{s}`" for s in action.option_strings)
    else:
        name = f"`{action.metavar or action.dest}` (positional)"
    if action.choices is not None:
        value = " \\| ".join(f"`{c}`" for c in action.choices)
    elif action.nargs == 0:
        value = "(flag)"
    else:
        value = f"`{action.metavar or action.dest.upper()}`"
        if action.nargs in ("*", "+") or isinstance(action, argparse._AppendAction):
            value += " (repeatable)" if isinstance(action, argparse._AppendAction) else " ..."
    default = "" if action.default in (None, False, argparse.SUPPRESS) or not action.option_strings \
        else f"`{action.default}`"
    helptext = (action.help or "").replace("%%", "%")
    return f"| {name} | {_cell(value)} | {default} | {_cell(helptext)} |"


def cli_page() -> str:
    parser = cli_parser()
    lines = ["# Commands", "",
             "Every `python -m orchestrator` command and its flags, generated from the parser "
             "(`orchestrator/cli/__init__.py`) at each build of this site. A user mistake is one line on stderr "
             "and exit code 2.", ""]
    subs = subcommands(parser)
    help_of = {a.dest: a.help for a in next(a for a in parser._actions
                                            if isinstance(a, argparse._SubParsersAction))._choices_actions}
    lines += ["| Command | What it does |", "| --- | --- |"]
    lines += [f"| [`{n}`](#{n}) | {_cell(help_of.get(n))} |" for n in subs]
    lines.append("")
    for name, sub in subs.items():
        usage = " ".join(sub.format_usage().removeprefix("usage: ").split())
        lines += [f"## {name}", "", _cell(help_of.get(name)), "", "```text", usage, "```", ""]
        if sub.description:
            lines += [sub.description, ""]
        lines += ["| Argument | Value | Default | Description |", "| --- | --- | --- | --- |"]
        lines += [_flag_row(a) for a in sub._actions if not isinstance(a, argparse._HelpAction)]
        lines.append("")
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------------------------- credit
def _first_para(obj: Any) -> str:
    doc = inspect.getdoc(obj) or ""
    return _cell(doc.split("\n\n")[0])


def credit_page() -> str:
    from workers.credit import config as cc
    from workers.credit import episode, gae, plugins, token
    from workers.credit.planning import planning_mask
    from workers.envs.plugin import TextEnv
    from workers.tasks.base import Task

    lines = ["# Credit stages and plugin entry points", "",
             "Generated from `workers/credit` and the plugin base classes at each build of this site. How the "
             "stages compose, the SEPA controller and the diagnostics: [The credit stack](../credit.md).", "",
             "## Episode level: `credit.advantage_mode`", "",
             "| Value | What it computes |", "| --- | --- |"]
    fns = {"grpo": episode.grpo, "maxrl": episode.maxrl, "gae": gae}
    for mode in cc.BUILTIN_ADVANTAGES:
        lines.append(f"| `{mode}` | {_first_para(fns[mode]) if mode in fns else ''} |")
    lines += ["| `package.module.function` | a plugin: " + _cell(_plugin_line(plugins, "advantage_mode")) + " |",
              "", "## Token stages: `credit.transform_mode`", "",
              "A named mode runs these stages in order; a list of stage names runs them in the order given; a "
              "dotted path is a transform plugin.", "",
              "| Value | Stages, in order |", "| --- | --- |"]
    for name, stages in cc.NAMED_TRANSFORMS.items():
        lines.append(f"| `{name}` | {', '.join(f'`{s}`' for s in stages) or '(none)'} |")
    lines += ["", "| Stage | What it does | Its setting |", "| --- | --- | --- |"]
    stage_fns = {"sepa": (token.sepa_pool, "`credit.sepa` (schedule of lambda)"),
                 "gtpo": (token.gtpo_weights, "`credit.gtpo_beta`"),
                 "hicra": (token.hicra, "`credit.hicra_alpha`")}
    for stage in typing.get_args(cc.StageName):
        fn, setting = stage_fns.get(stage, (None, ""))
        lines.append(f"| `{stage}` | {_first_para(fn) if fn else ''} | {setting} |")
    lines += ["", "## Uncertainty kinds: `credit.uncertainty_kind`", "",
              ", ".join(f"`{k}`" for k in typing.get_args(cc.UncertaintyKind)), "",
              "## Credit plugins (dotted paths)", "", _cell(inspect.getdoc(plugins).split("\n\n")[0]), "",
              "| Setting | Interface |", "| --- | --- |"]
    for role in ("advantage_mode", "transform_mode", "algorithm_mode", "planning_detector"):
        lines.append(f"| `credit.{role}` | {_cell(_plugin_line(plugins, role))} |")
    lines += ["", f"The built-in planning detector: `workers.credit.planning.planning_mask{inspect.signature(planning_mask)}`.",
              ""]
    for ctx in (plugins.TransformContext, plugins.AlgorithmContext):
        lines += [f"### `{ctx.__module__}.{ctx.__name__}`", "", _first_para(ctx), "",
                  "| Field | Type |", "| --- | --- |"]
        lines += [f"| `{f.name}` | `{_cell(str(f.type))}` |" for f in dataclasses.fields(ctx)]
        lines.append("")
    lines += ["## Task and environment plugins", "",
              "`task: {name: module:Class, ...}` names a class on the campaign's `plugins.paths`; its nested "
              "pydantic `Config` holds the other `task:` keys ([Tasks](../tasks.md)).", ""]
    for base in (Task, TextEnv):
        lines += [f"### `{base.__module__}.{base.__name__}`", "", _cell(inspect.getdoc(base)), "",
                  "| Method | Must define | Description |", "| --- | --- | --- |"]
        for name, member in base.__dict__.items():
            fn = member.__func__ if isinstance(member, classmethod | staticmethod) else member
            if name.startswith("_") or not callable(fn) and not isinstance(member, property):
                continue
            target = member.fget if isinstance(member, property) else fn
            abstract = "yes" if getattr(target, "__isabstractmethod__", False) else ""
            sig = "" if isinstance(member, property) else str(inspect.signature(fn))
            lines.append(f"| `{name}{_cell(sig)}` | {abstract} | {_first_para(target)} |")
        lines.append("")
    return "\n".join(lines) + "\n"


def _plugin_line(plugins: Any, role: str) -> str:
    for line in (inspect.getdoc(plugins) or "").splitlines():
        if line.strip().startswith(role + ":"):
            return line.split(":", 1)[1].strip()
    return ""


# ----------------------------------------------------------------------------------------------- build
def pages() -> dict[str, str]:
    return {"reference/settings.md": settings_page(), "reference/cli.md": cli_page(),
            "reference/credit.md": credit_page()}


def on_files(files: Any, config: Any) -> Any:
    """MkDocs hook: add the generated pages to the build (they exist only in the built site)."""
    from mkdocs.structure.files import File

    for path, text in pages().items():
        files.append(File.generated(config, path, content=text))
    return files


if __name__ == "__main__":
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "site-reference")
    for rel, text in pages().items():
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        (out / rel).write_text(text)
        print(out / rel)
