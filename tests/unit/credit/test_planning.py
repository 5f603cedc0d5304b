"""Planning-token masks on subword tokenisations."""

import pytest
import torch

from workers.credit import DEFAULT_GRAMS, CreditConfig, planning_mask, planning_masks
from workers.credit.planning import match_spans


def marked(pieces, grams=None):
    return [p for p, m in zip(pieces, planning_mask(pieces, grams), strict=False) if m]


def test_default_grams_are_the_papers_18():
    assert len(DEFAULT_GRAMS) == 18 and "the key insight" in DEFAULT_GRAMS and "that's not right" in DEFAULT_GRAMS


def test_gram_split_across_subwords():
    pieces = ["So", " I", " should", " doub", "le", " check", " the", " sum", "."]
    assert marked(pieces) == [" doub", "le", " check"]


def test_apostrophe_gram_split_across_tokens():
    pieces = ["Hmm", ",", " that", "'s", " not", " right", " at", " all"]
    assert marked(pieces) == [" that", "'s", " not", " right"]


def test_typographic_apostrophe_case_and_whitespace_runs():
    pieces = ["THAT", "\u2019s  ", "Not\n", "Right"]
    assert marked(pieces) == pieces


def test_word_boundaries_respected():
    assert marked(["un", "notice", " that"]) == []  # "unnotice that" is not the gram
    assert marked(["notice", " thats"]) == []
    assert marked(["notice", " that", "s"]) == []  # the gram must end on a word boundary
    assert marked(["(notice", " that)"]) == ["(notice", " that)"]


def test_no_tokens_before_or_after_match_are_marked():
    pieces = ["x", " = ", "2", ".", " Wait", " let", " me", " re", "do", " it"]
    assert planning_mask(pieces) == [False] * 4 + [True] * 3 + [False] * 3


def test_token_partly_overlapping_is_marked():
    # A piece that holds the end of a gram plus more text overlaps the gram, so it is marked.
    assert marked(["a", " notice th", "at b", "c"]) == [" notice th", "at b"]


def test_overlapping_grams_cover_their_union():
    pieces = ["wait", " let", " me", " think", " now"]
    assert planning_mask(pieces) == [True, True, True, True, False]
    spans = match_spans("the key insight is the key is")
    assert (0, 15) in spans and (19, 29) in spans


def test_empty_pieces_never_marked():
    assert planning_mask(["let", "", " me", " check"]) == [True, False, True, True]
    assert planning_mask([]) == []


def test_custom_grams_list_and_comma_string():
    pieces = ["we", " must", " reconsider", " this"]
    assert marked(pieces, ["must reconsider"]) == [" must", " reconsider"]
    cfg = CreditConfig(strategic_grams="must reconsider,  hold on ")
    assert cfg.strategic_grams == ["must reconsider", "hold on"]
    assert marked(["hold", " on"], cfg.strategic_grams) == ["hold", " on"]
    with pytest.raises(ValueError):
        CreditConfig(strategic_grams=" , ")


def test_batch_masks_pad_and_swap_detector():
    rows = [["let", " me", " check"], ["ok"]]
    out = planning_masks(rows, 4)
    assert out.tolist() == [[True, True, True, False], [False] * 4]
    everything = planning_masks(rows, 4, detector=lambda pieces, grams: [True] * len(pieces))
    assert out.dtype == torch.bool and everything.tolist() == [[True, True, True, False], [True, False, False, False]]
    with pytest.raises(ValueError, match="flags"):
        planning_masks(rows, 4, detector=lambda pieces, grams: [True])
