"""Model and tokenizer loading, and the tiny local model used by tests and the local default.

`load_model` / `load_tokenizer` take a hub name (`Qwen/Qwen3-4B-Instruct-2507`) or a local path: the same code
path for both. `build_tiny_model(dir, seed)` writes a deterministic tiny Llama model with a word-level
tokenizer whose vocabulary covers the synthetic arithmetic task (plus the words of a few strategic grams, so
planning masks have something to find). It is Llama, not Qwen2: for qwen2 transformers and vLLM force their
own tokenizer class and ignore a custom one.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path

import torch

SPECIAL = ["<pad>", "<unk>", "<bos>", "<eos>"]
DIGITS = [str(d) for d in range(10)]
SYMBOLS = ["+", "-", "*", "=", "?", ".", ",", "(", ")", ":"]
WORDS = [
    "what", "is", "the", "answer", "so", "then", "and", "a", "of", "it",
    "wait", "let", "me", "check", "think", "double", "notice", "that", "key", "insight", "we", "if",
    "A", "B", "C", "D",
]  # fmt: skip
TINY_VOCAB: tuple[str, ...] = tuple(SPECIAL + DIGITS + SYMBOLS + WORDS)
_MARKER = "tiny_model.json"


def build_tiny_model(out_dir: str | os.PathLike, seed: int = 0, vocab: Sequence[str] = TINY_VOCAB) -> Path:
    """Write a tiny Llama causal LM + word-level tokenizer to `out_dir` (reused if already built the same way).

    Config: hidden 128, 2 layers, 2 heads of dim 64 (vLLM's CPU attention needs head_dim >= 32), 1 KV head.
    Weights depend only on `seed`. Returns the directory.
    """
    out = Path(out_dir)
    spec = {"seed": seed, "vocab": list(vocab), "version": 1}
    marker = out / _MARKER
    if marker.exists() and json.loads(marker.read_text()) == spec:
        return out  # before the imports: transformers' model classes cost ~4 CPU-s in a process that only reads
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    out.mkdir(parents=True, exist_ok=True)

    ids = {tok: i for i, tok in enumerate(vocab)}
    tok = Tokenizer(models.WordLevel(vocab=ids, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.Punctuation()]
    )
    hf_tok = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<bos>", eos_token="<eos>", pad_token="<pad>", unk_token="<unk>"
    )
    hf_tok.save_pretrained(out)

    config = LlamaConfig(
        vocab_size=len(vocab), hidden_size=128, intermediate_size=256, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, head_dim=64, max_position_embeddings=512,
        bos_token_id=ids["<bos>"], eos_token_id=ids["<eos>"], pad_token_id=ids["<pad>"],
        tie_word_embeddings=False, rms_norm_eps=1e-5,
    )
    gen_state = torch.random.get_rng_state()
    try:
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    finally:
        torch.random.set_rng_state(gen_state)
    model.generation_config.do_sample = True
    model.save_pretrained(out, safe_serialization=True)
    marker.write_text(json.dumps(spec))
    return out


def build_cached(out_dir: str | os.PathLike, spec: dict, marker: str, build) -> Path:
    """`out_dir` built by `build(tmp_dir)` once per `spec`: under a file lock beside it (rollout workers, learner
    and driver may all ask at once), into a temporary directory renamed into place, with `spec` written to its
    `marker` file; reused while the marker holds the same spec."""
    import fcntl
    import shutil

    out = Path(out_dir)
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.parent / f".{out.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (out / marker).exists() and json.loads((out / marker).read_text()) == spec:
            return out
        tmp = out.parent / f".{out.name}.building"
        shutil.rmtree(tmp, ignore_errors=True)
        build(tmp)
        (tmp / marker).write_text(json.dumps(spec))
        shutil.rmtree(out, ignore_errors=True)
        tmp.rename(out)
    return out


# The marker files this package's model builders write (loading.py, tiny_agent.py, reasoner.py, families.py;
# tests/unit/models/test_tokenizer_loading.py holds the list to them) and the tokenizer classes they save.
BUILT_HERE_MARKERS = (_MARKER, "tiny_agent.json", "reasoner.json", "tiny_family.json")
_BUILT_HERE_TOKENIZERS = ("TokenizersBackend", "Qwen2Tokenizer")


def built_here_tokenizer_class(path: str) -> type | None:
    """The tokenizer class of a model directory built by this package (one of `BUILT_HERE_MARKERS` in it): the
    class its tokenizer_config.json names, which is what AutoTokenizer resolves for these models too (checked
    per builder by tests/unit/models/test_tokenizer_loading.py). None for any other name or directory."""
    p = Path(path)
    if not p.is_dir() or not any((p / m).is_file() for m in BUILT_HERE_MARKERS):
        return None
    try:
        name = json.loads((p / "tokenizer_config.json").read_text()).get("tokenizer_class")
    except (OSError, ValueError):
        return None
    if name not in _BUILT_HERE_TOKENIZERS:
        return None
    import transformers

    return getattr(transformers, name)


def load_tokenizer(name_or_path: str):
    """Tokenizer by hub name or local path (left padding is irrelevant: we pad ourselves).

    A model built here loads with its own tokenizer class (`built_here_tokenizer_class`): importing
    AutoTokenizer costs ~3 CPU-s (transformers' auto factories) in a process that needs only the tokenizer,
    every trial's driver among them."""
    cls = built_here_tokenizer_class(name_or_path)
    if cls is None:
        from transformers import AutoTokenizer as cls

    tok = cls.from_pretrained(name_or_path)
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return tok


def tokenizer_fingerprint(tokenizer) -> str:
    """What token ids mean under `tokenizer`: a hash of its whole vocabulary (added tokens included), so a batch
    saved as ids can be checked against the tokenizer about to read it (orchestrator/trial/artifacts/replay.py)."""
    import hashlib

    vocab = sorted(tokenizer.get_vocab().items(), key=lambda kv: kv[1])
    return hashlib.sha256(json.dumps(vocab, ensure_ascii=False).encode()).hexdigest()[:16]


def load_model(name_or_path: str, dtype: torch.dtype = torch.float32, device: str = "cpu"):
    """Causal LM by hub name or local path, in `dtype`, on `device`."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(name_or_path, dtype=dtype)
    return model.to(device)


def token_pieces(tokenizer, ids: Sequence[int]) -> list[str]:
    """Decoded text of each token such that their concatenation is the decoded completion.

    Byte-level BPE tokenizers (Qwen, Llama 3) give it directly per token; word-level ones join words with a
    space, which is restored here. Otherwise falls back to exact incremental decoding.
    """
    ids = list(ids)
    if not ids:
        return []
    pieces = tokenizer.batch_decode([[i] for i in ids])
    full = tokenizer.decode(ids)
    if "".join(pieces) == full:
        return pieces
    if " ".join(pieces) == full:
        return [p if k == 0 else " " + p for k, p in enumerate(pieces)]
    out, prev = [], ""
    for k in range(len(ids)):  # exact but quadratic: only for tokenizers that need it
        cur = tokenizer.decode(ids[: k + 1])
        out.append(cur[len(prev) :] if cur.startswith(prev) else cur)
        prev = cur
    return out


def head_is_linear(hf) -> bool:
    """Whether the causal LM's logits are exactly its output embedding applied to the decoder's last hidden state
    (Llama, Qwen, Mistral, ...), so the head can run at the response positions only."""
    cfg = hf.config
    return (hf.get_output_embeddings() is not None and hasattr(hf, getattr(hf, "base_model_prefix", "") or "_")
            and not getattr(cfg, "final_logit_softcapping", None) and getattr(cfg, "logit_scale", None) in (None, 1.0)
            and not getattr(cfg, "logits_scaling", None))
