"""A `_`-prefixed name is private to its module: no module of orchestrator/ or workers/ imports one from another
project module. A name other modules need is public (no underscore), so its users are visible and renaming it
is a deliberate API change. Third-party private imports (torch internals) are outside this rule."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("orchestrator", "workers")


def _module(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _source(node: ast.ImportFrom, path: Path) -> str:
    """The absolute module an ImportFrom reads from (relative imports resolved against `path`'s package)."""
    if not node.level:
        return node.module or ""
    pkg = _module(path).split(".")
    if path.name != "__init__.py":
        pkg = pkg[:-1]
    pkg = pkg[: len(pkg) - (node.level - 1)]
    return ".".join(pkg + ([node.module] if node.module else []))


def private_imports() -> list[str]:
    """`file:line: from module import _name` for every private name imported from a project module."""
    found = []
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
                if not isinstance(node, ast.ImportFrom):
                    continue
                source = _source(node, path)
                if source.split(".")[0] not in PACKAGES:
                    continue
                for alias in node.names:
                    if alias.name.startswith("_") and not alias.name.startswith("__"):
                        found.append(f"{path.relative_to(ROOT)}:{node.lineno}: from {source} import {alias.name}")
    return found


def test_no_private_name_is_imported_across_modules():
    assert private_imports() == []
