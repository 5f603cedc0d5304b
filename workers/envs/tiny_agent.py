"""`tiny-agent`: the tiny local model for agentic tasks, warm-started to answer in the turn format.

A randomly initialised tiny model essentially never writes `<answer>Up || Left</answer>`, so RL would have
nothing to reinforce. This builds the tiny Llama with a word-level vocabulary that covers every word the
environments' text faces emit, then takes a short, deterministic supervised warm start on synthetic episodes
whose answers are well-formed but *random* (1..max actions per turn, uniform action names): the starting policy
knows the format and nothing about which moves are good, so any gain in success is RL's. The episodes are
assembled by the same token code as real rollouts (`workers.envs.tokens`), multi-turn, with the loss on the
answer tokens only. Built once per settings under a file lock and cached (marker file with the settings).
"""

from __future__ import annotations

import os
import random
from pathlib import Path

import numpy as np
import torch

from workers.envs.episode import TextEpisode, dynamics_seed
from workers.envs.text import ACTION_NAMES, format_answer
from workers.envs.tokens import first_prompt_ids, observation_ids
from workers.models import TINY_VOCAB, build_cached, build_tiny_model, load_tokenizer

_MARKER = "tiny_agent.json"
WARM_START = {"episodes": 256, "steps": 150, "batch": 16, "lr": 3e-3, "max_turns": 5, "max_actions_per_turn": 2,
              "max_actions_per_episode": 10}


def env_vocabulary() -> list[str]:
    """Every word token the text faces can emit (rules, prompts, observations, answers, numbers), sorted."""
    from tokenizers import pre_tokenizers

    from workers.envs import frozen_lake, sokoban

    texts = [frozen_lake.RULES.format(slip=", and a move may slip sideways"), sokoban.RULES,
             " ".join(frozen_lake.SYMBOLS + sokoban.SYMBOLS + ACTION_NAMES),
             "Answer with <answer>Up || Down</answer>, at most 2 actions per turn. State: Actions left: 10. "
             "No valid action was given. Reward: -0.1 <think> </think>"]
    pre = pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Digits(individual_digits=True),
                                   pre_tokenizers.Punctuation()])
    words = {w for t in texts for w, _ in pre.pre_tokenize_str(t)}
    return sorted(words | set("0123456789"))


def agent_vocab() -> tuple[str, ...]:
    extra = [w for w in env_vocabulary() if w not in TINY_VOCAB]
    return tuple(TINY_VOCAB) + tuple(extra)


def _episode_tokens(tokenizer, config, level_seed: int, rng: random.Random) -> tuple[list[int], list[bool]]:
    """One synthetic episode with random well-formed answers: (ids, loss mask over the answer ids)."""
    from workers.envs.episode import make_env

    ws = WARM_START
    ep = TextEpisode(make_env(config, level_seed), dynamics_seed=dynamics_seed(level_seed, 0),
                     max_actions_per_turn=ws["max_actions_per_turn"],
                     max_actions_per_episode=ws["max_actions_per_episode"], max_turns=ws["max_turns"])
    ids = first_prompt_ids(tokenizer, ep.prompt())
    mask = [False] * len(ids)
    while True:
        names = [rng.choice(ACTION_NAMES) for _ in range(rng.randint(1, ws["max_actions_per_turn"]))]
        answer = tokenizer(format_answer(names), add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        ids, mask = ids + answer, mask + [True] * len(answer)
        out = ep.play(format_answer(names))
        if out.done:
            return ids, mask
        obs = observation_ids(tokenizer, out.observation, answer)
        ids, mask = ids + obs, mask + [False] * len(obs)


def _warm_start(model_dir: Path, seed: int) -> None:
    from transformers import AutoModelForCausalLM

    from workers.tasks.config import TaskConfig

    ws = WARM_START
    tok = load_tokenizer(str(model_dir))
    rng = random.Random(seed)
    configs = [TaskConfig(name="frozen_lake"), TaskConfig(name="frozen_lake", success_rate=0.8),
               TaskConfig(name="sokoban")]
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
    spec = {"seed": seed, "vocab": list(agent_vocab()), "warm_start": WARM_START, "version": 1}

    def build(tmp: Path) -> None:
        build_tiny_model(tmp, seed=seed, vocab=agent_vocab())
        _warm_start(tmp, seed)

    return build_cached(out_dir, spec, _MARKER, build)
