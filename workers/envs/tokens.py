"""Token-exact multi-turn sequences: the first prompt's ids, then the sampled ids of each turn as they came from
vLLM, then each observation's ids (tokenised once, here). Sampled text is never re-tokenised.

Chat models: the first prompt is the chat template of (an optional system message and) one user message with
the generation prompt. An observation is the template's glue between an assistant message and the next
assistant turn: the end-of-turn text, the next user turn, the generation prompt. The glue is read from ONE
rendering of [user, assistant, user] (the text after the assistant's content), so it does not need "templating
two turns is a prefix of templating three": Qwen3's thinking template drops the think block of earlier assistant
turns once a user turn follows, and the history the policy conditions on (and is trained on) is then our
concatenation, with every think block as it was sampled, not the template's re-rendering of it.

End of turn: the template's end-of-turn token (`<|im_end|>` for ChatML) is a stop token besides eos, so a base
model whose eos is `<|endoftext|>` stops where its turn ends instead of writing an invented user turn. Every
assistant turn in the history is closed by the end-of-turn token, as the template renders it: a turn that stopped
on it is not closed again (never `<|im_end|><|im_end|>`); a turn that stopped on another stop token (eos
`<|endoftext|>`) or was cut by max_tokens is closed by the glue, so the observation's ids begin with the
end-of-turn token (`<|endoftext|><|im_end|>\n<|im_start|>user...`: well-formed ChatML, the sampled ids untouched,
the added id on the observation side, out of the loss mask unless `learner.loss_mask` is `assistant_segments`).
Models without a chat template (the tiny local models) get plain text with a newline between turns and stop at
eos.
"""

from __future__ import annotations

from functools import lru_cache

_A, _B, _C = "\x00assistant-marker\x00", "\x00user-marker\x00", "\x00second-user-marker\x00"


def _ids(tokenizer, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def _prefill_ids(tokenizer, prefill: str) -> list[int]:
    """A protocol's prefill (e.g. "<think>") tokenised on its own: the same ids after every prompt, never merged
    with the text before it."""
    return _ids(tokenizer, prefill) if prefill else []


def _chat(tokenizer) -> bool:
    return bool(getattr(tokenizer, "chat_template", None))


def first_prompt_ids(tokenizer, text: str, *, system: str | None = None, prefill: str = "") -> list[int]:
    """Ids of the first user turn, ending where the model starts answering.

    `system`: a system message when the template renders one (else it is put before the user text); `prefill`
    (e.g. "<think>") is appended after the generation prompt, tokenised on its own, on the prompt side."""
    if not _chat(tokenizer):
        head = f"{system}\n" if system else ""
        return list(tokenizer(head + text)["input_ids"]) + _prefill_ids(tokenizer, prefill)
    user = {"role": "user", "content": text}
    if system is None:
        rendered = tokenizer.apply_chat_template([user], add_generation_prompt=True, tokenize=False)
    else:
        try:
            rendered = tokenizer.apply_chat_template([{"role": "system", "content": system}, user],
                                                     add_generation_prompt=True, tokenize=False)
        except Exception:  # a template without a system role (it raises): the system text leads the user turn
            rendered = tokenizer.apply_chat_template([{"role": "user", "content": f"{system}\n\n{text}"}],
                                                     add_generation_prompt=True, tokenize=False)
    return _ids(tokenizer, rendered) + _prefill_ids(tokenizer, prefill)


@lru_cache(maxsize=8)
def chat_glue(tokenizer) -> tuple[str, str]:
    """(text from the end of an assistant message's content to the next user message's content, text after that
    content through the generation prompt) of the template, from one rendering of [user, assistant, user]."""
    msgs = [{"role": "user", "content": _B}, {"role": "assistant", "content": _A}, {"role": "user", "content": _C}]
    three = tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
    if three.count(_A) != 1 or three.count(_C) != 1:
        raise ValueError("the chat template does not render each message's content once; token-exact multi-turn "
                         "episodes need a template that does")
    after = three[three.index(_A) + len(_A):]
    head, tail = after.split(_C)
    return head, tail


@lru_cache(maxsize=8)
def end_of_turn_id(tokenizer) -> int | None:
    """The token that ends an assistant turn in the chat template (`<|im_end|>` for ChatML), or None (no chat
    template, or a template whose turns end without a special token)."""
    if not _chat(tokenizer):
        return None
    head, _ = chat_glue(tokenizer)
    ids = _ids(tokenizer, head)
    special = set(tokenizer.all_special_ids) | set(getattr(tokenizer, "added_tokens_decoder", {}) or {})
    return ids[0] if ids and ids[0] in special else None


def stop_token_ids(tokenizer) -> list[int]:
    """What ends a turn: eos and the template's end-of-turn token (passed to vLLM as stop token ids)."""
    stops = {tokenizer.eos_token_id, end_of_turn_id(tokenizer)} - {None}
    return sorted(stops)


def turn_format(tokenizer) -> dict:
    """What the run reads from the model's tokenizer files: whether it has a chat template (and a digest of it),
    its eos, the template's end-of-turn token and the stop tokens (logged once per trial)."""
    import hashlib

    template = getattr(tokenizer, "chat_template", None) or ""
    end = end_of_turn_id(tokenizer)
    return {"chat_template": hashlib.sha256(template.encode()).hexdigest()[:12] if template else None,
            "eos": tokenizer.eos_token, "end_of_turn": tokenizer.convert_ids_to_tokens(end) if end is not None else None,
            "stop_token_ids": stop_token_ids(tokenizer)}


def cut_at_stop(ids: list[int], logprobs: list[float], stops: list[int]) -> tuple[list[int], list[float]]:
    """A sampled turn up to and including its first stop token (the rest was never the model's turn)."""
    hit = next((k for k, t in enumerate(ids) if t in set(stops)), None)
    if hit is None:
        return list(ids), list(logprobs)
    return list(ids[:hit + 1]), list(logprobs[:hit + 1])


def observation_ids(tokenizer, text: str, sampled: list[int], *, prefill: str = "") -> list[int]:
    """Ids to append after a turn's `sampled` ids so the model reads observation `text` next and then answers
    (after `prefill`, tokenised here, on the prompt side)."""
    if not _chat(tokenizer):
        return _ids(tokenizer, "\n" + text) + _prefill_ids(tokenizer, prefill)
    head, tail = chat_glue(tokenizer)
    end = end_of_turn_id(tokenizer)
    end_text = tokenizer.convert_ids_to_tokens(end) if end is not None else None
    if end_text and head.startswith(end_text) and sampled and sampled[-1] == end:
        head = head[len(end_text):]  # the turn already ended on the end-of-turn token: never a second one
    return _ids(tokenizer, head + text + tail) + _prefill_ids(tokenizer, prefill)


@lru_cache(maxsize=8)
def assistant_header_ids(tokenizer) -> tuple[int, ...]:
    """Ids of the template's generation prompt (`<|im_start|>assistant\\n` for ChatML): the role header that opens
    every assistant turn. Empty without a chat template."""
    if not _chat(tokenizer):
        return ()
    user = [{"role": "user", "content": _B}]
    bare = tokenizer.apply_chat_template(user, add_generation_prompt=False, tokenize=False)
    full = tokenizer.apply_chat_template(user, add_generation_prompt=True, tokenize=False)
    return tuple(_ids(tokenizer, full[len(bare):])) if full.startswith(bare) else ()


def opening_length(tokenizer, ids: list[int], prefill: str = "") -> int:
    """How many trailing ids of a first prompt or an observation (`ids`, ending with the generation prompt and
    the prefill) open the next assistant turn: the role header and the prefill. The forced tokens that
    `learner.loss_mask: assistant_segments` trains with the turn."""
    pre = _prefill_ids(tokenizer, prefill)
    header = list(assistant_header_ids(tokenizer))
    n = len(header) + len(pre)
    if n > len(ids) or ids[len(ids) - n:] != header + pre:
        raise ValueError("the template's generation prompt does not tokenise on its own at the end of a turn; "
                         "learner.loss_mask 'assistant_segments' cannot find the assistant segments")
    return n


def closing_length(tokenizer, ids: list[int], sampled: list[int]) -> int:
    """1 when observation `ids` begin with the end-of-turn token closing the turn `sampled` (the turn stopped on
    eos or was cut), else 0: the forced token `assistant_segments` trains at a turn's end."""
    end = end_of_turn_id(tokenizer)
    return int(end is not None and bool(ids) and ids[0] == end and (not sampled or sampled[-1] != end))
