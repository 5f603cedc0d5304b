"""Sokoban with a text face: a small gymnasium env and the classic level generator (reverse play).

Levels come from a seed: a room is carved by a random walk inside the walls, the boxes start on their targets
(a solved state), and the player then plays *backwards* (moving, and pulling a box it stands next to). Every
pull is the inverse of a push, so each state reached this way can be pushed back to the solved state: every
generated level is solvable. The farthest state seen (total box displacement) becomes the level; a walk that
never moves a box re-seeds deterministically.

Rewards: -0.1 per step, +1 for a box pushed onto a target, -1 for one pushed off, +10 when every box is on a
target (the episode then terminates). `max_env_steps` truncates.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np

from workers.envs.text import ACTION_NAMES, render_grid

WALL, FLOOR, TARGET, BOX_ON_TARGET, BOX, PLAYER, PLAYER_ON_TARGET = range(7)
SYMBOL = {WALL: "#", FLOOR: "_", TARGET: "O", BOX_ON_TARGET: "√", BOX: "X", PLAYER: "P", PLAYER_ON_TARGET: "S"}
SYMBOLS = tuple(SYMBOL.values())
MOVES = ((-1, 0), (1, 0), (0, -1), (0, 1))  # Up, Down, Left, Right (ACTION_NAMES order)
STEP_PENALTY, BOX_ON, BOX_OFF, SOLVED = -0.1, 1.0, -1.0, 10.0
RULES = ("Sokoban: push every box X onto a target O. P is you, # is a wall, _ is floor, √ is a box on a target, "
         "S is you on a target. You push a box by walking into it. Actions: Up, Down, Left, Right.")

Pos = tuple[int, int]


def carve_room(size: int, rng: np.random.Generator) -> np.ndarray:
    """A `[size, size]` grid of WALL / FLOOR: walls on the border, floor carved by a random walk inside."""
    room = np.full((size, size), WALL, dtype=np.uint8)
    inner = size - 2
    pos = np.array([rng.integers(1, size - 1), rng.integers(1, size - 1)])
    direction = MOVES[rng.integers(4)]
    for _ in range(int(1.5 * inner * inner)):
        room[pos[0], pos[1]] = FLOOR
        if rng.random() < 0.35:
            direction = MOVES[rng.integers(4)]
        nxt = pos + direction
        if 1 <= nxt[0] <= size - 2 and 1 <= nxt[1] <= size - 2:
            pos = nxt
    return room


def _reverse_play(room: np.ndarray, targets: list[Pos], player: Pos, rng: np.random.Generator,
                  steps: int) -> tuple[list[Pos], Pos, int]:
    """Random backwards play from the solved state; returns the farthest (boxes, player, displacement) seen."""
    boxes = list(targets)
    best = (list(boxes), player, 0)
    for _ in range(steps):
        dr, dc = MOVES[rng.integers(4)]
        to = (player[0] + dr, player[1] + dc)
        if room[to] == WALL or to in boxes:
            continue
        behind = (player[0] - dr, player[1] - dc)
        if behind in boxes and rng.random() < 0.5:  # pull: the box follows the player into its old cell
            boxes[boxes.index(behind)] = player
        player = to
        moved = sum(abs(b[0] - t[0]) + abs(b[1] - t[1]) for b, t in zip(boxes, targets, strict=True))
        if moved > best[2] and not any(b in targets for b in boxes):
            best = (list(boxes), player, moved)
    return best


def generate_level(size: int, num_boxes: int, seed: int, reverse_steps: int = 300
                   ) -> tuple[np.ndarray, list[Pos], list[Pos], Pos]:
    """(room of WALL/FLOOR/TARGET, targets, boxes, player) for a level seed; deterministic in its arguments."""
    for attempt in range(1000):
        rng = np.random.default_rng([int(seed) % 2**63, attempt])
        room = carve_room(size, rng)
        floor = [tuple(int(x) for x in p) for p in np.argwhere(room == FLOOR)]
        if len(floor) < 2 * num_boxes + 2:
            continue
        picks = rng.permutation(len(floor))
        targets = [floor[i] for i in picks[:num_boxes]]
        player = floor[picks[num_boxes]]
        boxes, player, moved = _reverse_play(room, targets, player, rng, reverse_steps)
        if moved == 0:
            continue
        for t in targets:
            room[t] = TARGET
        return room, targets, boxes, player
    raise RuntimeError(f"no Sokoban level for size={size} boxes={num_boxes} seed={seed}")


def parse_layout(rows: list[str]) -> tuple[np.ndarray, list[Pos], list[Pos], Pos]:
    """(room, targets, boxes, player) from square rows of symbols; ValueError on anything malformed."""
    code = {v: k for k, v in SYMBOL.items()}
    if not rows or any(len(r) != len(rows) for r in rows) or any(c not in code for r in rows for c in r):
        raise ValueError(f"a layout is square rows of the symbols {''.join(SYMBOLS)}")
    grid = np.array([[code[c] for c in r] for r in rows], dtype=np.uint8)
    at = {k: [tuple(int(x) for x in p) for p in np.argwhere(grid == k)] for k in SYMBOL}
    players = at[PLAYER] + at[PLAYER_ON_TARGET]
    boxes = at[BOX] + at[BOX_ON_TARGET]
    targets = at[TARGET] + at[BOX_ON_TARGET] + at[PLAYER_ON_TARGET]
    if len(players) != 1 or not boxes or len(boxes) != len(targets):
        raise ValueError("a layout needs one player and as many boxes as targets")
    room = np.where(grid == WALL, WALL, FLOOR).astype(np.uint8)
    for t in targets:
        room[t] = TARGET
    return room, sorted(targets), sorted(boxes), players[0]


class SokobanEnv(gym.Env):
    """A Sokoban level as a gymnasium env. Observation: the `[size, size]` grid of cell codes (uint8)."""

    metadata = {"render_modes": ["ansi"], "render_fps": 4}

    def __init__(self, size: int = 6, boxes: int = 1, max_env_steps: int = 100, level_seed: int = 0,
                 render_mode: str | None = "ansi", layout: list[str] | None = None):
        """A generated level (`size`, `boxes`, `level_seed`), or a hand-made one: `layout` rows of symbols
        (SYMBOL's characters, no spaces), which then sets the size and the boxes."""
        if layout is not None:
            self.room, self.targets, self._start_boxes, self._start_player = parse_layout(layout)
            size, boxes = self.room.shape[0], len(self._start_boxes)
        if size < 4 or boxes < 1:
            raise ValueError(f"Sokoban needs size >= 4 and boxes >= 1, got size={size} boxes={boxes}")
        self.size, self.num_boxes, self.max_env_steps = size, boxes, max_env_steps
        self.render_mode = render_mode
        if layout is None:
            self.room, self.targets, self._start_boxes, self._start_player = generate_level(size, boxes, level_seed)
        self.observation_space = gym.spaces.Box(0, 6, (size, size), dtype=np.uint8)
        self.action_space = gym.spaces.Discrete(4)
        self.action_ids = tuple(range(len(ACTION_NAMES)))
        self.rules = RULES
        self.boxes, self.player, self.steps = list(self._start_boxes), self._start_player, 0

    def _grid(self) -> np.ndarray:
        grid = self.room.copy()
        for b in self.boxes:
            grid[b] = BOX_ON_TARGET if self.room[b] == TARGET else BOX
        grid[self.player] = PLAYER_ON_TARGET if self.room[self.player] == TARGET else PLAYER
        return grid

    @property
    def solved(self) -> bool:
        return all(self.room[b] == TARGET for b in self.boxes)

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self.boxes, self.player, self.steps = list(self._start_boxes), self._start_player, 0
        return self._grid(), {}

    def step(self, action):
        dr, dc = MOVES[int(action)]
        reward = STEP_PENALTY
        to = (self.player[0] + dr, self.player[1] + dc)
        if self.room[to] != WALL:
            if to in self.boxes:
                beyond = (to[0] + dr, to[1] + dc)
                if self.room[beyond] != WALL and beyond not in self.boxes:
                    self.boxes[self.boxes.index(to)] = beyond
                    reward += (BOX_ON if self.room[beyond] == TARGET else 0.0) - \
                        (BOX_ON if self.room[to] == TARGET else 0.0)
                    self.player = to
            else:
                self.player = to
        self.steps += 1
        terminated = self.solved
        if terminated:
            reward += SOLVED
        truncated = not terminated and self.steps >= self.max_env_steps
        return self._grid(), float(reward), terminated, truncated, {}

    def grid_text(self) -> str:
        grid = self._grid()
        return render_grid([[SYMBOL[int(v)] for v in row] for row in grid])

    def render(self):
        return self.grid_text() if self.render_mode == "ansi" else None
