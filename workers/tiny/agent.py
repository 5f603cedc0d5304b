"""`tiny-agent`: the tiny local model for agentic tasks, warm-started to answer in the turn format.

A randomly initialised tiny model essentially never writes `</think><answer>Up || Left</answer>`, so RL would
have nothing to reinforce. This builds the tiny Llama with a word-level vocabulary that covers every word the
environments' text faces emit under both turn protocols, then takes a short, deterministic supervised warm start
on synthetic `ragen`-protocol episodes (system message, `<think>` prefill, unspaced grids) whose answers are
well-formed but *random* (an empty think, 1..max actions per turn, uniform action names): the starting policy
knows the format and nothing about which moves are good, so any gain in success is RL's. The episodes are
assembled by the same token code as real rollouts (`workers.envs.tokens`), multi-turn, with the loss on the
answer tokens only. Built once per settings under a file lock and cached (marker file with the settings).

Tokenizer: the protocol's tags and `||` are whole tokens; grid symbols are split off every word (an unspaced
grid row `#P_O#` is five tokens; `Player` is `P` + `layer`), so every grid is covered without a token per row.
"""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import numpy as np
import torch

from workers.envs.episode import TextEpisode, dynamics_seed
from workers.envs.text import ACTION_NAMES, format_answer
from workers.envs.tokens import first_prompt_ids, observation_ids
from workers.models.loading import TINY_VOCAB, build_cached, build_tiny_model, load_tokenizer

_MARKER = "tiny_agent.json"
# 80 steps: the answer-token loss is flat from about step 70 (0.47-0.48 nats, the entropy of the random answers;
# measured to 150 steps, the earlier setting, at 1.2 CPU-s a step)
WARM_START = {"episodes": 256, "steps": 80, "batch": 16, "lr": 3e-3, "max_turns": 5, "max_actions_per_turn": 2,
              "max_actions_per_episode": 10, "max_tokens": 16}
WHOLE_TOKENS = ("<think>", "</think>", "<answer>", "</answer>", "||")
TINY_AGENT_VERSION = 3  # 3: an 80-step warm start (2: the ragen protocol's vocabulary, 150 steps)
MAX_POSITIONS = 4096  # rotary positions: room for whole multi-turn episodes


def _pre_tokenizer():
    from tokenizers import Regex, pre_tokenizers

    from workers.envs import frozen_lake, sokoban

    grid = "".join(sorted(set(frozen_lake.SYMBOLS + sokoban.SYMBOLS)))
    return pre_tokenizers.Sequence([
        pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.Punctuation(), pre_tokenizers.Split(Regex(f"[{grid}]"), "isolated")])


def _sample_texts() -> list[str]:
    """Every kind of text the environments emit: both protocols' system and turn texts on a few levels of each
    task (valid, partly invalid and invalid answers), the plain rules, and the answers."""
    from workers.envs.episode import make_env
    from workers.envs.protocol import make_protocol
    from workers.tasks.config import task_config

    texts = []
    configs = [task_config(name="frozen_lake"), task_config(name="frozen_lake", success_rate=0.8),
               task_config(name="frozen_lake", levels="gymnasium"), task_config(name="sokoban")]
    answers = ["<think></think><answer>Up || Left</answer>", "<think></think><answer>Down || Jump</answer>", "?"]
    for cfg in configs:
        for protocol in ("ragen", "plain"):
            for level in range(8):
                ep = TextEpisode(make_env(cfg, level), dynamics_seed=level, max_actions_per_turn=2,
                                 max_actions_per_episode=10, max_turns=5,
                                 protocol=make_protocol(protocol, max_tokens=120, max_actions_per_turn=2))
                texts += [ep.system() or "", ep.prompt()]
                for a in answers:
                    if not ep.done:
                        texts.append(ep.play(a).observation or "")
    return texts + [" ".join(ACTION_NAMES), *WHOLE_TOKENS]


def env_vocabulary() -> list[str]:
    """Every word token the text faces can emit (rules, prompts, observations, answers, numbers), sorted."""
    pre = _pre_tokenizer()
    words = {w for t in _sample_texts() for w, _ in pre.pre_tokenize_str(t)}
    return sorted(words | set("0123456789") | set(WHOLE_TOKENS))


def agent_vocab() -> tuple[str, ...]:
    extra = [w for w in env_vocabulary() if w not in TINY_VOCAB]
    return tuple(TINY_VOCAB) + tuple(extra)


def _episode_tokens(tokenizer, config, level_seed: int, rng: random.Random) -> tuple[list[int], list[bool]]:
    """One synthetic ragen-protocol episode with random well-formed answers: (ids, loss mask over the answers)."""
    from workers.envs.episode import make_env
    from workers.envs.protocol import RagenProtocol

    ws = WARM_START
    ep = TextEpisode(make_env(config, level_seed), dynamics_seed=dynamics_seed(level_seed, None),
                     max_actions_per_turn=ws["max_actions_per_turn"],
                     max_actions_per_episode=ws["max_actions_per_episode"], max_turns=ws["max_turns"],
                     protocol=RagenProtocol(ws["max_tokens"]))
    ids = first_prompt_ids(tokenizer, ep.prompt(), system=ep.system(), prefill=ep.prefill)
    mask = [False] * len(ids)
    while True:
        names = [rng.choice(ACTION_NAMES) for _ in range(rng.randint(1, ws["max_actions_per_turn"]))]
        text = "</think>" + format_answer(names)
        answer = tokenizer(text, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        ids, mask = ids + answer, mask + [True] * len(answer)
        out = ep.play(ep.prefill + text)
        if out.done:
            return ids, mask
        obs = observation_ids(tokenizer, out.observation, answer, prefill=ep.prefill)
        ids, mask = ids + obs, mask + [False] * len(obs)


def _agent_tokenizer_and_positions(model_dir: Path) -> None:
    """The tiny tokenizer with the agent's pre-tokenizer and whole protocol tags (their ids are the vocabulary's
    own), and room for `MAX_POSITIONS` positions."""
    tok = load_tokenizer(str(model_dir))
    tok.backend_tokenizer.pre_tokenizer = _pre_tokenizer()
    tok.add_tokens(list(WHOLE_TOKENS))
    tok.save_pretrained(model_dir)
    cfg_path = model_dir / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["max_position_embeddings"] = MAX_POSITIONS
    cfg_path.write_text(json.dumps(cfg, indent=2))


def _warm_start(model_dir: Path, seed: int) -> None:
    from transformers import AutoModelForCausalLM

    from workers.tasks.config import task_config

    ws = WARM_START
    tok = load_tokenizer(str(model_dir))
    rng = random.Random(seed)
    configs = [task_config(name="frozen_lake"), task_config(name="frozen_lake", success_rate=0.8),
               task_config(name="sokoban")]
    data = [_episode_tokens(tok, configs[i % len(configs)], rng.randrange(2**31), rng) for i in range(ws["episodes"])]
    state = torch.random.get_rng_state()
    threads = torch.get_num_threads()
    try:
        torch.manual_seed(seed)
        torch.set_num_threads(1)  # the same arithmetic on every machine: the cached model is a pure function
        model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
        model.train()
        opt = torch.optim.AdamW(model.parameters(), lr=ws["lr"])
        order = np.random.default_rng(seed)
        for _ in range(ws["steps"]):
            rows = [data[i] for i in order.choice(len(data), ws["batch"], replace=False)]
            width = max(len(r[0]) for r in rows)
            ids = torch.tensor([r[0] + [tok.pad_token_id] * (width - len(r[0])) for r in rows])
            labels = torch.tensor([[t if m else -100 for t, m in zip(*r, strict=True)] + [-100] * (width - len(r[0]))
                                   for r in rows])
            attn = torch.tensor([[1] * len(r[0]) + [0] * (width - len(r[0])) for r in rows])
            loss = model(input_ids=ids, attention_mask=attn, labels=labels).loss
            opt.zero_grad()
            loss.backward()
            opt.step()
        model.save_pretrained(model_dir, safe_serialization=True)
    finally:
        torch.set_num_threads(threads)
        torch.random.set_rng_state(state)


def build_tiny_agent(out_dir: str | os.PathLike, seed: int = 0) -> Path:
    """The warm-started tiny agent model in `out_dir` (reused when built with the same settings)."""
    spec = {"seed": seed, "vocab": list(agent_vocab()), "warm_start": WARM_START, "positions": MAX_POSITIONS,
            "version": TINY_AGENT_VERSION}

    def build(tmp: Path) -> None:
        build_tiny_model(tmp, seed=seed, vocab=agent_vocab())
        _agent_tokenizer_and_positions(tmp)
        _warm_start(tmp, seed)

    return build_cached(out_dir, spec, _MARKER, build)
