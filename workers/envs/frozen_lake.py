"""FrozenLake with a text face: gymnasium's own `FrozenLakeEnv` on a generated map.

The level is the map, from the level seed. `levels: ragen` (the default, RAGEN's distribution): every cell is
ice with probability `frozen_prob`, the start and the goal are two distinct random cells, and a map without a
path from start to goal is redrawn; `levels: gymnasium`: gymnasium's `generate_random_map`, start and goal in
opposite corners. `success_rate` is the chance a move goes where intended (the rest slips to either
perpendicular side), 1.0 = deterministic. Reward +1 on the goal, 0 otherwise; a hole or the goal ends the episode.
"""

from __future__ import annotations

import numpy as np
from gymnasium.envs.toy_text.frozen_lake import FrozenLakeEnv, generate_random_map

from workers.envs.solve import frozen_lake_shortest_path
from workers.envs.text import ACTION_NAMES, render_grid

# gymnasium's action ids: LEFT 0, DOWN 1, RIGHT 2, UP 3; ours follow ACTION_NAMES (Up, Down, Left, Right)
_GYM_ACTION = {"Up": 3, "Down": 1, "Left": 0, "Right": 2}
_CELL = {b"S": "_", b"F": "_", b"H": "O", b"G": "G"}
_PLAYER = {b"S": "P", b"F": "P", b"H": "X", b"G": "√"}
RULES = ("FrozenLake: reach the goal G and avoid the holes O. P is you, _ is ice{slip}. "
         "Actions: Up, Down, Left, Right.")
SYMBOLS = ("P", "_", "O", "G", "X", "√")
# RAGEN's CoordFrozenLake instruction; the action list follows gymnasium's order, as RAGEN lists it
INSTRUCTION = ("You are solving the FrozenLake puzzle. The observation includes both a symbol grid and "
               "zero-indexed coordinates for the start, goal, player, and any holes.\n"
               "Coordinates range from the top-left corner (0, 0) to the bottom-right corner ({last}, {last}).\n"
               "{slip}Respond with a sequence of actions such as <answer>Left || Up || Up</answer>.\n")
SLIP = "Beware that the ice is slippery, so the agent might slide and end up in an unintended tile.\n"
INSTRUCTION_ACTIONS = ("Left", "Down", "Right", "Up")
# RAGEN's symbol legend (FrozenLakeEnvConfig.grid_vocab, in its order), shown in the ragen protocol's system message
LEGEND = "P: player, _: empty, O: hole, G: goal, X: player in hole, √: player on goal"


def ragen_map(size: int, frozen_prob: float, seed: int) -> list[str]:
    """A `size` x `size` map (gymnasium's S/F/H/G rows): ice with probability `frozen_prob`, start and goal at
    distinct random cells, redrawn until the goal is reachable."""
    rng = np.random.default_rng(int(seed))
    while True:
        board = rng.choice(np.array([b"F", b"H"]), (size, size), p=[frozen_prob, 1.0 - frozen_prob])
        start, goal = tuple(rng.integers(size, size=2)), tuple(rng.integers(size, size=2))
        if start == goal:
            continue
        board[start], board[goal] = b"S", b"G"
        if frozen_lake_shortest_path(board) is not None:
            return [b"".join(row).decode() for row in board]


def make_map(levels: str, size: int, frozen_prob: float, seed: int) -> list[str]:
    if levels == "ragen":
        return ragen_map(size, frozen_prob, seed)
    if levels == "gymnasium":
        return generate_random_map(size=size, p=frozen_prob, seed=int(seed))
    raise ValueError(f"frozen_lake levels must be 'ragen' or 'gymnasium', got {levels!r}")


def _coords(cells) -> str:
    return ", ".join(f"({int(r)}, {int(c)})" for r, c in cells)


class TextFrozenLake(FrozenLakeEnv):
    """gymnasium FrozenLake plus `action_ids`, `grid_text`, `coordinates`, `rules` and `solved` (the text face)."""

    metadata = {**FrozenLakeEnv.metadata, "render_modes": ["ansi"]}
    instruction_actions = INSTRUCTION_ACTIONS
    legend = LEGEND

    def __init__(self, size: int = 4, frozen_prob: float = 0.9, success_rate: float = 1.0, level_seed: int = 0,
                 render_mode: str | None = "ansi", desc: list[str] | None = None, levels: str = "ragen"):
        """A generated map (`levels`, `size`, `frozen_prob`, `level_seed`) or a hand-made one (`desc`,
        gymnasium's S/F/H/G rows)."""
        desc = desc or make_map(levels, size, frozen_prob, level_seed)
        super().__init__(render_mode=render_mode, desc=desc, is_slippery=success_rate < 1.0,
                         success_rate=success_rate)
        self.success_rate = success_rate
        self.action_ids = tuple(_GYM_ACTION[n] for n in ACTION_NAMES)

    @property
    def rules(self) -> str:
        return RULES.format(slip=", and a move may slip sideways" if self.success_rate < 1.0 else "")

    @property
    def instruction(self) -> str:
        return INSTRUCTION.format(last=self.nrow - 1, slip=SLIP if self.success_rate < 1.0 else "")

    def _rows(self) -> list[list[str]]:
        row, col = divmod(int(self.s), self.ncol)
        return [[(_PLAYER if (r, c) == (row, col) else _CELL)[bytes(self.desc[r, c])] for c in range(self.ncol)]
                for r in range(self.nrow)]

    def grid_text(self, spaced: bool = True) -> str:
        return render_grid(self._rows(), spaced=spaced)

    def coordinates(self) -> str:
        """Board size, start, goal, the player (on the goal / in a hole) and the holes, zero-indexed (row, col)."""
        at = {k: np.argwhere(self.desc == k) for k in (b"S", b"G", b"H")}
        player = divmod(int(self.s), self.ncol)
        tile = bytes(self.desc[player])
        label = {b"G": "Player on goal", b"H": "Player in hole"}.get(tile, "Player")
        lines = [f"Board size: {self.nrow} rows x {self.ncol} cols (zero-indexed).", f"Start: {_coords(at[b'S'])}",
                 f"Goal: {_coords(at[b'G'])}", f"{label}: {_coords([player])}"]
        if len(at[b"H"]):
            lines.append(f"Holes: {_coords(at[b'H'])}")
        return "\n".join(lines)

    @property
    def solved(self) -> bool:
        row, col = divmod(int(self.s), self.ncol)
        return bytes(self.desc[row, col]) == b"G"

    def render(self):
        return self.grid_text() if self.render_mode == "ansi" else super().render()
