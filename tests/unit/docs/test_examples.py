"""Examples that cannot rot: every YAML block of README.md and docs/ is validated against the schema it is marked
with (tests/unit/docs/examples.py: the markers), and every `python -m orchestrator ...` command shown parses with
the real argument parser (nothing is run)."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import pytest
import yaml

from orchestrator.campaign.expand import check_schedule, deep_merge, expand, plugin_paths
from orchestrator.campaign.schema import CampaignConfig
from orchestrator.campaign.shared import check_shared_base
from orchestrator.config.errors import UserError
from tests.unit.docs.examples import ROOT, Block, blocks, commands, doc_files, variants

MINIMAL = {"name": "example", "conditions": {"A": {}}, "seeds": [0]}
TRIAL_ONLY = ("name", "seed", "output_dir", "labels", "plugins")  # a campaign sets these for each trial


def _modules(path: Path, into: Path) -> None:
    """The Python modules a page shows (a block whose first line is `# name.py`), written where its YAML
    examples import their plugins from."""
    for b in blocks(path):
        m = re.match(r"#\s*(\w+\.py)\b", b.text)
        if b.lang == "python" and m:
            (into / m.group(1)).write_text(b.text)


def validate_campaign(data: dict, source: str, plugin_dir: Path) -> None:
    """What `load_campaign` checks (schema, every expanded trial, schedule, shared base), from a dict."""
    from pydantic import ValidationError

    from orchestrator.campaign.expand import _validation_message

    try:
        cfg = CampaignConfig.model_validate(data)
    except ValidationError as err:
        raise UserError(_validation_message(source, CampaignConfig, err)) from None
    trials = expand(cfg, source, "", plugin_paths(cfg, plugin_dir))
    check_schedule(cfg, trials, source)
    check_shared_base(cfg, trials, source)


def check_block(block: Block, tmp: Path) -> None:
    data = yaml.safe_load(block.text)
    assert isinstance(data, dict), f"{block.where}: not a YAML table"
    arg = block.arg.strip()
    context = (ROOT / arg) if arg else tmp
    plugin_dir = context if context.is_dir() else context.parent
    if block.kind == "campaign":
        validate_campaign(data, block.where, plugin_dir)
    elif block.kind == "trial":
        seed = data.get("seed", 0)
        base = {k: v for k, v in data.items() if k not in TRIAL_ONLY}
        validate_campaign({**MINIMAL, "base": base, "seeds": [seed]}, block.where, plugin_dir)
    elif block.kind == "campaign-part":
        whole = yaml.safe_load(context.read_text()) if context.is_file() else MINIMAL
        validate_campaign(deep_merge(whole, data), block.where, plugin_dir)


def _yaml_blocks() -> list[Block]:
    return [b for p in doc_files() for b in blocks(p) if b.lang in ("yaml", "yml")]


def test_every_yaml_block_is_marked():
    unmarked = [b.where for b in _yaml_blocks() if b.kind is None]
    assert not unmarked, ("YAML blocks without a `<!-- yaml: campaign | trial | campaign-part PATH | other WHAT -->` "
                          f"line before them: {unmarked}")
    unexplained = [b.where for b in _yaml_blocks() if b.kind == "other" and not b.arg]
    assert not unexplained, f"`<!-- yaml: other -->` must say what the block is: {unexplained}"


@pytest.mark.parametrize("block", [b for b in _yaml_blocks() if b.kind not in (None, "other")],
                         ids=lambda b: b.where)
def test_yaml_example_validates(block: Block, tmp_path: Path):
    _modules(block.path, tmp_path)
    try:
        check_block(block, tmp_path)
    except UserError as err:
        if re.search(r"dataset file not found: " + re.escape(str(Path.home() / "data")) + r"/", str(err)):
            return  # the reader's own file (`path: ~/data/...`): every key before it validated
        pytest.fail(f"{block.where}: the example does not validate: {err}")


def _parser():
    import sys

    sys.path.insert(0, str(ROOT / "docs" / "hooks"))
    try:
        from reference import cli_parser  # docs/hooks/reference.py: the parser, captured before it parses
    finally:
        sys.path.remove(str(ROOT / "docs" / "hooks"))
    return cli_parser()


SAMPLES = ("2", "0-10", "0.05", "last")  # a placeholder (N, X, ...) after a typed flag: a value its type takes


def parse_shown(parser, argv: list[str]) -> str | None:
    """None when `argv` parses, else argparse's message; placeholders of typed flags get a sample value."""
    from reference import subcommands

    sub = subcommands(parser).get(argv[0]) if argv else None
    typed = {s: a.type for a in (sub._actions if sub else []) for s in a.option_strings if a.type}
    argv = list(argv)
    for i in range(1, len(argv)):
        if re.fullmatch(r"[A-Z][A-Z_]*", argv[i]) and argv[i - 1] in typed:
            for sample in SAMPLES:
                with contextlib.suppress(Exception):
                    typed[argv[i - 1]](sample)
                    argv[i] = sample
                    break
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            parser.parse_args(argv)
    except SystemExit as exc:
        if exc.code:
            return err.getvalue().strip().splitlines()[-1] if err.getvalue().strip() else f"exit {exc.code}"
    return None


def test_every_command_shown_parses():
    parser = _parser()
    shown = [c for p in doc_files() for c in commands(p)]
    assert len(shown) > 20, "the docs show fewer orchestrator commands than expected: is the extraction broken?"
    from reference import subcommands

    names = set(subcommands(parser))
    bad = []
    for c in shown:
        for v in variants(c.text):
            if len(v) == 1 and c.where.split(":")[-1].startswith("~"):  # prose naming a command, no arguments
                named = v[0].strip("{}").split(",") if v[0].startswith("{") else v
                bad += [f"{c.where}: no command {n!r}" for n in named if n not in names]
            elif why := parse_shown(parser, v):
                bad.append(f"{c.where}: {' '.join(v)}: {why}")
    assert not bad, "commands in the docs that the parser refuses:\n" + "\n".join(bad)


def test_campaign_files_named_in_commands_exist():
    missing = [f"{c.where}: {w}" for p in doc_files() for c in commands(p) for v in variants(c.text) for w in v
               if re.fullmatch(r"(campaigns|examples)/[\w./-]+\.yaml", w) and not (ROOT / w).is_file()]
    assert not missing, missing


def test_make_targets_shown_exist():
    targets = set(re.findall(r"^([\w-]+):", (ROOT / "Makefile").read_text(), re.M))
    shown = {(b.where, m) for p in doc_files() for b in blocks(p) if b.lang in ("bash", "sh", "")
             for m in re.findall(r"^make ([\w-]+)", b.text, re.M)}
    shown |= {(str(p.relative_to(ROOT)), m) for p in doc_files() for m in re.findall(r"`make ([\w-]+)`", p.read_text())}
    assert shown and not [s for s in shown if s[1] not in targets], sorted(s for s in shown if s[1] not in targets)
