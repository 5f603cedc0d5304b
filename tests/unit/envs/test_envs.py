"""Agentic environments: gymnasium conformance, level solvability, the answer grammar, reward accounting
against hand-played episodes, slipping statistics, the text episode's budgets and the level stream."""

from __future__ import annotations

from collections import deque

import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env
from hypothesis import given, settings
from hypothesis import strategies as st

from workers.envs import ACTION_NAMES, EVAL_SEED_LIMIT, EnvTask, TextEpisode, format_answer, parse_answer
from workers.envs.frozen_lake import TextFrozenLake
from workers.envs.sokoban import MOVES, TARGET, WALL, SokobanEnv
from workers.envs.solve import frozen_lake_shortest_path, sokoban_optimal_moves, sokoban_random_success
from workers.tasks.config import task_config


class Budget:  # the RolloutConfig fields an episode reads
    max_turns, max_actions_per_turn, max_actions_per_episode, max_tokens = 5, 2, 10, 64


def bfs_solve(env: SokobanEnv, limit: int = 200_000) -> int | None:
    """Fewest pushes-and-moves to solve the level from its start, by breadth-first search (None: unsolvable)."""
    start = (env._start_player, tuple(sorted(env._start_boxes)))
    seen, queue = {start}, deque([(start, 0)])
    while queue and len(seen) < limit:
        (player, boxes), depth = queue.popleft()
        if all(env.room[b] == TARGET for b in boxes):
            return depth
        for dr, dc in MOVES:
            to = (player[0] + dr, player[1] + dc)
            if env.room[to] == WALL:
                continue
            nb = list(boxes)
            if to in boxes:
                beyond = (to[0] + dr, to[1] + dc)
                if env.room[beyond] == WALL or beyond in boxes:
                    continue
                nb[nb.index(to)] = beyond
            state = (to, tuple(sorted(nb)))
            if state not in seen:
                seen.add(state)
                queue.append((state, depth + 1))
    return None


@pytest.mark.parametrize("make", [
    lambda: TextFrozenLake(level_seed=3),
    lambda: TextFrozenLake(size=5, success_rate=0.8, level_seed=4),
    lambda: SokobanEnv(level_seed=1),
    lambda: SokobanEnv(size=7, boxes=2, level_seed=2),
])
def test_check_env_passes(make):
    check_env(make(), skip_render_check=True)


@pytest.mark.parametrize("size, boxes", [(6, 1), (7, 2)])
def test_every_generated_sokoban_level_is_solvable_and_unsolved(size, boxes):
    for seed in range(40 if boxes == 1 else 10):
        env = SokobanEnv(size=size, boxes=boxes, level_seed=seed)
        assert not env.solved
        depth = bfs_solve(env)
        assert depth is not None and depth >= 1, (seed, env.grid_text())


def test_levels_are_a_function_of_their_seed():
    a, b, c = (SokobanEnv(level_seed=s).grid_text() for s in (11, 11, 12))
    assert a == b and a != c
    fa, fb = TextFrozenLake(level_seed=5), TextFrozenLake(level_seed=5)
    fa.reset(seed=0)
    fb.reset(seed=1)
    assert fa.grid_text() == fb.grid_text()


@given(st.lists(st.sampled_from(ACTION_NAMES), min_size=1, max_size=4))
def test_rendered_answer_parses_back(actions):
    parsed = parse_answer(format_answer(actions), ACTION_NAMES, max_actions=4)
    assert [ACTION_NAMES[a] for a in parsed.actions] == actions and not parsed.invalid


@given(st.text(max_size=300))
@settings(max_examples=300)
def test_arbitrary_text_never_raises(text):
    parsed = parse_answer(text, ACTION_NAMES, max_actions=2)
    assert len(parsed.actions) <= 2


@given(st.text(alphabet=st.sampled_from(list("<>/|answerUpDown Left Right think")), max_size=80))
def test_grammar_like_garbage_never_raises(text):
    parse_answer(text)
    parse_answer("<answer>" + text + "</answer>")


def test_grammar_details():
    assert parse_answer("< answer > Up | | left < / answer >").actions == (0, 2)  # word-level decode spacing
    assert parse_answer("<think>go Down</think><answer>Down</answer>").actions == (1,)
    cut = parse_answer("<answer>Up || Up || Down</answer>", max_actions=2)
    assert cut.actions == (0, 0) and not cut.invalid  # extra actions are cut, not penalised
    bad = parse_answer("<answer>Up || Jump</answer>")
    assert bad.actions == (0,) and bad.invalid and bad.items == 2
    assert parse_answer("<answer></answer>").invalid and parse_answer("Up || Down").invalid
    assert parse_answer("__import__('os').system('x')").actions == ()


def _frozen(desc, success_rate=1.0):
    return TextFrozenLake(desc=desc, success_rate=success_rate)


def test_frozen_lake_hand_played_rewards_holes_and_goal():
    desc = ["SFFF", "FHFH", "FFFH", "HFFG"]
    ep = TextEpisode(_frozen(desc), dynamics_seed=0, **_budget())
    assert "P _ _ _\n_ O _ O" in ep.prompt()
    out = ep.play("<answer>Down || Down</answer>")
    assert (out.reward, out.done, out.actions) == (0.0, False, 2) and "Actions left: 8." in out.observation
    out = ep.play("<answer>Right || Jump</answer>")  # one valid action, one unknown: penalty, move applied
    assert out.reward == pytest.approx(-0.1) and out.invalid and out.actions == 1
    assert out.observation.startswith("An invalid action was dropped. Reward: -0.1\n")
    out = ep.play("<answer>Right || Down</answer>")
    assert out.reward == 0.0 and not out.done
    out = ep.play("<answer>Right || Right</answer>")  # (3,2) -> goal at (3,3); the second action is not applied
    assert out.reward == 1.0 and out.done and out.actions == 1
    assert ep.stats.success and ep.stats.episode_return == pytest.approx(0.9) and ep.stats.actions == 6

    ep = TextEpisode(_frozen(desc), dynamics_seed=0, **_budget())
    out = ep.play("<answer>Jump</answer>")  # nothing valid: penalty, no move
    assert out.reward == pytest.approx(-0.1) and out.actions == 0
    assert out.observation.startswith("No valid action was given. Reward: -0.1\n")
    out = ep.play("<answer>Right || Down</answer>")  # (0,1) -> hole at (1,1)
    assert out.done and out.reward == 0.0 and not ep.stats.success
    assert ep.env.grid_text().splitlines()[1] == "_ X _ O"


def _budget(**kw):
    b = {"max_actions_per_turn": 2, "max_actions_per_episode": 10, "max_turns": 5}
    return {**b, **kw}


def test_sokoban_hand_played_rewards():
    layout = ["######", "#P_X_#", "#___O#", "#____#", "#____#", "######"]
    env = SokobanEnv(layout=layout)
    ep = TextEpisode(env, dynamics_seed=0, **_budget(max_actions_per_episode=10))
    assert ep.env.grid_text().splitlines()[1] == "# P _ X _ #"
    out = ep.play("<answer>Right || Right</answer>")  # walk, push the box right (not on a target)
    assert out.reward == pytest.approx(-0.2)
    out = ep.play("<answer>Up</answer>")  # into a wall: still a step
    assert out.reward == pytest.approx(-0.1)
    out = ep.play("<answer>Right || Down</answer>")  # Right: push box into the wall, blocked; Down: walk
    assert out.reward == pytest.approx(-0.2)
    env2 = SokobanEnv(layout=["######", "#____#", "#_PXO#", "#____#", "#____#", "######"])
    ep2 = TextEpisode(env2, dynamics_seed=0, **_budget())
    out = ep2.play("<answer>Right</answer>")  # box onto the only target: solved
    assert out.reward == pytest.approx(-0.1 + 1.0 + 10.0) and out.done and ep2.stats.success
    env3 = SokobanEnv(layout=["######", "#____#", "#_P√_#", "#____#", "#____#", "######"])
    ep3 = TextEpisode(env3, dynamics_seed=0, **_budget())
    out = ep3.play("<answer>Right</answer>")  # box off its target
    assert out.reward == pytest.approx(-0.1 - 1.0) and not out.done


def test_format_penalty_once_per_turn_and_budgets():
    ep = TextEpisode(SokobanEnv(level_seed=3), dynamics_seed=0, **_budget(max_turns=3))
    for text in ("nothing here", "<answer>Jump || Fly</answer>", "<answer>Up</answer>"):
        ep.play(text)
    assert ep.done and ep.stats.invalid_turns == 2 and ep.stats.turn_rewards[:2] == [-0.1, -0.1]
    assert ep.stats.invalid_actions == 2 and ep.stats.items == 3
    with pytest.raises(RuntimeError):
        ep.play("<answer>Up</answer>")
    ep = TextEpisode(TextFrozenLake(frozen_prob=1.0, levels="gymnasium"), dynamics_seed=0,
                     **_budget(max_actions_per_episode=3))
    ep.play("<answer>Up || Left</answer>")  # walls: no move, no end
    out = ep.play("<answer>Up || Left</answer>")
    assert out.done and out.actions == 1 and ep.stats.actions == 3  # the episode's action budget


def test_slipping_matches_success_rate():
    """From the start of an all-ice map, 'Right' lands right with p = success_rate, else up/down (clamped)."""
    rate, trials = 0.8, 4000
    env = TextFrozenLake(size=4, frozen_prob=1.0, success_rate=rate, levels="gymnasium")
    moved_right = 0
    for i in range(trials):
        env.reset(seed=i)
        state, *_ = env.step(env.action_ids[ACTION_NAMES.index("Right")])
        moved_right += state == 1
    sd = np.sqrt(rate * (1 - rate) / trials)
    assert abs(moved_right / trials - rate) < 4 * sd
    det = TextFrozenLake(size=4, frozen_prob=1.0, success_rate=1.0, levels="gymnasium")
    for i in range(50):
        det.reset(seed=i)
        assert det.step(det.action_ids[ACTION_NAMES.index("Down")])[0] == 4


def test_level_stream_is_seeded_resumable_and_disjoint_from_validation():
    a, b = EnvTask(task_config(name="sokoban"), 1), EnvTask(task_config(name="sokoban"), 1)
    first = a.next_levels(4)
    assert first == b.next_levels(4) and first != EnvTask(task_config(name="sokoban"), 2).next_levels(4)
    assert min(first) >= EVAL_SEED_LIMIT and max(a.eval_levels(512)) < EVAL_SEED_LIMIT
    state = a.state_dict()
    nxt = a.next_levels(3)
    c = EnvTask(task_config(name="sokoban"), 1)
    c.load_state_dict(state)
    assert c.next_levels(3) == nxt
    with pytest.raises(ValueError):
        c.load_state_dict({"task": "frozen_lake", "seed": 1, "cursor": 0})
    group = [a.episode(first[0], g, Budget) for g in range(3)]
    assert len({ep.env.grid_text() for ep in group}) == 1  # a group plays one level


def _bfs_levels(n: int) -> list[tuple[SokobanEnv, int]]:
    return [(env, bfs_solve(env)) for env in (SokobanEnv(level_seed=s) for s in range(n))]


def test_default_sokoban_levels_have_ragens_difficulty():
    """200 default levels (6x6, 1 box): all solvable, few one-move levels, random success near RAGEN's 18.7%."""
    levels = _bfs_levels(200)
    depths = np.array([d for _, d in levels])
    assert all(d is not None and d >= 1 for _, d in levels)
    assert np.mean(depths == 1) <= 0.20 and np.mean(depths <= 2) < 0.5
    # uniform-random 10-action success, exact (every 4^k prefix weighted), by the independent solver module
    rand = np.mean([sokoban_random_success(e.room == WALL, e.targets, e._start_boxes, e._start_player, 10)
                    for e, _ in levels])
    assert 0.10 <= rand <= 0.30, rand
    # the module's BFS agrees with this file's
    assert [sokoban_optimal_moves(e.room == WALL, e.targets, e._start_boxes, e._start_player)
            for e, _ in levels[:40]] == list(depths[:40])


def test_sokoban_random_success_matches_monte_carlo():
    env = SokobanEnv(level_seed=4)
    exact = sokoban_random_success(env.room == WALL, env.targets, env._start_boxes, env._start_player, 10)
    rng, wins, n = np.random.default_rng(0), 0, 4000
    for _ in range(n):
        env.reset()
        for a in rng.integers(4, size=10):
            if env.step(int(a))[2]:
                wins += 1
                break
    assert abs(wins / n - exact) < 4 * np.sqrt(exact * (1 - exact) / n) + 1e-9


def test_frozen_lake_ragen_maps_are_solvable_with_random_start_and_goal():
    starts, paths = set(), []
    for seed in range(100):
        env = TextFrozenLake(level_seed=seed)
        start, goal = (tuple(np.argwhere(env.desc == k)[0]) for k in (b"S", b"G"))
        env.reset(seed=0)
        assert start != goal and env.grid_text().count("P") == 1
        paths.append(frozen_lake_shortest_path(env.desc))
        starts.add(start)
    assert None not in paths and len(set(paths)) >= 4 and len(starts) >= 8
    corner = [frozen_lake_shortest_path(TextFrozenLake(level_seed=s, levels="gymnasium").desc) for s in range(20)]
    assert set(corner) == {6}  # gymnasium's maps: start and goal in opposite corners
    assert (TextFrozenLake(level_seed=7).desc == TextFrozenLake(level_seed=7).desc).all()


def _fixed_plan_outcomes(dynamics: str, n: int = 16) -> list[tuple]:
    """One group of n members on one slippery level, every member playing the same fixed plan."""
    task = EnvTask(task_config(name="frozen_lake", success_rate=0.8, frozen_prob=1.0, levels="gymnasium",
                              dynamics=dynamics, protocol="plain"), 0)
    level = task.next_levels(1)[0]
    outcomes = []
    for member in range(n):
        ep = task.episode(level, member, Budget)
        while not ep.done:
            ep.play("<answer>Right || Down</answer>")
        outcomes.append((ep.stats.success, int(ep.env.s), ep.stats.actions))
    return outcomes


def test_shared_dynamics_give_a_group_identical_outcomes_for_one_plan():
    assert len(set(_fixed_plan_outcomes("shared"))) == 1  # 16/16 identical
    assert len(set(_fixed_plan_outcomes("independent"))) > 1


def test_validation_levels_have_their_own_streams_the_same_for_every_trial_seed():
    cfg = task_config(name="frozen_lake", success_rate=0.8)
    a, b = EnvTask(cfg, 1), EnvTask(cfg, 2)
    assert a.eval_levels(8) == b.eval_levels(8)

    def slips(task, level):
        ep = task.episode(level, 0, Budget)
        return [int(ep.env.np_random.integers(1 << 30)) for _ in range(3)]

    assert [slips(a, lv) for lv in range(4)] == [slips(b, lv) for lv in range(4)]
    assert len({tuple(slips(a, lv)) for lv in range(4)}) == 4


def _ragen_reference_map(size: int, p: float, seed: int) -> list[str]:
    """RAGEN's FrozenLake generator as its source reads (gymnasium's seeding; string cells; DFS from the start)."""
    from gymnasium.utils import seeding

    rng, _ = seeding.np_random(seed)
    while True:
        board = rng.choice(["F", "H"], (size, size), p=[p, 1 - p])
        (sr, sc), (gr, gc) = rng.integers(size, size=2), rng.integers(size, size=2)
        if (sr, sc) == (gr, gc):
            continue
        board[sr][sc], board[gr][gc] = "S", "G"
        stack, seen = [(sr, sc)], set()
        while stack:
            r, c = stack.pop()
            if (r, c) in seen:
                continue
            seen.add((r, c))
            for nr, nc in ((r + 1, c), (r, c + 1), (r - 1, c), (r, c - 1)):
                if 0 <= nr < size and 0 <= nc < size and board[nr][nc] == "G":
                    return ["".join(row) for row in board]
                if 0 <= nr < size and 0 <= nc < size and board[nr][nc] != "H":
                    stack.append((nr, nc))


def test_frozen_lake_ragen_maps_are_ragens_maps_seed_for_seed():
    from workers.envs.frozen_lake import ragen_map

    assert all(ragen_map(4, 0.9, s) == _ragen_reference_map(4, 0.9, s) for s in range(200))
    assert ragen_map(5, 0.8, 3) == _ragen_reference_map(5, 0.8, 3)
