"""Planning-token detection by strategic grams.

`planning_mask(pieces, grams)` takes the decoded text piece of each token of one completion (their
concatenation is the completion text) and marks exactly the tokens whose characters overlap an occurrence of
a strategic gram: case-insensitive, on word boundaries, tolerant to runs of whitespace and to typographic
apostrophes. Grams split across subword tokens ("doub" + "le check") are found because matching runs on the
joined text and is mapped back to tokens through character offsets.

The detector is swappable: any callable with the same signature can be named by dotted path in
`credit.planning_detector`.
"""

from __future__ import annotations

import re
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Sequence
from functools import lru_cache
from itertools import accumulate

import torch
from torch import Tensor

# Footnote 3 of the paper: the 18 strategic grams, by category.
DEFAULT_GRAMS: tuple[str, ...] = (
    # hesitation
    "wait let me", "let me think", "on second thought",
    # verification
    "let me check", "let me verify", "is this right", "double check",
    # backtracking
    "try another approach", "go back and", "start over", "that's not right", "that doesn't work",
    # alternatives
    "another way to", "or we could", "what if we",
    # metacognition
    "notice that", "the key is", "the key insight",
)  # fmt: skip

_APOSTROPHES = "'\u2019\u2018\u02bc\u0060\u00b4"
Detector = Callable[..., list[bool]]


def _gram_pattern(gram: str) -> str:
    words = gram.split()
    parts = []
    for word in words:
        # Any apostrophe-like character matches any other; everything else literally.
        parts.append("".join(f"[{_APOSTROPHES}]" if ch in _APOSTROPHES else re.escape(ch) for ch in word))
    return r"\s+".join(parts)


@lru_cache(maxsize=64)
def compile_grams(grams: tuple[str, ...]) -> re.Pattern[str]:
    """One case-insensitive regex for all grams, longest first so the widest match wins at a position."""
    cleaned = sorted({" ".join(g.split()).lower() for g in grams if g.strip()}, key=len, reverse=True)
    if not cleaned:
        raise ValueError("strategic grams must contain at least one non-empty gram")
    body = "|".join(_gram_pattern(g) for g in cleaned)
    return re.compile(rf"(?<!\w)(?:{body})(?!\w)", re.IGNORECASE)


def match_spans(text: str, grams: Sequence[str] | None = None) -> list[tuple[int, int]]:
    """Character spans `[start, end)` of every gram occurrence, overlapping ones included."""
    rx = compile_grams(tuple(grams) if grams is not None else DEFAULT_GRAMS)
    spans = []
    pos = 0
    while (m := rx.search(text, pos)) is not None:
        spans.append(m.span())
        pos = m.start() + 1  # restart just after this start so overlapping grams are found too
    return spans


def planning_mask(pieces: Sequence[str], grams: Sequence[str] | None = None) -> list[bool]:
    """Mark the tokens whose characters overlap a strategic-gram occurrence.

    Args:
        pieces: decoded text of each token, in order; `"".join(pieces)` is the completion text.
        grams: strategic grams (default: `DEFAULT_GRAMS`).
    Returns:
        One bool per piece. Empty pieces are never marked (they have no characters).
    """
    text = "".join(pieces)
    out = [False] * len(pieces)
    spans = match_spans(text, grams)
    if not spans:
        return out
    ends = list(accumulate(map(len, pieces)))
    starts = [e - len(p) for e, p in zip(ends, pieces, strict=True)]
    for s, e in spans:
        first = bisect_right(ends, s)  # first token ending after the match starts
        last = bisect_left(starts, e)  # first token starting at/after the match end
        for i in range(first, last):
            if ends[i] > starts[i]:
                out[i] = True
    return out


def planning_masks(
    batch_pieces: Sequence[Sequence[str]],
    length: int,
    grams: Sequence[str] | None = None,
    detector: Detector | None = None,
) -> Tensor:
    """Pad per-completion masks into a `[B, length]` bool tensor (pieces beyond `length` are ignored)."""
    detect = detector or planning_mask
    out = torch.zeros(len(batch_pieces), length, dtype=torch.bool)
    for i, pieces in enumerate(batch_pieces):
        row = detect(pieces, grams)
        if len(row) != len(pieces):
            raise ValueError(f"planning detector returned {len(row)} flags for {len(pieces)} tokens")
        n = min(len(row), length)
        if any(row[:n]):
            out[i, :n] = torch.tensor(row[:n], dtype=torch.bool)
    return out
