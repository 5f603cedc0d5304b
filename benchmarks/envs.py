"""Level difficulty of the agentic environments' generators, measured with the independent solvers of
`workers.envs.solve` (BFS, exact dynamic programming; no sampling), beside RAGEN's numbers.

    python benchmarks/envs.py [--levels 200]

Per generator: the optimal-moves histogram, the share solvable in 1 and in <= 2 moves (one turn of 2 actions),
the success of 10 uniform-random actions, the player next to a box (Sokoban) and the generation time; for
FrozenLake also the best achievable success within 10 actions at success_rate 0.8 and 0.98. The last line
compares our default Sokoban generator with RAGEN's measured one-move share, random success and mean moves.
"""

from __future__ import annotations

import argparse
import time
from collections import Counter

import numpy as np

from workers.envs.frozen_lake import make_map
from workers.envs.sokoban import WALL, generate_level
from workers.envs.solve import (
    frozen_lake_shortest_path,
    frozen_lake_success,
    sokoban_optimal_moves,
    sokoban_random_success,
)

# measured on RAGEN's generators (200 levels each, an independent BFS)
RAGEN = {"sokoban": {"moves_mean": 3.98, "one": 0.105, "two": 0.33, "random": 0.187, "next_to_box": 0.60},
         "frozen_lake": {"moves_mean": 2.81, "two": 0.46, "random": 0.231, "best_0.8": 0.94}}


def _hist(values) -> str:
    c = Counter(values)
    return " ".join(f"{k}:{c[k]}" for k in sorted(c, key=lambda v: (v is None, v)))


def sokoban_rows(n: int) -> dict:
    t0 = time.perf_counter()
    levels = [generate_level(6, 1, seed) for seed in range(n)]
    gen_s = time.perf_counter() - t0
    moves, rand, adjacent = [], [], []
    for room, targets, boxes, player in levels:
        walls = room == WALL
        moves.append(sokoban_optimal_moves(walls, targets, boxes, player))
        rand.append(sokoban_random_success(walls, targets, boxes, player, actions=10))
        adjacent.append(any(abs(b[0] - player[0]) + abs(b[1] - player[1]) == 1 for b in boxes))
    m = np.array([x for x in moves if x is not None])
    return {"levels": n, "solvable": len(m) / n, "hist": _hist(moves), "moves_mean": m.mean(),
            "moves_median": float(np.median(m)), "one": np.mean(m == 1), "two": np.mean(m <= 2),
            "random": float(np.mean(rand)), "next_to_box": float(np.mean(adjacent)),
            "floor": float(np.mean([(room != WALL).sum() for room, *_ in levels])), "gen_ms": 1000 * gen_s / n}


def frozen_lake_rows(n: int, levels: str, rate: float = 0.8) -> dict:
    maps = [np.asarray(make_map(levels, 4, 0.9 if levels == "ragen" else 0.8, seed), dtype="c") for seed in range(n)]
    paths = np.array([frozen_lake_shortest_path(d) for d in maps])
    return {"levels": n, "hist": _hist(paths.tolist()), "moves_mean": paths.mean(), "one": np.mean(paths == 1),
            "two": np.mean(paths <= 2),
            "random": float(np.mean([frozen_lake_success(d, rate, 10, "random") for d in maps])),
            "best_0.8": float(np.mean([frozen_lake_success(d, 0.8, 10, "best") for d in maps])),
            "best_0.98": float(np.mean([frozen_lake_success(d, 0.98, 10, "best") for d in maps]))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--levels", type=int, default=200, help="levels per generator")
    n = ap.parse_args().levels
    sok = sokoban_rows(n)
    print(f"Sokoban 6x6, 1 box, levels: ragen ({n} levels, seeds 0..{n - 1}); RAGEN's generator in brackets")
    print(f"  optimal moves histogram   {sok['hist']}")
    print(f"  optimal moves mean/median {sok['moves_mean']:.2f} / {sok['moves_median']:.0f}   "
          f"[{RAGEN['sokoban']['moves_mean']} / 4]")
    print(f"  solvable in 1 / <= 2      {sok['one']:.1%} / {sok['two']:.1%}   [10.5% / 33%]")
    print(f"  random 10-action success  {sok['random']:.1%}   [18.7%]")
    print(f"  player next to the box    {sok['next_to_box']:.0%}   [60%];  floor cells {sok['floor']:.1f} [10.6]")
    print(f"  solvable (BFS)            {sok['solvable']:.0%};  generation {sok['gen_ms']:.2f} ms/level")
    for levels in ("ragen", "gymnasium"):
        fl = frozen_lake_rows(n, levels)
        p = 0.9 if levels == "ragen" else 0.8
        print(f"FrozenLake 4x4, levels: {levels} (frozen_prob {p}, {n} levels)"
              + ("; RAGEN's generator in brackets" if levels == "ragen" else ""))
        print(f"  shortest path histogram   {fl['hist']}")
        ref = RAGEN["frozen_lake"] if levels == "ragen" else None

        def br(key: str, fmt: str, ref=ref) -> str:
            return f"   [{format(ref[key], fmt)}]" if ref else ""

        print(f"  shortest path mean        {fl['moves_mean']:.2f}{br('moves_mean', '.2f')}")
        print(f"  solvable in 1 / <= 2      {fl['one']:.1%} / {fl['two']:.1%}{br('two', '.0%')}")
        print(f"  random 10-action success  {fl['random']:.1%} (success_rate 0.8){br('random', '.1%')}")
        print(f"  best success, 10 actions  {fl['best_0.8']:.1%} at 0.8{br('best_0.8', '.0%')}, "
              f"{fl['best_0.98']:.1%} at 0.98")
    r = RAGEN["sokoban"]
    print(f"ratio ours/RAGEN (Sokoban): one-move share {sok['one'] / r['one']:.2f}, random success "
          f"{sok['random'] / r['random']:.2f}, mean optimal moves {sok['moves_mean'] / r['moves_mean']:.2f}")


if __name__ == "__main__":
    main()
