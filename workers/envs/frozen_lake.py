"""FrozenLake with a text face: gymnasium's own `FrozenLakeEnv` on a map from `generate_random_map`.

The level is the map (`generate_random_map(size, frozen_prob, seed=level_seed)`); `success_rate` is the chance
a move goes where intended (the rest slips to either perpendicular side), 1.0 = deterministic. Reward +1 on the
goal, 0 otherwise; a hole or the goal ends the episode.
"""

from __future__ import annotations

from gymnasium.envs.toy_text.frozen_lake import FrozenLakeEnv, generate_random_map

from workers.envs.text import ACTION_NAMES, render_grid

# gymnasium's action ids: LEFT 0, DOWN 1, RIGHT 2, UP 3; ours follow ACTION_NAMES (Up, Down, Left, Right)
_GYM_ACTION = {"Up": 3, "Down": 1, "Left": 0, "Right": 2}
_CELL = {b"S": "_", b"F": "_", b"H": "O", b"G": "G"}
_PLAYER = {b"S": "P", b"F": "P", b"H": "X", b"G": "√"}
RULES = ("FrozenLake: reach the goal G and avoid the holes O. P is you, _ is ice{slip}. "
         "Actions: Up, Down, Left, Right.")
SYMBOLS = ("P", "_", "O", "G", "X", "√")


class TextFrozenLake(FrozenLakeEnv):
    """gymnasium FrozenLake plus `action_ids`, `grid_text`, `rules` and `solved` (the text face)."""

    metadata = {**FrozenLakeEnv.metadata, "render_modes": ["ansi"]}

    def __init__(self, size: int = 4, frozen_prob: float = 0.8, success_rate: float = 1.0, level_seed: int = 0,
                 render_mode: str | None = "ansi", desc: list[str] | None = None):
        """A generated map (`size`, `frozen_prob`, `level_seed`) or a hand-made one (`desc`, gymnasium's
        S/F/H/G rows)."""
        desc = desc or generate_random_map(size=size, p=frozen_prob, seed=int(level_seed))
        super().__init__(render_mode=render_mode, desc=desc, is_slippery=success_rate < 1.0,
                         success_rate=success_rate)
        self.success_rate = success_rate
        self.action_ids = tuple(_GYM_ACTION[n] for n in ACTION_NAMES)

    @property
    def rules(self) -> str:
        return RULES.format(slip=", and a move may slip sideways" if self.success_rate < 1.0 else "")

    def grid_text(self) -> str:
        row, col = divmod(int(self.s), self.ncol)
        rows = [[(_PLAYER if (r, c) == (row, col) else _CELL)[bytes(self.desc[r, c])] for c in range(self.ncol)]
                for r in range(self.nrow)]
        return render_grid(rows)

    @property
    def solved(self) -> bool:
        row, col = divmod(int(self.s), self.ncol)
        return bytes(self.desc[row, col]) == b"G"

    def render(self):
        return self.grid_text() if self.render_mode == "ansi" else super().render()
