"""The text face shared by the grid environments: grid rendering and the two fixed answer grammars.

Model text is data: it is matched against a fixed regular grammar and nothing in it is ever evaluated.
- `parse_strict` (protocol `ragen`, RAGEN's parse): `<think>...</think>`, only whitespace, then
  `<answer>...</answer>`, case-sensitive tags; the answer's items split on `||`, empty items dropped, the first
  `max_actions` kept, unknown words dropped (and the turn marked invalid).
- `parse_answer` (protocol `plain`): the first `<answer>...</answer>` block, think optional; whitespace inside
  the tags and around `||` tolerated (word-level tokenizers decode as `< answer > Up | | Left < / answer >`).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

ACTION_NAMES: tuple[str, ...] = ("Up", "Down", "Left", "Right")
MAX_TEXT_CHARS = 20_000  # a turn's text beyond this is ignored (bounded work on arbitrary model output)

_ANSWER = re.compile(r"<\s*answer\s*>(.*?)<\s*/\s*answer\s*>", re.DOTALL | re.IGNORECASE)
_SEP = re.compile(r"\|\s*\|")


@dataclass(frozen=True)
class ParsedTurn:
    """What one turn's text asked for: `actions` (indices into the action names, at most the cap, invalid ones
    dropped) and whether anything was invalid (an unknown or empty item, or no answer block at all)."""

    actions: tuple[int, ...]
    invalid: bool
    items: int = 0  # items read (at most the cap); items - len(actions) of them were invalid


def format_answer(actions: Sequence[str]) -> str:
    """The canonical answer text for a list of action names: `<answer>Up || Left</answer>`."""
    return "<answer>" + " || ".join(actions) + "</answer>"


def parse_answer(text: str, names: Sequence[str] = ACTION_NAMES, max_actions: int = 2) -> ParsedTurn:
    """Parse the first `<answer>...</answer>` block of `text`; never raises for any string.

    Items are split on `||`, stripped and matched case-insensitively against `names`. Only the first
    `max_actions` items are read (the rest are cut, as the turn protocol says); among those, unknown or empty
    items are dropped and mark the turn invalid. No answer block: no actions, invalid.
    """
    if not isinstance(text, str):
        return ParsedTurn((), True)
    m = _ANSWER.search(text[:MAX_TEXT_CHARS])
    if m is None:
        return ParsedTurn((), True)
    lookup = {n.lower(): i for i, n in enumerate(names)}
    items = _SEP.split(m.group(1))[: max(max_actions, 0)]
    actions = [lookup.get(item.strip().lower()) for item in items]
    valid = tuple(a for a in actions if a is not None)
    return ParsedTurn(valid, invalid=len(valid) != len(actions) or not valid, items=len(actions))


_STRICT = re.compile(r"<think>(.*?)</think>\s*<answer>(.*?)</answer>", re.DOTALL)
_TAGS = ("<think>", "</think>", "<answer>", "</answer>", "<|im_start|>", "<|im_end|>")


def parse_strict(text: str, names: Sequence[str] = ACTION_NAMES, max_actions: int = 2) -> ParsedTurn:
    """RAGEN's parse of one turn (`text` includes the `<think>` prefill); never raises for any string.

    The first `<think>` must be followed by `</think>`, only whitespace, and an `<answer>...</answer>` block
    (tags exactly so: case and spacing matter). The answer's items are split on `||` and stripped; empty ones are
    dropped silently, only the first `max_actions` are read (the rest are cut), and among those an item naming no
    action (case-insensitive) is dropped and marks the turn invalid, as does an answer with no valid action.
    """
    if not isinstance(text, str):
        return ParsedTurn((), True)
    text = text[:MAX_TEXT_CHARS]
    start = text.find("<think>")
    # a match from a later <think> implies one from the first (.*? spans it), so the first is the only start
    m = _STRICT.match(text, start) if start >= 0 else None
    if m is None:
        return ParsedTurn((), True)
    body = m.group(2)
    for tag in _TAGS:
        body = body.replace(tag, "")
    items = [item.strip() for item in body.split("||") if item.strip()][: max(max_actions, 0)]
    lookup = {n.lower(): i for i, n in enumerate(names)}
    valid = tuple(lookup[item.lower()] for item in items if item.lower() in lookup)
    return ParsedTurn(valid, invalid=len(valid) != len(items) or not valid, items=len(items))


def render_grid(rows: Sequence[Sequence[str]], spaced: bool = True) -> str:
    """Rows of one-character cell symbols; `spaced`: cells separated by a space (protocol `plain`), else joined
    (protocol `ragen`)."""
    return "\n".join((" " if spaced else "").join(row) for row in rows)
