"""One episode of a grid environment played through text, and the level source of an agentic task.

`TextEpisode` turns model text into env actions (the fixed grammar of `workers.envs.text`) and env results into
the next observation text; it keeps per-turn rewards and the counters the trial logs. `EnvTask` is the agentic
counterpart of `workers.tasks.Task`: a seeded stream of training level seeds (its cursor is the checkpointed
state) and a fixed validation set disjoint from it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from workers.envs.text import ACTION_NAMES, format_answer, parse_answer

FORMAT_PENALTY = -0.1
EVAL_SEED_LIMIT = 1_000_000  # validation levels use seeds below this, training levels seeds at or above it


@dataclass(frozen=True)
class TurnOutcome:
    reward: float  # env rewards of this turn's actions plus the format penalty
    done: bool
    observation: str | None  # the next user turn (None when done)
    invalid: bool
    actions: int  # actions applied this turn


@dataclass
class EpisodeStats:
    turn_rewards: list[float] = field(default_factory=list)
    actions: int = 0
    invalid_turns: int = 0
    items: int = 0  # action items read from the answers
    invalid_actions: int = 0  # items that named no action
    success: bool = False
    env_done: bool = False

    @property
    def episode_return(self) -> float:
        return float(sum(self.turn_rewards))


class TextEpisode:
    """Plays one env through text turns. `prompt()` is the first user turn; `play(text)` applies one answer."""

    def __init__(self, env, *, dynamics_seed: int, max_actions_per_turn: int, max_actions_per_episode: int,
                 max_turns: int):
        self.env = env
        self.max_per_turn, self.max_actions, self.max_turns = max_actions_per_turn, max_actions_per_episode, max_turns
        self.env.reset(seed=int(dynamics_seed))
        self.stats = EpisodeStats()
        self.done = False

    def _state(self) -> str:
        left = self.max_actions - self.stats.actions
        return f"State:\n{self.env.grid_text()}\nActions left: {left}."

    def prompt(self) -> str:
        example = format_answer(ACTION_NAMES[:2][: self.max_per_turn])
        return (f"{self.env.rules} Answer with {example}, at most {self.max_per_turn} actions per turn.\n"
                f"{self._state()}")

    def play(self, text: str) -> TurnOutcome:
        """Apply one model answer: at most `max_actions_per_turn` parsed actions, stopping when the env ends or
        the episode's action budget is spent. A turn with an invalid or no valid action gets one format
        penalty and the next observation says so."""
        if self.done:
            raise RuntimeError("the episode is over")
        parsed = parse_answer(text, ACTION_NAMES, self.max_per_turn)
        reward, applied = (FORMAT_PENALTY if parsed.invalid else 0.0), 0
        for a in parsed.actions:
            if self.stats.actions >= self.max_actions or self.stats.env_done:
                break
            _, r, terminated, truncated, _ = self.env.step(self.env.action_ids[a])
            reward += float(r)
            applied += 1
            self.stats.actions += 1
            if terminated or truncated:
                self.stats.env_done = True
                self.stats.success = bool(terminated and self.env.solved)
        self.stats.turn_rewards.append(reward)
        self.stats.invalid_turns += int(parsed.invalid)
        self.stats.items += parsed.items
        self.stats.invalid_actions += parsed.items - len(parsed.actions)
        self.done = (self.stats.env_done or self.stats.actions >= self.max_actions
                     or len(self.stats.turn_rewards) >= self.max_turns)
        obs = None
        if not self.done:
            note = ("" if not parsed.invalid else "No valid action was given. " if not parsed.actions
                    else "An invalid action was dropped. ")
            obs = f"{note}Reward: {reward:.1f}\n{self._state()}"
        return TurnOutcome(reward=reward, done=self.done, observation=obs, invalid=parsed.invalid, actions=applied)


def make_env(config, level_seed: int):
    """The gymnasium env of an agentic task config (`workers.tasks.TaskConfig` with name frozen_lake / sokoban)."""
    seed = config.fixed_level if config.fixed_level is not None else level_seed
    if config.name == "frozen_lake":
        from workers.envs.frozen_lake import TextFrozenLake

        return TextFrozenLake(size=config.size or 4, frozen_prob=config.frozen_prob,
                              success_rate=config.success_rate, level_seed=seed)
    if config.name == "sokoban":
        from workers.envs.sokoban import SokobanEnv

        return SokobanEnv(size=config.size or 6, boxes=config.boxes, max_env_steps=config.max_env_steps,
                          level_seed=seed)
    raise ValueError(f"{config.name!r} is not an agentic task")


def dynamics_seed(level_seed: int, member: int) -> int:
    """Seed of one episode's env randomness (slips): distinct per group member, fixed by (level, member)."""
    return int(np.random.SeedSequence([int(level_seed), int(member), 7]).generate_state(1)[0])


class EnvTask:
    """Level seeds for an agentic trial: a seeded training stream (cursor = state) and fixed validation levels."""

    agentic = True
    action_tokens = None  # multi-token actions: no single-token action set for the probability floor

    def __init__(self, config, seed: int):
        self.config, self.seed, self.name = config, int(seed), config.name
        self.cursor = 0

    def next_levels(self, n: int) -> list[int]:
        """The next n training level seeds; advances the cursor. Always >= EVAL_SEED_LIMIT."""
        out = [EVAL_SEED_LIMIT + int(np.random.SeedSequence([self.seed, self.cursor + i]).generate_state(1)[0]
                                     % (2**31 - 1 - EVAL_SEED_LIMIT)) for i in range(n)]
        self.cursor += n
        return out

    def eval_levels(self, n: int) -> list[int]:
        """The fixed validation level seeds 0..n-1 (never produced by `next_levels`)."""
        return list(range(min(n, EVAL_SEED_LIMIT)))

    def episode(self, level_seed: int, member: int, rollout) -> TextEpisode:
        """A fresh episode on level `level_seed` for group member `member` (rollout: the trial's RolloutConfig)."""
        return TextEpisode(make_env(self.config, level_seed), dynamics_seed=dynamics_seed(level_seed, member),
                           max_actions_per_turn=rollout.max_actions_per_turn,
                           max_actions_per_episode=rollout.max_actions_per_episode, max_turns=rollout.max_turns)

    def state_dict(self) -> dict[str, Any]:
        return {"task": self.name, "seed": self.seed, "cursor": self.cursor}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if not isinstance(state, dict) or state.get("task") != self.name or state.get("seed") != self.seed:
            raise ValueError(f"state is not a '{self.name}' level cursor for seed {self.seed}: {state!r}")
        cursor = state.get("cursor")
        if not isinstance(cursor, int) or isinstance(cursor, bool) or cursor < 0:
            raise ValueError(f"level cursor must be an int >= 0, got {cursor!r}")
        self.cursor = cursor

    def close(self) -> None:
        return None
