"""What README.md and docs/ show a user, read out of the Markdown: YAML blocks (each marked with what it is) and
`python -m orchestrator ...` commands, for tests/unit/docs/test_examples.py.

A fenced YAML block is preceded by a marker line (an HTML comment, invisible on GitHub and on the site):
    <!-- yaml: campaign -->            a whole campaign file
    <!-- yaml: trial -->               a trial config, whole or a fragment (every key has a default)
    <!-- yaml: campaign-part PATH -->  a fragment of a campaign file, merged into the campaign file PATH
    <!-- yaml: other WHAT -->          not a file of this project (e.g. a KubeRay spec): not checked
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
MARKER = re.compile(r"^\s*<!--\s*yaml:\s*(campaign-part|campaign|trial|other)\b\s*(.*?)\s*-->\s*$")
FENCE = re.compile(r"^(\s*)(```+|~~~+)\s*([\w+-]*)")
COMMAND = re.compile(r"(?:^|[\s/`(])python -m orchestrator\b")


def doc_files(root: Path = ROOT) -> list[Path]:
    """README.md and every Markdown page of the site's sources (docs/, not its hooks)."""
    return [root / "README.md", *sorted(p for p in (root / "docs").rglob("*.md") if "hooks" not in p.parts)]


@dataclass
class Block:
    path: Path
    line: int  # 1-based line of the opening fence
    lang: str
    text: str
    kind: str | None = None  # the marker's kind (YAML blocks)
    arg: str = ""  # the marker's argument

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def blocks(path: Path) -> list[Block]:
    """The fenced code blocks of a Markdown file, dedented to their fence, with the marker line before each."""
    lines = path.read_text().splitlines()
    out: list[Block] = []
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, fence, lang = m.group(1), m.group(2), m.group(3).lower()
        body: list[str] = []
        j = i + 1
        while j < len(lines) and not lines[j].strip().startswith(fence):
            body.append(lines[j][len(indent):] if lines[j].startswith(indent) else lines[j].lstrip())
            j += 1
        prev = next((lines[k] for k in range(i - 1, -1, -1) if lines[k].strip()), "")
        marker = MARKER.match(prev)
        out.append(Block(path, i + 1, lang, "\n".join(body), marker.group(1) if marker else None,
                         marker.group(2) if marker else ""))
        i = j + 1
    return out


# ----------------------------------------------------------------------------------------------- commands
@dataclass
class Command:
    where: str
    text: str  # as shown, continuation lines joined


def _joined(text: str) -> list[str]:
    """Shell lines with continuations joined: a trailing backslash, or an indented line starting with an
    optional part (`    [--set ...]`) or a flag right after a command line."""
    out: list[str] = []
    for raw in text.splitlines():
        line = raw.rstrip()
        if out and (out[-1].endswith("\\") or (raw[:1].isspace() and line.lstrip()[:1] in ("[", "-"))):
            out[-1] = out[-1].rstrip("\\").rstrip() + " " + line.strip()
        else:
            out.append(line)
    return out


def commands(path: Path) -> list[Command]:
    """Every `python -m orchestrator ...` shown in shell blocks and in inline code of a Markdown file."""
    found: list[Command] = []
    rel = path.relative_to(ROOT)
    for b in blocks(path):
        if b.lang not in ("bash", "sh", "shell", "console", ""):
            continue
        for k, line in enumerate(_joined(b.text)):
            if COMMAND.search(" " + line):
                found.append(Command(f"{rel}:{b.line + 1 + k}", line))
    prose = re.sub(r"^(\s*)(```+|~~~+).*?^\1\2", "", path.read_text(), flags=re.S | re.M)
    for n, line in enumerate(prose.splitlines(), 1):
        for span in re.findall(r"`([^`]+)`", line):
            if COMMAND.search(" " + span):
                found.append(Command(f"{rel}:~{n}", span))
    return found


def _strip(line: str) -> str:
    """From `python -m orchestrator` to the end of the command: no prompt, comment or following command."""
    line = line[line.index("python -m orchestrator"):]
    line = re.split(r"\s#\s|\s#$|\s&&\s|;\s", line + " ")[0]
    return re.sub(r"(?<=\w)\|(?=\w)[^\s\]]*", "", line)  # `15|last`: a value's alternatives, keep the first


def variants(line: str) -> list[list[str]]:
    """The argument lists a shown command stands for: its optional `[...]` parts left out, then each part (and
    each ` | ` alternative of it) put in alone. Words after `python -m orchestrator`."""
    lex = shlex.shlex(_strip(line), posix=True, punctuation_chars="[]|")
    lex.whitespace_split = True
    tokens: list[str] = []
    for tok in lex:
        tokens.extend(tok) if tok and set(tok) <= set("[]|") else tokens.append(tok)
    tokens = [t for t in tokens[3:] if t not in ("...", "…")]

    def parse(pos: int, depth: int) -> tuple[list, int]:
        """A sequence of words and groups (a group: a list of alternative sequences) up to a ']' or the end."""
        alts: list[list] = [[]]
        while pos < len(tokens):
            t = tokens[pos]
            if t == "[":
                group, pos = parse(pos + 1, depth + 1)
                alts[-1].append(group)
            elif t == "]" and depth:
                return alts, pos + 1
            elif t == "|" and depth:
                alts.append([])
                pos += 1
                continue
            elif t == "|":  # a pipe: the command ends
                break
            else:
                alts[-1].append(t)
            if t != "[":
                pos += 1
        return alts, pos

    seq = parse(0, 0)[0][0]

    def minimal(s: list) -> list[str]:
        return [x for x in s if isinstance(x, str)]

    def each(s: list) -> list[list[str]]:
        out = [minimal(s)]
        for gi, x in enumerate(s):
            if isinstance(x, list):
                for alt in x:
                    for inner in each(alt):
                        out.append(minimal(s[:gi]) + inner + minimal(s[gi + 1:]))
        return out

    unique: list[list[str]] = []
    for v in each(seq):
        if v not in unique:
            unique.append(v)
    return unique
