"""The one loader for every YAML file a command reads (campaigns for expand/run/status/report/submit, trial
configs for `trial`). Every way a file can be unusable is a `UserError`: one line naming the file (and, where
there is one, the key path and line), which the CLI prints before exiting with code 2.

Refused, before anything is constructed from the file:
- a path that is missing, a directory, unreadable, or larger than `MAX_BYTES`;
- bytes that are not UTF-8 text (a UTF-8 byte-order mark is accepted);
- YAML syntax errors, and tags other than the standard ones (`yaml.SafeLoader`);
- a key that appears twice in one mapping, at any depth (YAML says keys are unique; PyYAML would silently keep
  the last one): the message names the key path and both lines;
- anchors/aliases whose expansion would exceed `MAX_NODES` nodes (alias bombs, "billion laughs") or that refer
  to themselves; the size is counted on the composed node graph, so nothing is expanded to find out;
- an empty document and a top level that is not a mapping.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Any

import yaml

from orchestrator.config.errors import UserError

MAX_BYTES = 4 * 1024 * 1024  # a campaign file is a few KiB; anything this large is not one
MAX_NODES = 100_000  # YAML nodes after alias expansion (the largest shipped campaign has a few hundred)

_MERGE_TAG = "tag:yaml.org,2002:merge"


def _line(node: yaml.Node) -> int:
    return node.start_mark.line + 1


def _key_text(node: yaml.Node) -> str:
    return str(node.value) if isinstance(node, yaml.ScalarNode) else f"<{node.id} key at line {_line(node)}>"


def _dotted(path: tuple[str, ...]) -> str:
    return ".".join(path) or "<root>"


def _check_duplicates(source: str, node: yaml.Node, path: tuple[str, ...], seen: set[int]) -> None:
    """Raise on a key repeated within one mapping, anywhere under `node` (each shared node checked once)."""
    if id(node) in seen:
        return
    seen.add(id(node))
    if isinstance(node, yaml.MappingNode):
        first: dict[tuple[str, str], yaml.Node] = {}
        for key, value in node.value:
            if key.tag == _MERGE_TAG:  # `<<: *base` merges; later explicit keys override it by design
                _check_duplicates(source, value, path, seen)
                continue
            if isinstance(key, yaml.ScalarNode):
                ident = (key.tag, key.value)
                if ident in first:
                    where = _dotted((*path, str(key.value)))
                    raise UserError(f"{source}: {where}: key appears twice in one mapping (lines "
                                    f"{_line(first[ident])} and {_line(key)}); each key may appear once")
                first[ident] = key
            _check_duplicates(source, value, (*path, _key_text(key)), seen)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _check_duplicates(source, item, (*path, str(i)), seen)


def _expanded_size(source: str, root: yaml.Node) -> int:
    """Nodes the document would have with every alias expanded, counted without expanding (memoised on the
    shared node objects aliases compose to). Stops as soon as the count passes `MAX_NODES`."""
    sizes: dict[int, int] = {}
    active: set[int] = set()

    def size(node: yaml.Node) -> int:
        key = id(node)
        if key in sizes:
            return sizes[key]
        if key in active:
            raise UserError(f"{source}: line {_line(node)}: a YAML anchor refers to itself (recursive alias); "
                            "anchors may only refer to finished nodes")
        active.add(key)
        total = 1
        if isinstance(node, yaml.MappingNode):
            children = [c for pair in node.value for c in pair]
        elif isinstance(node, yaml.SequenceNode):
            children = node.value
        else:
            children = []
        for child in children:
            total += size(child)
            if total > MAX_NODES:
                raise UserError(f"{source}: line {_line(node)}: anchors/aliases expand this file past "
                                f"{MAX_NODES:,} YAML nodes; refused without expanding (alias bomb?). Write the "
                                "values out or use fewer nested aliases")
        active.discard(key)
        sizes[key] = total
        return total

    return size(root)


def _read_bytes(p: Path) -> bytes:
    try:
        st = p.stat()
    except FileNotFoundError:
        raise UserError(f"{p}: no such file") from None
    except OSError as exc:
        raise UserError(f"{p}: cannot read ({exc.strerror or exc})") from None
    if p.is_dir():
        raise UserError(f"{p}: is a directory; expected a YAML file")
    if not p.is_file():
        raise UserError(f"{p}: not a regular file; expected a YAML file")
    if st.st_size > MAX_BYTES:
        raise UserError(f"{p}: {st.st_size:,} bytes; config files are limited to {MAX_BYTES:,} bytes")
    try:
        with p.open("rb") as fh:
            return fh.read(MAX_BYTES + 1)
    except OSError as exc:
        why = "permission denied" if exc.errno in (errno.EACCES, errno.EPERM) else (exc.strerror or str(exc))
        raise UserError(f"{p}: cannot read ({why})") from None


def _decode(p: Path, raw: bytes) -> str:
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise UserError(f"{p}: not UTF-8 text (byte 0x{raw[exc.start]:02x} at offset {exc.start}); config files "
                        "must be UTF-8 YAML") from None
    if "\x00" in text:
        raise UserError(f"{p}: not text (NUL byte at offset {text.index(chr(0))}); config files must be UTF-8 YAML")
    return text


def _yaml_error(p: Path, exc: yaml.YAMLError) -> UserError:
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    if mark is None and isinstance(exc, yaml.reader.ReaderError):
        return UserError(f"{p}: character {exc.character!r} at offset {exc.position} is not allowed in YAML")
    where = f" line {mark.line + 1}:" if mark is not None else ""
    problem = getattr(exc, "problem", None) or str(exc).replace("\n", " ")
    return UserError(f"{p}:{where} invalid YAML ({problem})")


def parse_yaml(text: str, source: str) -> Any:
    """The document in `text`, with duplicate keys and alias bombs refused (UserError naming `source`)."""
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _expanded_size(source, node)
        _check_duplicates(source, node, (), set())
        return loader.construct_document(node)
    except yaml.YAMLError as exc:
        raise _yaml_error(Path(source), exc) from None
    except RecursionError:
        raise UserError(f"{source}: nested too deeply to read") from None
    finally:
        loader.dispose()


def load_yaml(path: str | os.PathLike) -> dict[str, Any]:
    """Read a YAML config file whose top level is a mapping; every problem is a one-line UserError."""
    p = Path(path)
    text = _decode(p, _read_bytes(p))
    if not text.strip():
        raise UserError(f"{p}: empty file; expected a mapping of keys (see campaigns/ for examples)")
    data = parse_yaml(text, str(p))
    if data is None:
        raise UserError(f"{p}: no content (only comments); expected a mapping of keys")
    if not isinstance(data, dict):
        raise UserError(f"{p}: <root>: expected a mapping of keys, got {type(data).__name__}")
    return data
