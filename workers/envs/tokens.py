"""Token-exact multi-turn sequences: the first prompt's ids, then the sampled ids of each turn as they came from
vLLM, then each observation's ids (tokenised once, here). Sampled text is never re-tokenised.

Chat models: the first prompt is the chat template of the system message (if any) and one user message with the
generation prompt; an observation is the template's text between the end of an assistant message and the next
assistant turn (closing the assistant turn when the sample stopped without its end token). Models without a chat
template (the tiny local models) get plain text: the system text on its own line, a newline between turns.
A protocol's `prefill` (e.g. "<think>") is tokenised once and appended to the first prompt and to every
observation: it opens each answer on the prompt side and is never trained.
"""

from __future__ import annotations

from functools import lru_cache

_A, _B = "\x00assistant-marker\x00", "\x00user-marker\x00"


def _prefill_ids(tokenizer, prefill: str) -> list[int]:
    return list(tokenizer(prefill, add_special_tokens=False)["input_ids"]) if prefill else []


def first_prompt_ids(tokenizer, text: str, *, system: str | None = None, prefill: str = "") -> list[int]:
    """Ids of the first turn (system message when given, then the user turn), ending where the model starts
    answering: after the generation prompt and the `prefill` ids."""
    if getattr(tokenizer, "chat_template", None):
        msgs = ([{"role": "system", "content": system}] if system is not None else []) + \
            [{"role": "user", "content": text}]
        ids = tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True)
        ids = list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids)
    else:
        ids = list(tokenizer(text if system is None else f"{system}\n{text}")["input_ids"])
    return ids + _prefill_ids(tokenizer, prefill)


@lru_cache(maxsize=8)
def _chat_glue(tokenizer) -> tuple[str, str]:
    """(text that closes an assistant turn, text that opens a user turn up to the content) of the template."""
    msgs = [{"role": "user", "content": _B}, {"role": "assistant", "content": _A}]
    two = tokenizer.apply_chat_template(msgs, tokenize=False)
    three = tokenizer.apply_chat_template(msgs + [{"role": "user", "content": _B}], add_generation_prompt=True,
                                          tokenize=False)
    if not three.startswith(two):
        raise ValueError("the chat template renders earlier turns differently once a user turn follows; "
                         "multi-turn token-exact episodes need a template that only appends")
    after_answer = two[two.rindex(_A) + len(_A):]
    turn = three[len(two):]
    return after_answer, turn


def observation_ids(tokenizer, text: str, sampled: list[int], *, prefill: str = "") -> list[int]:
    """Ids to append after a turn's `sampled` ids so the model reads observation `text` next and then answers
    (the `prefill` ids last)."""
    if getattr(tokenizer, "chat_template", None):
        close, turn = _chat_glue(tokenizer)
        eos = tokenizer.eos_token
        if sampled and sampled[-1] == tokenizer.eos_token_id and eos and close.startswith(eos):
            close = close[len(eos):]  # the sample already ended its turn with the end token
        head, tail = turn.split(_B)
        ids = list(tokenizer(close + head + text + tail, add_special_tokens=False)["input_ids"])
    else:
        ids = list(tokenizer("\n" + text, add_special_tokens=False)["input_ids"])
    return ids + _prefill_ids(tokenizer, prefill)
