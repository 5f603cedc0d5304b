"""Multi-turn token assembly on the seeds' families (tiny Qwen2 / Qwen3 models built by workers/tiny/families.py with
a byte-level BPE Qwen2Tokenizer): glue without the prefix property, end-of-turn stop tokens, no doubled end
token, system message and prefill."""

from __future__ import annotations

import pytest

from workers.envs.tokens import cut_at_stop, end_of_turn_id, first_prompt_ids, observation_ids, stop_token_ids
from workers.models.loading import load_tokenizer
from workers.tiny.families import ENDOFTEXT, IM_END, QWEN25_SYSTEM, build_family_model

PROMPT, ANSWER, OBS = "FrozenLake: reach the goal G.", "<answer>Up || Left</answer>", "Reward: 0. State: P_G"


@pytest.fixture(scope="module")
def toks(tmp_path_factory):
    root = tmp_path_factory.mktemp("families")
    return {n: load_tokenizer(str(build_family_model(n, root / n))) for n in
            ("tiny-qwen2-base", "tiny-qwen2-instruct", "tiny-qwen3", "tiny-qwen3-2507")}


def _whole(tok, answer, **kw):
    msgs = [{"role": "user", "content": PROMPT}, {"role": "assistant", "content": answer},
            {"role": "user", "content": OBS}]
    return list(tok(tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False, **kw),
                    add_special_tokens=False)["input_ids"])


def _sampled(tok, text, end):
    return list(tok(text, add_special_tokens=False)["input_ids"]) + [tok.convert_tokens_to_ids(end)]


def test_the_tokenizer_is_a_byte_level_qwen2_tokenizer(toks):
    tok = toks["tiny-qwen3"]
    assert type(tok).__name__ == "Qwen2Tokenizer"
    text = "Sokoban: push ✓ the box — ünïcode"  # bytes outside the training text still round-trip
    assert tok.decode(tok(text, add_special_tokens=False)["input_ids"]) == text
    assert toks["tiny-qwen2-base"].eos_token == ENDOFTEXT and tok.eos_token == IM_END


@pytest.mark.parametrize("name", ["tiny-qwen2-instruct", "tiny-qwen3-2507", "tiny-qwen3"])
def test_turns_equal_the_template_of_the_whole_conversation(toks, name):
    tok = toks[name]
    sampled = _sampled(tok, ANSWER, IM_END)  # stopped on its end-of-turn token
    ours = first_prompt_ids(tok, PROMPT) + sampled + observation_ids(tok, OBS, sampled)
    assert ours == _whole(tok, ANSWER)


def test_qwen3_keeps_the_sampled_think_block_the_template_would_drop(toks):
    """Templating two turns is not a prefix of templating three under Qwen3; the glue does not need it and the
    context keeps the think block exactly as sampled."""
    tok = toks["tiny-qwen3"]
    msgs = [{"role": "user", "content": PROMPT}, {"role": "assistant", "content": "<think>\nhm\n</think>\n\nUp"}]
    two = tok.apply_chat_template(msgs, tokenize=False)
    three = tok.apply_chat_template(msgs + [{"role": "user", "content": OBS}], add_generation_prompt=True,
                                    tokenize=False)
    assert not three.startswith(two)  # the reason the old glue refused this template
    answer = "<think>\nhm\n</think>\n\n" + ANSWER
    sampled = _sampled(tok, answer, IM_END)
    ours = first_prompt_ids(tok, PROMPT) + sampled + observation_ids(tok, OBS, sampled)
    assert tok.decode(ours) == tok.decode(_whole(tok, ANSWER)).replace(ANSWER, answer, 1)


def test_base_model_stops_at_im_end_and_never_doubles_an_end_token(toks):
    tok = toks["tiny-qwen2-base"]
    eot, eos = tok.convert_tokens_to_ids(IM_END), tok.convert_tokens_to_ids(ENDOFTEXT)
    assert end_of_turn_id(tok) == eot and stop_token_ids(tok) == sorted([eos, eot])
    assert stop_token_ids(toks["tiny-qwen3"]) == [eot]  # instruct: eos is the end-of-turn token
    sampled = _sampled(tok, ANSWER, IM_END)
    seq = sampled + observation_ids(tok, OBS, sampled)
    assert (eot, eot) not in zip(seq, seq[1:], strict=False)
    assert tok.decode(seq).startswith(ANSWER + IM_END + "\n<|im_start|>user\n" + OBS)
    cut = _sampled(tok, ANSWER, ENDOFTEXT)[:-1]  # cut by max_tokens: the glue closes the turn
    assert observation_ids(tok, OBS, cut)[0] == eot


def test_a_turn_that_stopped_on_eos_is_closed_on_the_observation_side(toks):
    """tiny-qwen2-base stops on `<|endoftext|>`: the sampled ids stay as sampled and the observation's ids begin
    with `<|im_end|>`, so turn 2 reads well-formed ChatML; the loss mask (sampled ids only) excludes it."""
    tok = toks["tiny-qwen2-base"]
    eot, eos = tok.convert_tokens_to_ids(IM_END), tok.convert_tokens_to_ids(ENDOFTEXT)
    sampled = _sampled(tok, ANSWER, ENDOFTEXT)
    obs = observation_ids(tok, OBS, sampled, prefill="<think>")
    assert sampled[-1] == eos and obs[0] == eot
    assert tok.decode(sampled + obs) == (ANSWER + "<|endoftext|><|im_end|>\n<|im_start|>user\n" + OBS
                                         + "<|im_end|>\n<|im_start|>assistant\n<think>")
    mask = [True] * len(sampled) + [False] * len(obs)  # what the episode player writes (sampled ids only)
    assert [t for t, m in zip(sampled + obs, mask, strict=True) if m] == sampled


@pytest.mark.parametrize("name", ["tiny-qwen2-base", "tiny-qwen2-instruct", "tiny-qwen3", "tiny-qwen3-2507"])
def test_every_stop_token_leaves_one_end_of_turn_token(toks, name):
    """Every family's template, every stop token (and a turn cut by max_tokens): exactly one end-of-turn token
    closes the turn, on the observation side unless the model sampled it."""
    tok = toks[name]
    eot = end_of_turn_id(tok)
    for stop in [*stop_token_ids(tok), None]:
        sampled = list(tok(ANSWER, add_special_tokens=False)["input_ids"]) + ([stop] if stop is not None else [])
        obs = observation_ids(tok, OBS, sampled)
        seq = sampled + obs
        closing = seq[len(sampled) - (stop == eot):]
        assert closing[0] == eot and eot not in closing[1:closing.index(tok.convert_tokens_to_ids("<|im_start|>"))]
        assert (obs[0] == eot) == (stop != eot)


def test_a_sample_forced_past_im_end_is_cut_there(toks):
    """A base model that ran past its turn's end (written `<|im_end|>`, then an invented user turn) keeps only
    its turn: the rest is never trained on nor fed back as context."""
    tok = toks["tiny-qwen2-base"]
    ids = _sampled(tok, ANSWER, IM_END) + list(tok("\n<|im_start|>user\nI win<|im_end|>", add_special_tokens=False)
                                               ["input_ids"])
    lps = [-0.1 * (k + 1) for k in range(len(ids))]
    kept, kept_lp = cut_at_stop(ids, lps, stop_token_ids(tok))
    assert tok.decode(kept) == ANSWER + IM_END and kept_lp == lps[:len(kept)]
    assert cut_at_stop(ids[:3], lps[:3], stop_token_ids(tok)) == (ids[:3], lps[:3])


def test_system_message_and_prefill(toks):
    tok = toks["tiny-qwen3"]
    ids = first_prompt_ids(tok, PROMPT, system="Be brief.", prefill="<think>")
    assert tok.decode(ids) == f"<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n{PROMPT}<|im_end|>\n" \
                              "<|im_start|>assistant\n<think>"
    assert ids[-1] == tok.convert_tokens_to_ids("<think>")
    obs = observation_ids(tok, OBS, _sampled(tok, ANSWER, IM_END), prefill="<think>")
    assert tok.decode(obs).endswith("<|im_start|>assistant\n<think>")
    qwen25 = toks["tiny-qwen2-instruct"]
    assert tok.decode(first_prompt_ids(qwen25, PROMPT)).startswith(f"<|im_start|>system\n{QWEN25_SYSTEM}")


def test_turn_format_is_read_from_the_tokenizer(toks):
    from workers.envs.tokens import turn_format

    base, qwen3 = turn_format(toks["tiny-qwen2-base"]), turn_format(toks["tiny-qwen3"])
    assert (base["eos"], base["end_of_turn"], len(base["stop_token_ids"])) == (ENDOFTEXT, IM_END, 2)
    assert (qwen3["eos"], qwen3["end_of_turn"], len(qwen3["stop_token_ids"])) == (IM_END, IM_END, 1)
    assert base["chat_template"] != qwen3["chat_template"]
