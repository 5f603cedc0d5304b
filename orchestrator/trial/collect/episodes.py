"""Multi-turn episodes on the rollout workers (agentic tasks).

Per turn, every active episode generates in ONE batched call sharded across the rollout workers (n = 1 per
episode: after the first turn every episode has its own history), then each env steps on its text. The
trajectory is token-exact: the first prompt's ids, then exactly the ids vLLM sampled for each turn, then the
observation's ids (tokenised once, `workers.envs.tokens`), and so on; the loss mask covers exactly the sampled
ids and the rollout log-probs cover each of them. A protocol's prefill (`<think>`) ends the first prompt and
every observation: prompt side, never trained; the parser reads prefill + the decoded sample. The first turn must
fit `model.max_model_len` (checked before launch: `check_episode_fits`); an episode whose next turn would not
fit is cut there and counted as truncated (`env/truncated_rate`), by design.

Two settings reproduce RAGEN's training sequence knob for knob (docs/agentic.md):
- `task.training_context: ragen`: the trained sequence's user turns drop the no-valid-action warning that the
  sampled-from context showed (the sampled ids themselves are unchanged); `sampled` (default) trains on exactly
  the context each turn was sampled from.
- `learner.loss_mask: assistant_segments`: the loss also covers each turn's forced tokens, i.e. the role header
  and the prefill that open it (moved from the first prompt into the response for turn 1) and the end-of-turn
  token the glue adds after a turn that stopped on eos; `sampled_mask` still marks the sampled ids (the only ones
  with vLLM log-probs). `sampled` (default): the loss covers the sampled ids only.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from orchestrator.config.trial import TrialConfig
from orchestrator.trial.actors.context import TrialContext
from orchestrator.trial.collect.sampling import sample, step_seed
from workers.envs import TextEpisode
from workers.envs.tokens import (
    closing_length,
    end_of_turn_id,
    first_prompt_ids,
    observation_ids,
    opening_length,
)


@dataclass
class Trajectory:
    """One episode as the learner sees it. `response_ids`, `loss_mask` and `logprobs` are aligned; turn k's
    reward sits at `reward_positions[k]`, the index (in the response) of that turn's last sampled id."""

    prompt_ids: list[int]
    episode: TextEpisode
    response_ids: list[int] = field(default_factory=list)
    loss_mask: list[bool] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    reward_positions: list[int] = field(default_factory=list)
    observations: list[str] = field(default_factory=list)  # the user turns after the first, as text
    truncated: bool = False  # cut: the next turn would not fit model.max_model_len
    hit_max_tokens: bool = False  # some turn stopped at rollout.max_tokens (finish_reason "length")
    longest_turn: int = 0  # sampled ids of the longest turn (rollout.overlong's penalty measures it)
    sampled_mask: list[bool] = field(default_factory=list)  # True on the ids vLLM sampled (aligned with response)
    context_ids: list[int] = field(default_factory=list)  # the response side as sampled from (training_context)

    def extend(self, ids: list[int], *, loss: list[bool], sampled: bool, context: list[int] | None = None,
               logprobs: list[float] | None = None) -> None:
        """Append `ids` to the trained response (and `context`, default the same ids, to the sampled-from one)."""
        self.response_ids += ids
        self.loss_mask += loss
        self.sampled_mask += [sampled] * len(ids)
        self.logprobs += logprobs if logprobs is not None else [0.0] * len(ids)
        self.context_ids += ids if context is None else context

    @property
    def turn_rewards(self) -> list[float]:
        return list(self.episode.stats.turn_rewards)

    @property
    def episode_return(self) -> float:
        return self.episode.stats.episode_return

    @property
    def success(self) -> bool:
        return self.episode.stats.success

    @property
    def done(self) -> bool:
        return self.episode.done or self.truncated


@dataclass(frozen=True)
class Played:
    """What playing a batch of episodes sampled: tokens, the policy versions that sampled them, turns played."""

    num_tokens: int
    versions: set
    turns: int


def play_episodes(ctx: TrialContext, episodes: list[TextEpisode], *, seed: int, step: int,
                  temperature: float, round: int = 0, phase: str = "generate") -> tuple[list[Trajectory], Played]:
    """Play `episodes` to the end (sampling seeds of refill round `round`); returns their trajectories and what
    was sampled (`Played`). Each turn's sampling waits under `phase`'s deadline (generate, or eval)."""
    cfg, engines, tokenizer = ctx.cfg, ctx.engines, ctx.tokenizer
    ro, limit = cfg.rollout, cfg.model.max_model_len
    segments = cfg.learner.loss_mask == "assistant_segments"
    ragen_context = getattr(cfg.task, "training_context", "sampled") == "ragen"  # a plugin env has no such key
    trajs = [_start(tokenizer, ep, segments) for ep in episodes]
    for t in trajs:
        if len(t.prompt_ids) + len(t.context_ids) + ro.max_tokens > limit:
            raise ValueError(f"the first prompt ({len(t.prompt_ids) + len(t.context_ids)} tokens) plus "
                             f"rollout.max_tokens ({ro.max_tokens}) exceeds model.max_model_len ({limit})")
    num_tokens, versions, turn = 0, set(), 0
    while active := [t for t in trajs if not t.done]:
        histories = [t.prompt_ids + t.context_ids for t in active]
        seeds = [step_seed(seed, step, j, turn, round) for j in range(engines.count)]
        results = sample(ctx, histories, n=1, temperature=temperature, seeds=seeds, floor=False, phase=phase)
        versions |= {res.adapter_version for res in results}
        samples = [group[0] for res in results for group in res.completions]
        for t, s in zip(active, samples, strict=True):
            ids = list(s.token_ids)
            num_tokens += len(ids)
            t.extend(ids, loss=[True] * len(ids), sampled=True, logprobs=list(s.logprobs))
            t.reward_positions.append(len(t.response_ids) - 1)
            t.hit_max_tokens |= s.truncated
            t.longest_turn = max(t.longest_turn, len(ids))
            out = t.episode.play(t.episode.prefill + tokenizer.decode(ids, skip_special_tokens=True))
            obs = None if out.done else observation_ids(tokenizer, out.observation, ids, prefill=t.episode.prefill)
            if obs is not None and len(t.prompt_ids) + len(t.context_ids) + len(obs) + ro.max_tokens > limit:
                t.truncated = True
            if obs is None or t.truncated:
                _close_last_turn(tokenizer, t, ids, segments)
                continue
            trained = obs
            if ragen_context and out.training_observation != out.observation:
                trained = observation_ids(tokenizer, out.training_observation, ids, prefill=t.episode.prefill)
            t.extend(trained, loss=_observation_mask(tokenizer, trained, ids, t.episode.prefill, segments),
                     sampled=False, context=obs)
            t.observations.append(out.observation)
        turn += 1
    return trajs, Played(num_tokens, versions, turn)


def _start(tokenizer, ep: TextEpisode, segments: bool) -> Trajectory:
    """A trajectory at its first prompt; under assistant_segments the first turn's opening (role header and
    prefill) is moved into the response, where the loss can cover it."""
    first = first_prompt_ids(tokenizer, ep.prompt(), system=ep.system(), prefill=ep.prefill)
    t = Trajectory(first, ep)
    if segments:
        k = opening_length(tokenizer, first, ep.prefill)
        t.prompt_ids = first[:len(first) - k]
        t.extend(first[len(first) - k:], loss=[True] * k, sampled=False)
    return t


def _observation_mask(tokenizer, obs: list[int], sampled: list[int], prefill: str, segments: bool) -> list[bool]:
    """The loss mask over an observation's ids: none of them, or (assistant_segments) the end-of-turn token it
    adds to close the previous turn and the next turn's opening."""
    if not segments:
        return [False] * len(obs)
    close, opening = closing_length(tokenizer, obs, sampled), opening_length(tokenizer, obs, prefill)
    return [True] * close + [False] * (len(obs) - close - opening) + [True] * opening


def _close_last_turn(tokenizer, t: Trajectory, sampled: list[int], segments: bool) -> None:
    """assistant_segments: the last turn, too, ends with the end-of-turn token (RAGEN's template closes every
    assistant turn), added and trained when the model stopped on eos or was cut."""
    end = end_of_turn_id(tokenizer)
    if segments and end is not None and (not sampled or sampled[-1] != end):
        t.extend([end], loss=[True], sampled=False)


def check_episode_fits(cfg: TrialConfig, tokenizer, levels: int = 32) -> str | None:
    """Why the first turn of an agentic trial cannot fit `model.max_model_len` (None when it fits): the longest
    first prompt over the first validation and training levels plus `rollout.max_tokens`."""
    from workers.tasks import make_task

    task = make_task(cfg.task, cfg.seed)
    seeds = task.eval_levels(levels) + task.next_levels(levels)
    longest = max(len(first_prompt_ids(tokenizer, ep.prompt(), system=ep.system(), prefill=ep.prefill))
                  for ep in (task.episode(s, 0, cfg.rollout) for s in seeds))
    limit = cfg.model.max_model_len
    if longest + cfg.rollout.max_tokens > limit:
        return (f"model.max_model_len: {limit} is too small for task '{cfg.task.name}': the first prompt takes up "
                f"to {longest} tokens plus rollout.max_tokens {cfg.rollout.max_tokens}; allowed: at least "
                f"{longest + cfg.rollout.max_tokens} (later turns that do not fit are cut and marked truncated)")
    return None


def episode_metrics(trajs: list[Trajectory], prefix: str = "env") -> dict[str, float]:
    """Success, return, turns, actions, invalid-action / format-penalty / truncation rates over episodes."""
    stats = [t.episode.stats for t in trajs]
    turns = sum(len(s.turn_rewards) for s in stats)
    items = sum(s.items for s in stats)
    return {
        f"{prefix}/success": float(np.mean([s.success for s in stats])),
        f"{prefix}/return_mean": float(np.mean([s.episode_return for s in stats])),
        f"{prefix}/turns_mean": turns / len(stats),
        f"{prefix}/actions_mean": float(np.mean([s.actions for s in stats])),
        f"{prefix}/invalid_action_rate": sum(s.invalid_actions for s in stats) / max(items, 1),
        f"{prefix}/format_penalty_rate": sum(s.invalid_turns for s in stats) / max(turns, 1),
        f"{prefix}/truncated_rate": float(np.mean([t.truncated for t in trajs])),
    }
