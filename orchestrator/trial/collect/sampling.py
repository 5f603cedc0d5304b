"""Sampling from the trial's rollout workers: seeds, sharding, and the task's action set for the probability floor.

Seeds are a pure function of (trial seed, step, shard), so a restored trial replays exactly the steps it re-runs.
"""

from __future__ import annotations

import numpy as np

from orchestrator.config.trial import TrialConfig
from orchestrator.trial.actors.context import TrialContext
from workers.envs.tokens import stop_token_ids
from workers.rollout.output import Generation
from workers.rollout.worker import SamplingRequest


def step_seed(seed: int, step: int, shard_idx: int, turn: int = 0, round: int = 0) -> int:
    """Sampling seed of one shard at one step (and turn, for multi-turn episodes; and refill round,
    `rollout.fill`): a pure function of its arguments, so resumes replay. Turn 0 of round 0 keeps the
    single-turn formula and round 0 every earlier seed, so runs without refill reproduce."""
    if round:
        return int(np.random.SeedSequence([seed % 2**63, step, shard_idx, turn, round]).generate_state(1)[0]
                   % (2**31 - 1))
    if turn:
        return int(np.random.SeedSequence([seed % 2**63, step, shard_idx, turn]).generate_state(1)[0] % (2**31 - 1))
    return (seed * 1_000_003 + step * 9_973 + shard_idx * 101) % (2**31 - 1)


def difficulty_seed(seed: int, step: int, shard_idx: int, round: int = 0) -> int:
    """Sampling seed of the starting policy's samples of one shard at one step (`rollout.difficulty_samples`):
    apart from every training seed, and the same in every arm of a seed (they are offered the same problems)."""
    return int(np.random.SeedSequence([seed % 2**63, step, shard_idx, round, 0xD1F]).generate_state(1)[0]
               % (2**31 - 1))


def action_ids(cfg: TrialConfig, task, tokenizer) -> list[int] | None:
    """Token ids of the task's action set when the probability floor is on (None: no floor anywhere)."""
    if not (cfg.interventions.probability_floor.is_active and task.action_tokens):
        return None
    ids = tokenizer.convert_tokens_to_ids(list(task.action_tokens))
    if any(i is None or i == tokenizer.unk_token_id for i in ids):
        raise ValueError(f"action tokens {task.action_tokens} are not single tokens of the model's vocabulary")
    return list(ids)


def sample(ctx: TrialContext, prompt_ids: list[list[int]], *, n: int, temperature: float, seeds: list[int],
           floor: bool = True, phase: str = "generate", base: bool = False) -> list[Generation]:
    """Shard prompts over the trial's engines (`ctx.engines`, shard j seeded `seeds[j]`) and sample; one
    `Generation` per non-empty shard. `floor`: apply the probability floor on the trial's action ids
    (`ctx.actions`; multi-turn episodes sample without it); `phase`: whose deadline the wait is under (generate,
    or eval for held-out sampling); `base`: sample the base model, not the workers' adapter."""
    cfg, actions = ctx.cfg, ctx.actions if floor else None
    floor_kw = {"action_token_ids": actions, "action_min_prob": cfg.interventions.probability_floor.min_prob} \
        if actions else {}
    request = SamplingRequest(n=n, temperature=temperature, top_p=cfg.rollout.top_p,
                              max_tokens=cfg.rollout.max_tokens, seed=seeds[0] if seeds else 0,
                              stop_token_ids=stop_token_ids(ctx.tokenizer), base=base, **floor_kw)
    return ctx.engines.generate(prompt_ids, request, seeds, phase)
