"""Exact level analysis for the grid environments, independent of the envs' own step code: a breadth-first
Sokoban solver, FrozenLake shortest paths, and the success probabilities of a uniform-random policy and of the
best policy within an action budget (dynamic programming over the state distribution, no sampling).

Used by the tests (every generated level is solvable) and by `benchmarks/envs.py` (the difficulty tables).
"""

from __future__ import annotations

from collections import deque
from functools import cache

import numpy as np

MOVES = ((-1, 0), (1, 0), (0, -1), (0, 1))  # Up, Down, Left, Right

Pos = tuple[int, int]


def sokoban_push(walls: np.ndarray, boxes: frozenset, player: Pos, move: Pos) -> tuple[frozenset, Pos]:
    """The (boxes, player) after one move: walls and a blocked box leave the state unchanged."""
    to = (player[0] + move[0], player[1] + move[1])
    if walls[to]:
        return boxes, player
    if to in boxes:
        beyond = (to[0] + move[0], to[1] + move[1])
        if walls[beyond] or beyond in boxes:
            return boxes, player
        return (boxes - {to}) | {beyond}, to
    return boxes, to


def sokoban_optimal_moves(walls: np.ndarray, targets, boxes, player: Pos, limit: int = 200_000) -> int | None:
    """Fewest moves that put every box on a target (BFS over (boxes, player)); None when unsolvable."""
    goal = frozenset(targets)
    start = (frozenset(boxes), tuple(player))
    if start[0] == goal:
        return 0
    seen, queue = {start}, deque([(start, 0)])
    while queue and len(seen) < limit:
        (bx, pl), d = queue.popleft()
        for m in MOVES:
            nxt = sokoban_push(walls, bx, pl, m)
            if nxt[0] == goal:
                return d + 1
            if nxt not in seen:
                seen.add(nxt)
                queue.append((nxt, d + 1))
    return None


def sokoban_random_success(walls: np.ndarray, targets, boxes, player: Pos, actions: int = 10) -> float:
    """Probability that `actions` uniform-random moves solve the level (the episode ends when solved)."""
    goal = frozenset(targets)
    dist, won = {(frozenset(boxes), tuple(player)): 1.0}, 0.0
    for _ in range(actions):
        nxt: dict = {}
        for (bx, pl), p in dist.items():
            for m in MOVES:
                state = sokoban_push(walls, bx, pl, m)
                if state[0] == goal:
                    won += p / 4
                else:
                    nxt[state] = nxt.get(state, 0.0) + p / 4
        dist = nxt
    return won


def _lake_step(desc: np.ndarray, s: Pos, move: Pos) -> Pos:
    r, c = s[0] + move[0], s[1] + move[1]
    return (r, c) if 0 <= r < desc.shape[0] and 0 <= c < desc.shape[1] else s


def _lake_outcomes(desc: np.ndarray, s: Pos, a: int, success_rate: float) -> list[tuple[Pos, float]]:
    """gymnasium's slip model: the intended move with `success_rate`, each perpendicular one with the rest / 2."""
    if success_rate >= 1.0:
        return [(_lake_step(desc, s, MOVES[a]), 1.0)]
    side = (2, 3) if a < 2 else (0, 1)
    return [(_lake_step(desc, s, MOVES[a]), success_rate)] + [
        (_lake_step(desc, s, MOVES[b]), (1.0 - success_rate) / 2) for b in side]


def frozen_lake_shortest_path(desc: np.ndarray) -> int | None:
    """Fewest moves from S to G avoiding holes (`desc`: gymnasium's byte map); None when unreachable."""
    start = tuple(int(x) for x in np.argwhere(desc == b"S")[0])
    seen, queue = {start}, deque([(start, 0)])
    while queue:
        s, d = queue.popleft()
        for m in MOVES:
            t = _lake_step(desc, s, m)
            if desc[t] == b"G":
                return d + 1
            if desc[t] != b"H" and t not in seen:
                seen.add(t)
                queue.append((t, d + 1))
    return None


def frozen_lake_success(desc: np.ndarray, success_rate: float, actions: int = 10, policy: str = "best") -> float:
    """Probability of reaching G within `actions` moves: `best` = the optimal policy (finite-horizon value
    iteration), `random` = uniform-random actions."""
    start = tuple(int(x) for x in np.argwhere(desc == b"S")[0])

    @cache
    def value(s: Pos, left: int) -> float:
        if desc[s] == b"G":
            return 1.0
        if desc[s] == b"H" or left == 0:
            return 0.0
        per_action = [sum(p * value(t, left - 1) for t, p in _lake_outcomes(desc, s, a, success_rate))
                      for a in range(4)]
        return max(per_action) if policy == "best" else sum(per_action) / 4

    return value(start, actions)
