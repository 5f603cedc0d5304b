"""One episode of a grid environment played through text, and the level source of an agentic task.

`TextEpisode` turns model text into env actions and env results into the next user turn, both under a turn
protocol (`workers.envs.protocol`: `ragen` or `plain`); it keeps per-turn env rewards, format penalties and the
counters the trial logs. `EnvTask` is the agentic counterpart of `workers.tasks.Task`: a seeded stream of
training level seeds (its cursor is the checkpointed state), a fixed validation set disjoint from it, and the
group dynamics (one random stream per level, or per member).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from workers.envs.protocol import PlainProtocol, make_protocol
from workers.envs.text import ACTION_NAMES

FORMAT_PENALTY = -0.1
EVAL_SEED_LIMIT = 1_000_000  # validation levels use seeds below this, training levels seeds at or above it


@dataclass(frozen=True)
class TurnOutcome:
    reward: float  # env rewards of this turn's actions (plus the format penalty under a protocol that shows it)
    done: bool
    observation: str | None  # the next user turn (None when done)
    invalid: bool
    actions: int  # actions applied this turn
    # the next user turn as RAGEN's rebuilt training sequence has it: without the ragen protocol's no-valid-action
    # warning (shown at generation only); None when done
    training_observation: str | None = None


@dataclass
class EpisodeStats:
    env_rewards: list[float] = field(default_factory=list)  # per turn
    penalties: list[float] = field(default_factory=list)  # per turn: FORMAT_PENALTY or 0
    penalty_at_end: bool = False  # the penalties join the last turn's reward (ragen) instead of their own turn
    actions: int = 0
    invalid_turns: int = 0
    items: int = 0  # action items read from the answers
    invalid_actions: int = 0  # items that named no action
    success: bool = False
    env_done: bool = False

    @property
    def turn_rewards(self) -> list[float]:
        """The reward credited to each turn; their sum is the episode return."""
        if not self.penalty_at_end:
            return [r + p for r, p in zip(self.env_rewards, self.penalties, strict=True)]
        out = list(self.env_rewards)
        if out:
            out[-1] += sum(self.penalties)
        return out

    @property
    def episode_return(self) -> float:
        return float(sum(self.env_rewards) + sum(self.penalties))


class TextEpisode:
    """Plays one env through text turns under a turn protocol (`workers.envs.protocol`): `system()` and
    `prompt()` are the first turn's messages, `prefill` opens every answer, `play(text)` applies one answer
    (`text` = prefill + what the model wrote)."""

    def __init__(self, env, *, dynamics_seed: int, max_actions_per_turn: int, max_actions_per_episode: int,
                 max_turns: int, protocol=None):
        self.env = env
        self.max_per_turn, self.max_actions, self.max_turns = max_actions_per_turn, max_actions_per_episode, max_turns
        self.protocol = protocol or PlainProtocol(max_actions_per_turn)
        self.prefill = self.protocol.prefill
        self.env.reset(seed=int(dynamics_seed))
        self.stats = EpisodeStats(penalty_at_end=self.protocol.penalty_at_end)
        self.done = False

    def system(self) -> str | None:
        return self.protocol.system(self.env, self.max_actions)

    def prompt(self) -> str:
        return self.protocol.turn(self.env, 1, self.max_actions, None, False)

    def play(self, text: str) -> TurnOutcome:
        """Apply one model answer: at most `max_actions_per_turn` parsed actions, stopping when the env ends or
        the episode's action budget is spent. A turn with an invalid or no valid action gets one format
        penalty; the next observation says when no valid action was given."""
        if self.done:
            raise RuntimeError("the episode is over")
        parsed = self.protocol.parse(text, self.max_per_turn, getattr(self.env, "action_names", ACTION_NAMES))
        penalty, reward, applied = (FORMAT_PENALTY if parsed.invalid else 0.0), 0.0, 0
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
        self.stats.env_rewards.append(reward)
        self.stats.penalties.append(penalty)
        self.stats.invalid_turns += int(parsed.invalid)
        self.stats.items += parsed.items
        self.stats.invalid_actions += parsed.items - len(parsed.actions)
        turns = len(self.stats.env_rewards)
        self.done = self.stats.env_done or self.stats.actions >= self.max_actions or turns >= self.max_turns
        shown = reward + (0.0 if self.protocol.penalty_at_end else penalty)
        obs = unwarned = None
        if not self.done:
            left = self.max_actions - self.stats.actions
            obs = self.protocol.turn(self.env, turns + 1, left, shown, not parsed.actions, parsed.invalid)
            unwarned = obs if parsed.actions or self.protocol.name != "ragen" else \
                self.protocol.turn(self.env, turns + 1, left, shown, False, parsed.invalid)
        return TurnOutcome(reward=shown, done=self.done, observation=obs, invalid=parsed.invalid, actions=applied,
                           training_observation=unwarned)


def make_env(config, level_seed: int):
    """The gymnasium env of an agentic task config (`workers.tasks.TaskConfig` with name frozen_lake / sokoban)."""
    seed = config.fixed_level if config.fixed_level is not None else level_seed
    if ":" in config.name:  # an env plugin (workers/envs/plugin.py)
        from workers.envs.plugin import PluginEnv, load_class

        return PluginEnv(load_class(config.name)(config.config, seed))
    if config.name == "frozen_lake":
        from workers.envs.frozen_lake import TextFrozenLake

        return TextFrozenLake(size=config.size or 4, frozen_prob=config.frozen_prob,
                              success_rate=config.success_rate, level_seed=seed, levels=config.levels)
    if config.name == "sokoban":
        from workers.envs.sokoban import SokobanEnv

        return SokobanEnv(size=config.size or 6, boxes=config.boxes, max_env_steps=config.max_env_steps,
                          level_seed=seed)
    raise ValueError(f"{config.name!r} is not an agentic task")


def dynamics_seed(level_seed: int, member: int | None) -> int:
    """Seed of one episode's env randomness (slips): `member` None = the level's own stream (shared by a whole
    group, RAGEN's), else distinct per group member, fixed by (level, member)."""
    key = [int(level_seed), 7] if member is None else [int(level_seed), int(member), 7]
    return int(np.random.SeedSequence(key).generate_state(1)[0])


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
        """A fresh episode on level `level_seed` for group member `member` (rollout: the trial's RolloutConfig).
        `dynamics: shared`: every member plays the level's own random stream; `independent`: one per member."""
        shared = self.config.dynamics == "shared"  # keyed by the drawn seed: groups on a fixed level still differ
        protocol = make_protocol(self.config.protocol, max_tokens=rollout.max_tokens,
                                 max_actions_per_turn=rollout.max_actions_per_turn)
        return TextEpisode(make_env(self.config, level_seed),
                           dynamics_seed=dynamics_seed(level_seed, None if shared else member),
                           max_actions_per_turn=rollout.max_actions_per_turn,
                           max_actions_per_episode=rollout.max_actions_per_episode, max_turns=rollout.max_turns,
                           protocol=protocol)

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
