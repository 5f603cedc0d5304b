"""Sokoban with a text face: a small gymnasium env and the classic level generator (gym-sokoban's, as RAGEN runs it).

A level comes from its seed in four steps (all draws from one numpy generator seeded by the level seed):
1. the room: a random walk of `1.7 * (rows + cols)` steps inside the walls (direction change 0.35) stamping a
   random 3x3 floor mask at every step;
2. the player and the box targets on distinct floor cells (boxes start on their targets: the solved state);
3. reverse play: an exhaustive depth-first search (depth 300, at most 300k states) over the player's moves and
   *pulls* from the solved state. Every pull is the inverse of a push, so every state found can be pushed back
   to the solved one: every level is solvable. It keeps the first state with the best score = box swaps (how
   often the pulled box changed) x total box displacement, among states with no box and no player on a target;
4. one to three random player steps (probability 0.8 when the displacement is 1, else 0.5), so the player does
   not always start next to the box.
A seed whose room leaves no room for the pieces or whose search moves no box re-seeds deterministically.

Rewards: -0.1 per step, +1 for a box pushed onto a target, -1 for one pushed off, +10 when every box is on a
target (the episode then terminates). `max_env_steps` truncates.
"""

from __future__ import annotations

import sys

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
# RAGEN's CoordSokoban instruction (config/envs.yaml, a YAML literal block: three lines end with a space)
INSTRUCTION = ("You are solving the Sokoban puzzle. You are the player and you need to push all boxes to targets.\n"
               "You are provided with a symbol grid and the zero-indexed coordinates of the player, each box, and "
               "each target. \n"
               "Coordinates range from the top-left corner (0, 0) to the bottom-right corner ({last}, {last}). \n"
               "When you are exactly next to a box, you can push it by moving in the same direction. \n"
               "You cannot push a box through a wall, and you cannot pull a box.\n"
               "The answer should be a sequence of actions, like <answer>Right || Right || Up</answer>.\n")
# RAGEN's symbol legend (SokobanEnvConfig.grid_vocab, in its order), shown in the ragen protocol's system message
LEGEND = "#: wall, _: empty, O: target, √: box on target, X: box, P: player, S: player on target"
SEARCH_DEPTH, SEARCH_STATES = 300, 300_000
# the 3x3 floor masks the room walk stamps (gym-sokoban's five shapes: a bar each way, three corners)
_MASKS = tuple(np.array(m, dtype=bool) for m in (
    [[0, 0, 0], [1, 1, 1], [0, 0, 0]], [[0, 1, 0], [0, 1, 0], [0, 1, 0]], [[0, 0, 0], [1, 1, 0], [0, 1, 0]],
    [[0, 0, 0], [1, 1, 0], [1, 1, 0]], [[0, 0, 0], [0, 1, 1], [0, 1, 0]]))
_WALK_DIRECTIONS = ((1, 0), (0, 1), (-1, 0), (0, -1))

Pos = tuple[int, int]


def carve_room(size: int, rng: np.random.Generator, p_turn: float = 0.35) -> np.ndarray:
    """A `[size, size]` grid of WALL / FLOOR: a random walk stamping 3x3 floor masks, walls on the border."""
    room = np.zeros((size, size), dtype=bool)
    direction = _WALK_DIRECTIONS[rng.integers(4)]
    pos = np.array([rng.integers(1, size), rng.integers(1, size)])
    for _ in range(int(1.7 * (size + size))):
        if rng.random() < p_turn:
            direction = _WALK_DIRECTIONS[rng.integers(4)]
        pos = np.clip(pos + direction, 1, size - 2)
        room[pos[0] - 1:pos[0] + 2, pos[1] - 1:pos[1] + 2] |= _MASKS[rng.integers(len(_MASKS))]
    room[[0, -1], :] = room[:, [0, -1]] = False
    return np.where(room, FLOOR, WALL).astype(np.uint8)


class _ReverseSearch:
    """Depth-first reverse play from the solved state (player moves; a box behind the player is pulled along).
    States are (player, boxes in target order); a state is scored the first time the search reaches it."""

    def __init__(self, room: np.ndarray, targets: list[Pos], depth: int, max_states: int):
        self.open = room != WALL
        self.targets, self.depth, self.max_states = targets, depth, max_states
        self.seen: set[tuple[Pos, tuple[Pos, ...]]] = set()
        self.best: tuple[int, tuple[Pos, ...], Pos] = (-1, tuple(targets), (-1, -1))

    def run(self, player: Pos) -> tuple[int, tuple[Pos, ...], Pos]:
        limit = sys.getrecursionlimit()
        sys.setrecursionlimit(max(limit, self.depth + 200))
        try:
            self._visit(player, tuple(self.targets), 0, -1, self.depth)
        finally:
            sys.setrecursionlimit(limit)
        return self.best

    def _score(self, player: Pos, boxes: tuple[Pos, ...], swaps: int) -> int:
        covered = set(boxes) | {player}
        if any(t in covered for t in self.targets):
            return 0
        return swaps * sum(abs(b[0] - t[0]) + abs(b[1] - t[1]) for b, t in zip(boxes, self.targets, strict=True))

    def _visit(self, player: Pos, boxes: tuple[Pos, ...], swaps: int, last_pull: int, ttl: int) -> None:
        ttl -= 1
        key = (player, tuple(sorted(boxes)))
        if ttl <= 0 or len(self.seen) >= self.max_states or key in self.seen:
            return
        self.seen.add(key)
        if (score := self._score(player, boxes, swaps)) > self.best[0]:
            self.best = (score, boxes, player)
        for dr, dc in MOVES:
            to = (player[0] + dr, player[1] + dc)
            if not self.open[to] or to in boxes:
                continue
            behind = (player[0] - dr, player[1] - dc)
            pulled, nxt = last_pull, boxes
            if behind in boxes:  # pull: the box follows the player into its old cell
                pulled = boxes.index(behind)
                nxt = boxes[:pulled] + (player,) + boxes[pulled + 1:]
            self._visit(to, nxt, swaps + (pulled != last_pull), pulled, ttl)


def _random_steps(room: np.ndarray, boxes: tuple[Pos, ...], player: Pos, rng: np.random.Generator,
                  p_move: float) -> Pos:
    """Up to three random player steps onto free cells never visited before (continue probability 0.5)."""
    if rng.random() > p_move:
        return player
    visited = [player]
    for _ in range(3):
        free = [(player[0] + dr, player[1] + dc) for dr, dc in MOVES]
        free = [p for p in free if room[p] != WALL and p not in boxes and p not in visited]
        if not free:
            break
        player = free[rng.integers(len(free))]
        visited.append(player)
        if rng.random() > 0.5:
            break
    return player


def generate_level(size: int, num_boxes: int, seed: int, search_depth: int = SEARCH_DEPTH
                   ) -> tuple[np.ndarray, list[Pos], list[Pos], Pos]:
    """(room of WALL/FLOOR/TARGET, targets, boxes, player) for a level seed; deterministic in its arguments."""
    for attempt in range(1000):
        rng = np.random.default_rng([int(seed) % 2**63, attempt])
        room = carve_room(size, rng)
        floor = [tuple(int(x) for x in p) for p in np.argwhere(room == FLOOR)]
        if len(floor) <= num_boxes + 1:
            continue
        cells = rng.choice(len(floor), num_boxes + 1, replace=False)
        player, targets = floor[cells[0]], [floor[i] for i in cells[1:]]
        score, boxes, player = _ReverseSearch(room, targets, search_depth, SEARCH_STATES).run(player)
        if score <= 0:
            continue
        displacement = sum(abs(b[0] - t[0]) + abs(b[1] - t[1]) for b, t in zip(boxes, targets, strict=True))
        for t in targets:
            room[t] = TARGET
        player = _random_steps(room, boxes, player, rng, 0.8 if displacement == 1 else 0.5)
        return room, targets, list(boxes), player
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
    instruction_actions = ACTION_NAMES
    legend = LEGEND

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
        self.instruction = INSTRUCTION.format(last=size - 1)
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

    def grid_text(self, spaced: bool = True) -> str:
        grid = self._grid()
        return render_grid([[SYMBOL[int(v)] for v in row] for row in grid], spaced=spaced)

    def coordinates(self) -> str:
        """Board size, targets, boxes (off / on a target) and the player, zero-indexed (row, col), row-major."""
        grid = self._grid()
        lines = [f"Board size: {self.size} rows x {self.size} cols (zero-indexed)."]
        for label, codes in (("Targets", (TARGET, BOX_ON_TARGET, PLAYER_ON_TARGET)), ("Boxes", (BOX,)),
                             ("Boxes on target", (BOX_ON_TARGET,)), ("Player", (PLAYER,)),
                             ("Player on target", (PLAYER_ON_TARGET,))):
            cells = np.argwhere(np.isin(grid, codes))
            if len(cells):
                lines.append(f"{label}: " + ", ".join(f"({int(r)}, {int(c)})" for r, c in cells))
        return "\n".join(lines)

    def render(self):
        return self.grid_text() if self.render_mode == "ansi" else None
