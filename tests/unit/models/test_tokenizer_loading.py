"""`load_tokenizer` on the models this package builds takes the class their tokenizer_config.json names instead
of going through AutoTokenizer (cheaper to import in a trial's driver): for every builder it must be exactly what
AutoTokenizer gives (class, whole tokenizer pipeline, special tokens, chat template, encodings); any other
directory still goes through AutoTokenizer."""

from __future__ import annotations

import shutil

import pytest
from transformers import AutoTokenizer

from workers.models import loading
from workers.models.loading import (
    BUILT_HERE_MARKERS,
    build_tiny_model,
    built_here_tokenizer_class,
    load_tokenizer,
)
from workers.tiny import agent as tiny_agent
from workers.tiny import families, reasoner
from workers.tiny.families import build_family_model
from workers.tiny.reasoner import ReasonerSpec, build_reasoner

TEXTS = ["what is 3 + 4 ? the answer is 7 .", "  Up || Left  ünïcode ✓ 12345", ""]
CHAT = [{"role": "user", "content": "FrozenLake: reach G."}, {"role": "assistant", "content": "<answer>Up</answer>"},
        {"role": "user", "content": "Reward: 0."}]


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("built")
    dirs = {"tiny": build_tiny_model(root / "tiny", seed=0),
            "reasoner": build_reasoner(root / "reasoner", ReasonerSpec(sft_steps=2, batch=4, tokenizer_texts=200,
                                                                       warmup=1))}
    dirs.update({n: build_family_model(n, root / n) for n in families.FAMILIES})
    return {k: str(v) for k, v in dirs.items()}


def test_the_markers_are_the_builders_own():
    assert set(BUILT_HERE_MARKERS) == {loading._MARKER, tiny_agent._MARKER, reasoner.MARKER, families._MARKER}


@pytest.mark.parametrize("name", ["tiny", "reasoner", *families.FAMILIES])
def test_a_built_model_loads_the_tokenizer_autotokenizer_resolves(built, name):
    ours, auto = load_tokenizer(built[name]), AutoTokenizer.from_pretrained(built[name])
    assert built_here_tokenizer_class(built[name]) is type(ours) is type(auto)
    assert ours.backend_tokenizer.to_str() == auto.backend_tokenizer.to_str()
    assert ours.special_tokens_map == auto.special_tokens_map and ours.all_special_ids == auto.all_special_ids
    assert (ours.pad_token_id, ours.eos_token_id, ours.bos_token_id) == (auto.pad_token_id, auto.eos_token_id,
                                                                         auto.bos_token_id)
    assert ours.chat_template == auto.chat_template and len(ours) == len(auto)
    for text in TEXTS:
        assert ours(text)["input_ids"] == auto(text)["input_ids"], text
        ids = auto(text, add_special_tokens=False)["input_ids"]
        assert ours.decode(ids) == auto.decode(ids)
    if auto.chat_template:
        assert (ours.apply_chat_template(CHAT, add_generation_prompt=True, tokenize=False)
                == auto.apply_chat_template(CHAT, add_generation_prompt=True, tokenize=False))


def test_any_other_directory_goes_through_autotokenizer(built, tmp_path):
    plain = tmp_path / "plain"
    shutil.copytree(built["tiny"], plain)
    (plain / loading._MARKER).unlink()  # the same files, not built here as far as anyone can tell
    assert built_here_tokenizer_class(str(plain)) is None
    assert built_here_tokenizer_class(str(tmp_path / "missing")) is None
    assert load_tokenizer(str(plain))("what is 3 + 4 ?")["input_ids"] == \
        load_tokenizer(built["tiny"])("what is 3 + 4 ?")["input_ids"]
