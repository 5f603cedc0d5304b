"""Token assembly of multi-turn episodes: plain text for the tiny models, the chat template's turns for chat
models, checked against the template rendering the whole conversation at once."""

from __future__ import annotations

import pytest

from workers.envs.tokens import first_prompt_ids, observation_ids
from workers.models.loading import build_tiny_model, load_tokenizer

CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


@pytest.fixture(scope="module")
def chat_tok(tmp_path_factory):
    tok = load_tokenizer(str(build_tiny_model(tmp_path_factory.mktemp("tiny"), seed=0)))
    tok.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    tok.add_tokens(["user", "assistant"])
    tok.eos_token = "<|im_end|>"
    tok.chat_template = CHATML
    return tok


def test_chat_turns_equal_the_template_of_the_whole_conversation(chat_tok):
    tok = chat_tok
    prompt, answer, obs = "what is 3 + 4 ?", "the answer is 7", "so then check 7"
    sampled = tok(answer, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]  # stopped on its end token
    ours = first_prompt_ids(tok, prompt) + sampled + observation_ids(tok, obs, sampled)
    whole = tok.apply_chat_template([{"role": "user", "content": prompt}, {"role": "assistant", "content": answer},
                                     {"role": "user", "content": obs}], add_generation_prompt=True, tokenize=True)
    whole = list(whole["input_ids"] if hasattr(whole, "keys") else whole)
    assert ours == whole and tok.unk_token_id not in ours


def test_a_turn_cut_by_max_tokens_is_closed_by_the_observation(chat_tok):
    tok = chat_tok
    sampled = tok("the answer", add_special_tokens=False)["input_ids"]  # no end token: cut at max_tokens
    obs = observation_ids(tok, "wait", sampled)
    assert obs[0] == tok.eos_token_id  # the observation closes the assistant turn
    assert observation_ids(tok, "wait", sampled + [tok.eos_token_id])[0] != tok.eos_token_id


def test_plain_text_models_get_the_observation_on_a_new_line(tmp_path):
    tok = load_tokenizer(str(build_tiny_model(tmp_path / "t", seed=0)))
    assert first_prompt_ids(tok, "what is 3 + 4 ?") == tok("what is 3 + 4 ?")["input_ids"]
    assert observation_ids(tok, "so 7", [5]) == tok("\nso 7", add_special_tokens=False)["input_ids"]


def test_system_message_and_think_prefill_equal_the_whole_conversation(chat_tok):
    """system + user + prefill, then answer + observation + prefill: the template of the whole conversation
    with each assistant turn opened by the prefill text, the prefill on the prompt side of every turn."""
    tok = chat_tok
    tok.add_tokens(["<think>", "</think>"])
    system, prompt, obs = "let me check", "what is 3 + 4 ?", "so then check 7"
    first = first_prompt_ids(tok, prompt, system=system, prefill="<think>")
    think = tok.convert_tokens_to_ids("<think>")
    assert first[-1] == think and first[:-1] == first_prompt_ids(tok, prompt, system=system)
    sampled = tok("</think> the answer is 7", add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    obs_ids = observation_ids(tok, obs, sampled, prefill="<think>")
    assert obs_ids[-1] == think and obs_ids[:-1] == observation_ids(tok, obs, sampled)
    whole = tok.apply_chat_template(
        [{"role": "system", "content": system}, {"role": "user", "content": prompt},
         {"role": "assistant", "content": "<think></think> the answer is 7"}, {"role": "user", "content": obs}],
        add_generation_prompt=True, tokenize=False) + "<think>"
    assert first + sampled + obs_ids == tok(whole, add_special_tokens=False)["input_ids"]


def test_plain_text_models_get_the_system_text_first_and_the_prefill_last(tmp_path):
    tok = load_tokenizer(str(build_tiny_model(tmp_path / "t", seed=0)))
    assert first_prompt_ids(tok, "so 7", system="what is 3 + 4 ?", prefill="?") == \
        tok("what is 3 + 4 ?\nso 7")["input_ids"] + tok("?", add_special_tokens=False)["input_ids"]
    assert observation_ids(tok, "so 7", [5], prefill="?") == tok("\nso 7 ?", add_special_tokens=False)["input_ids"]
