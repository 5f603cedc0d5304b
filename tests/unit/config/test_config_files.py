"""The one YAML loader: unusable files are one line naming the file, exit 2, for every command that reads YAML,
and nothing is launched or written for them. (The corpus of malformed campaign files is in bad_campaigns/.)"""

from __future__ import annotations

import errno
from pathlib import Path

import pytest
import yaml

from orchestrator import cli
from orchestrator.config.errors import UserError
from orchestrator.config.files import MAX_NODES, load_yaml, parse_yaml

ROOT = Path(__file__).resolve().parents[3]
SHIPPED = sorted((ROOT / "campaigns").rglob("*.yaml"))

DUPLICATE = """\
name: dup
seeds: [0]
storage: {storage}
base:
  steps: 4
  steps: 400
conditions: {{C1: {{}}}}
"""


def _one_line_exit_2(argv: list[str], capsys, needle: str) -> str:
    assert cli.main(argv) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in captured.err, captured.err
    assert needle in lines[0], lines[0]
    assert captured.out == ""
    return lines[0]


@pytest.mark.parametrize("path", SHIPPED, ids=[p.stem for p in SHIPPED])
def test_shipped_campaigns_read_the_same_as_plain_safe_load(path):
    assert load_yaml(path) == yaml.safe_load(path.read_text())


@pytest.mark.parametrize("command", ["expand", "run", "status", "report", "submit"])
def test_every_campaign_command_refuses_a_duplicate_key_and_writes_nothing(command, tmp_path, capsys):
    storage = tmp_path / "storage"
    f = tmp_path / "c.yaml"
    f.write_text(DUPLICATE.format(storage=storage))
    line = _one_line_exit_2([command, str(f)], capsys, "base.steps: key appears twice in one mapping (lines 5 and 6)")
    assert line.startswith(f"error: {f}:")
    assert not storage.exists()  # nothing launched, no campaign directory


def test_trial_command_uses_the_same_loader(tmp_path, capsys):
    f = tmp_path / "t.yaml"
    f.write_text("steps: 3\nrollout: {n: 4, n: 8}\n")
    _one_line_exit_2(["trial", str(f), "--storage", str(tmp_path / "s")], capsys,
                     f"{f}: rollout.n: key appears twice in one mapping (lines 2 and 2)")
    assert not (tmp_path / "s").exists()


@pytest.mark.parametrize("case, needle", [
    ("missing", "no such file"),
    ("directory", "is a directory; expected a YAML file"),
    ("empty", "empty file; expected a mapping of keys"),
    ("blank", "empty file; expected a mapping of keys"),
    ("scalar", "<root>: expected a mapping of keys, got str"),
    ("binary", "not UTF-8 text (byte 0x89 at offset 0)"),
    ("utf16", "not UTF-8 text"),
    ("huge", "config files are limited to"),
])
def test_unusable_files_for_every_command(case, needle, tmp_path, capsys):
    f = tmp_path / "campaign.yaml"
    if case == "directory":
        f.mkdir()
    elif case == "empty":
        f.write_bytes(b"")
    elif case == "blank":
        f.write_text("\n   \n\t\n")
    elif case == "scalar":
        f.write_text("just a sentence\n")
    elif case == "binary":
        f.write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR")
    elif case == "utf16":
        f.write_bytes("name: x\nseeds: [0]\n".encode("utf-16"))
    elif case == "huge":
        f.write_bytes(b"# " + b"x" * (4 * 1024 * 1024 + 10) + b"\n")
    for command in ("expand", "run", "status", "report", "submit"):
        line = _one_line_exit_2([command, str(f)], capsys, needle)
        assert line.startswith(f"error: {f}: ")
    _one_line_exit_2(["trial", str(f), "--storage", str(tmp_path / "s")], capsys, needle)
    assert sorted(p.name for p in tmp_path.iterdir()) == (["campaign.yaml"] if case != "missing" else [])


def test_unreadable_file(tmp_path, capsys, monkeypatch):
    f = tmp_path / "c.yaml"
    f.write_text("name: x\n")
    real_open = Path.open

    def deny(self, *a, **kw):
        if self == f:
            raise PermissionError(errno.EACCES, "Permission denied", str(self))
        return real_open(self, *a, **kw)

    monkeypatch.setattr(Path, "open", deny)  # chmod 000 does not stop root, which runs CI containers
    _one_line_exit_2(["expand", str(f)], capsys, f"{f}: cannot read (permission denied)")


def test_duplicate_keys_at_any_depth_name_path_and_both_lines():
    text = "a:\n  b:\n    - {x: 1}\n    - x: 1\n      y: 2\n      x: 3\n"
    with pytest.raises(UserError) as e:
        parse_yaml(text, "f.yaml")
    assert str(e.value) == ("f.yaml: a.b.1.x: key appears twice in one mapping (lines 4 and 6); "
                            "each key may appear once")
    # the same key in different mappings, and a merge key overridden explicitly, are fine
    assert parse_yaml("a: {x: 1}\nb: {x: 2}\n", "f") == {"a": {"x": 1}, "b": {"x": 2}}
    merged = parse_yaml("base: &b {lr: 1, steps: 4}\nc: {<<: *b, lr: 2}\n", "f")
    assert merged["c"] == {"lr": 2, "steps": 4}


def test_aliases_within_the_limit_are_expanded_and_bombs_are_not():
    ok = parse_yaml("a: &a [1, 2, 3]\nb: [*a, *a]\n", "f")
    assert ok == {"a": [1, 2, 3], "b": [[1, 2, 3], [1, 2, 3]]}
    # 10 levels of 10 aliases: 10^10 nodes if expanded. Refused at once (this test would hang otherwise).
    lines = ['l0: &l0 ["x", "x", "x", "x", "x", "x", "x", "x", "x", "x"]']
    lines += [f"l{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * 10) + "]" for i in range(1, 10)]
    with pytest.raises(UserError, match=f"expand this file past {MAX_NODES:,} YAML nodes"):
        parse_yaml("\n".join(lines), "bomb.yaml")
    # just under the limit is accepted: 3 levels of 10 = 1,111 nodes
    small = parse_yaml("\n".join(lines[:3]), "f")
    assert len(small["l2"]) == 10 and small["l2"][0][0] == ["x"] * 10
