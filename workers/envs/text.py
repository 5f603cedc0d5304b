"""The text face shared by the grid environments: grid rendering and the fixed answer grammar.

The model answers `<answer>Up || Left</answer>`, optionally after `<think>...</think>`. Model text is data: it is
matched against one fixed regular grammar and nothing in it is ever evaluated. Whitespace inside the tags and
around `||` is tolerated because word-level tokenizers decode with spaces between tokens
(`< answer > Up | | Left < / answer >`).
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


def render_grid(rows: Sequence[Sequence[str]]) -> str:
    """Rows of one-character cell symbols, cells separated by a space (one token per cell for every tokenizer)."""
    return "\n".join(" ".join(row) for row in rows)
