"""The tiny reasoner's build: deterministic from its seed, cached by its whole spec, subword grams."""

from __future__ import annotations

import json

from workers.tasks.chain import TraceStyle
from workers.tiny.reasoner import MARKER, ReasonerSpec, build_reasoner

SMALL = ReasonerSpec(sft_steps=4, batch=8, tokenizer_texts=300, warmup=2)


def test_build_is_deterministic_and_cached(tmp_path):
    a = build_reasoner(tmp_path / "a", SMALL)
    b = build_reasoner(tmp_path / "b", SMALL)
    for name in ("model.safetensors", "tokenizer.json", "config.json"):
        assert (a / name).read_bytes() == (b / name).read_bytes(), name
    info = json.loads((a / MARKER).read_text())
    assert info["spec"]["seed"] == 0 and info["spec"]["style"] == {"error": 0.3, "catch": 0.3, "verify": 0.04,
                                                                    "plan": 0.04}
    stamp = (a / "model.safetensors").stat().st_mtime_ns
    assert build_reasoner(tmp_path / "a", SMALL) == a  # cached: nothing rebuilt
    assert (a / "model.safetensors").stat().st_mtime_ns == stamp
    other = build_reasoner(tmp_path / "a", ReasonerSpec(**{**SMALL.__dict__, "seed": 1}))  # spec changed: rebuilt
    assert (other / "model.safetensors").read_bytes() != (b / "model.safetensors").read_bytes()
    assert json.loads((other / MARKER).read_text())["spec"]["seed"] == 1
    assert SMALL.key() != ReasonerSpec(**{**SMALL.__dict__, "style": TraceStyle(error=0.2)}).key()


def test_tokenizer_is_subword_with_single_digits(tmp_path):
    from transformers import AutoTokenizer

    from workers.credit.planning import planning_mask
    from workers.models.loading import token_pieces

    tok = AutoTokenizer.from_pretrained(build_reasoner(tmp_path / "m", SMALL))
    text = " 12 + 7 = 19 . double check 12 + 7 = 19 . answer 19"
    ids = tok(text)["input_ids"]
    pieces = token_pieces(tok, ids)
    assert "".join(pieces) == text == tok.decode(ids)
    assert [p for p in pieces if p.strip().isdigit()] == [" 1", "2", " 7", " 1", "9"] * 2 + [" 1", "9"]
    mask = planning_mask(pieces)
    marked = [p for p, m in zip(pieces, mask, strict=True) if m]
    assert "".join(marked).strip() == "double check" and len(marked) > 2  # the gram spans several subwords
