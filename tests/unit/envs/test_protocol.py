"""The `ragen` turn protocol: hand-rendered turns for one Sokoban and one FrozenLake level, RAGEN's strict parse
on a table of odd answers, and the format penalty reaching the return but never the text."""

from __future__ import annotations

import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from workers.envs import TextEpisode
from workers.envs.frozen_lake import TextFrozenLake
from workers.envs.protocol import RagenProtocol, reward_text
from workers.envs.sokoban import SokobanEnv
from workers.envs.text import MAX_TEXT_CHARS, parse_strict

REMINDER = ("You have {left} actions left. Always output: <think> [Your thoughts] </think> <answer> [your answer] "
            "</answer> with no extra text. Strictly follow this format. Max response length: 100 words (tokens).\n")
# Written by hand from RAGEN @20daedc: config/envs.yaml's CoordSokoban / CoordFrozenLake `env_instruction` (YAML
# literal blocks: every line ends in "\n", three Sokoban lines with a space before it), then
# ragen/llm_agent/ctx_manager.py `_init_prefix_lookup`: "\nThe meaning of each symbol in the state is:\n" + the
# env config's grid_vocab joined by ", " (ragen/env/*/config.py), "\nYour available actions are:\n" + its
# action_lookup, "\nYou can make up to 10 actions, separated by the action separator \" || \"\n"; and
# `_build_system_content`: "You're a helpful assistant. " before it all.
SOKOBAN_SYSTEM = (
    "You're a helpful assistant. "
    "You are solving the Sokoban puzzle. You are the player and you need to push all boxes to targets.\n"
    "You are provided with a symbol grid and the zero-indexed coordinates of the player, each box, and each target. \n"
    "Coordinates range from the top-left corner (0, 0) to the bottom-right corner (5, 5). \n"
    "When you are exactly next to a box, you can push it by moving in the same direction. \n"
    "You cannot push a box through a wall, and you cannot pull a box.\n"
    "The answer should be a sequence of actions, like <answer>Right || Right || Up</answer>.\n"
    "\nThe meaning of each symbol in the state is:\n"
    "#: wall, _: empty, O: target, \u221a: box on target, X: box, P: player, S: player on target"
    "\nYour available actions are:\n"
    "Up, Down, Left, Right"
    "\nYou can make up to 10 actions, separated by the action separator \" || \"\n")
# RAGEN says "(5, 5)" here for a 4x4 board; ours names the board's real corner (docs/agentic.md)
FROZEN_SYSTEM = (
    "You're a helpful assistant. "
    "You are solving the FrozenLake puzzle. The observation includes both a symbol grid and zero-indexed coordinates "
    "for the start, goal, player, and any holes.\n"
    "Coordinates range from the top-left corner (0, 0) to the bottom-right corner (3, 3).\n"
    "Beware that the ice is slippery, so the agent might slide and end up in an unintended tile.\n"
    "Respond with a sequence of actions such as <answer>Left || Up || Up</answer>.\n"
    "\nThe meaning of each symbol in the state is:\n"
    "P: player, _: empty, O: hole, G: goal, X: player in hole, \u221a: player on goal"
    "\nYour available actions are:\n"
    "Left, Down, Right, Up"
    "\nYou can make up to 10 actions, separated by the action separator \" || \"\n")
NO_ACTION = "No valid action provided previously. Environment state remains the same. Please try again.\n"


def _episode(env) -> TextEpisode:
    return TextEpisode(env, dynamics_seed=0, max_actions_per_turn=2, max_actions_per_episode=10, max_turns=5,
                       protocol=RagenProtocol(max_tokens=100))


def _sokoban():
    return _episode(SokobanEnv(layout=["######", "#P_X_#", "#___O#", "#____#", "#____#", "######"]))


def test_sokoban_turns_as_rendered_by_hand():
    ep = _sokoban()
    assert ep.prefill == "<think>" and ep.system() == SOKOBAN_SYSTEM
    state1 = ("Board size: 6 rows x 6 cols (zero-indexed).\nTargets: (2, 4)\nBoxes: (1, 3)\nPlayer: (1, 1)\n"
              "Grid Map: \n######\n#P_X_#\n#___O#\n#____#\n#____#\n######\n")
    assert ep.prompt() == f"\nTurn 1:\nState:\nCoordinates: \n{state1}" + REMINDER.format(left=10)
    out = ep.play("<think>go right</think><answer>Right || Right</answer>")  # walk, push the box to (1, 4)
    state2 = ("Board size: 6 rows x 6 cols (zero-indexed).\nTargets: (2, 4)\nBoxes: (1, 4)\nPlayer: (1, 3)\n"
              "Grid Map: \n######\n#__PX#\n#___O#\n#____#\n#____#\n######\n")
    assert out.observation == f"Reward:\n-0.2\n\nTurn 2:\nState:\nCoordinates: \n{state2}" + REMINDER.format(left=8)
    out = ep.play("<think>hmm</think><answer>Jump</answer>")  # nothing valid: the state stays, a warning
    assert out.observation == (f"Reward:\n0\n\nTurn 3:\nState:\nCoordinates: \n{state2}{NO_ACTION}"
                               + REMINDER.format(left=8))
    assert ep.stats.turn_rewards == pytest.approx([-0.2, -0.1]) and ep.stats.episode_return == pytest.approx(-0.3)


def test_sokoban_turn_two_after_an_invalid_answer_carries_the_warning():
    ep = _sokoban()
    state1 = ("Board size: 6 rows x 6 cols (zero-indexed).\nTargets: (2, 4)\nBoxes: (1, 3)\nPlayer: (1, 1)\n"
              "Grid Map: \n######\n#P_X_#\n#___O#\n#____#\n#____#\n######\n")
    out = ep.play("<think>x</think> <answer>Right, Right</answer>")  # no valid action
    assert out.invalid and out.actions == 0
    assert out.observation == (
        "Reward:\n0\n\nTurn 2:\nState:\nCoordinates: \n" + state1
        + "No valid action provided previously. Environment state remains the same. Please try again.\n"
        + "You have 10 actions left. Always output: <think> [Your thoughts] </think> <answer> [your answer] </answer>"
          " with no extra text. Strictly follow this format. Max response length: 100 words (tokens).\n")
    assert out.training_observation == out.observation.replace(NO_ACTION, "")  # RAGEN's rebuilt training turn
    out = ep.play("<think>x</think><answer>Down</answer>")  # a valid answer: the same turn in both
    assert out.training_observation == out.observation and NO_ACTION not in out.observation


def test_sokoban_box_and_player_on_targets_are_listed():
    ep = _episode(SokobanEnv(layout=["######", "#____#", "#_P√_#", "#_O__#", "#_X__#", "######"]))
    assert "Targets: (2, 3), (3, 2)\nBoxes: (4, 2)\nBoxes on target: (2, 3)\nPlayer: (2, 2)\n" in ep.prompt()
    ep.play("<think></think><answer>Down</answer>")  # the player steps onto the target at (3, 2)
    assert "Player on target: (3, 2)\n" in ep.env.coordinates() + "\n" and "#_S__#" in ep.env.grid_text(False)


def test_frozen_lake_turns_as_rendered_by_hand():
    ep = _episode(TextFrozenLake(desc=["FFFF", "FHFS", "FFFH", "HGFF"], success_rate=0.8))
    assert ep.system() == FROZEN_SYSTEM
    head = ("\nTurn 1:\nState:\nCoordinates: \nBoard size: 4 rows x 4 cols (zero-indexed).\nStart: (1, 3)\n"
            "Goal: (3, 1)\nPlayer: (1, 3)\nHoles: (1, 1), (2, 3), (3, 0)\nGrid Map: \n____\n_O_P\n___O\nOG__\n")
    assert ep.prompt() == head + REMINDER.format(left=10)
    out = ep.play("<think> </think>  <answer> Up || Up || Up </answer>")  # the third action is cut
    assert out.actions == 2 and not out.invalid
    row, col = divmod(int(ep.env.s), 4)
    assert out.observation.startswith("Reward:\n0\n\nTurn 2:\nState:\nCoordinates: \n")
    assert f"Player: ({row}, {col})\n" in out.observation and "You have 8 actions left." in out.observation
    out = ep.play("<answer>Up</answer>")  # no think block: a format failure, no move
    assert out.invalid and out.actions == 0 and NO_ACTION in out.observation
    assert "Reward:\n0\n" in out.observation and "-0.1" not in out.observation


def test_frozen_lake_deterministic_turns_as_rendered_by_hand():
    """success_rate 1: no slip sentence, and turn 2's state is fixed: turn 2 after a valid and an invalid answer."""
    desc = ["FFFF", "FHFS", "FFFH", "HGFF"]
    ep = _episode(TextFrozenLake(desc=desc, success_rate=1.0))
    assert ep.system() == FROZEN_SYSTEM.replace(
        "Beware that the ice is slippery, so the agent might slide and end up in an unintended tile.\n", "")
    coords = "Board size: 4 rows x 4 cols (zero-indexed).\nStart: (1, 3)\nGoal: (3, 1)\n"
    holes = "Holes: (1, 1), (2, 3), (3, 0)\n"
    assert ep.prompt() == ("\nTurn 1:\nState:\nCoordinates: \n" + coords + "Player: (1, 3)\n" + holes
                           + "Grid Map: \n____\n_O_P\n___O\nOG__\n" + REMINDER.format(left=10))
    out = ep.play("<think>left then down</think><answer>Left || Down</answer>")
    assert out.observation == ("Reward:\n0\n\nTurn 2:\nState:\nCoordinates: \n" + coords + "Player: (2, 2)\n"
                               + holes + "Grid Map: \n____\n_O__\n__PO\nOG__\n" + REMINDER.format(left=8))
    ep = _episode(TextFrozenLake(desc=desc, success_rate=1.0))
    out = ep.play("<think>up</think><answer>Fly</answer>")
    assert out.observation == ("Reward:\n0\n\nTurn 2:\nState:\nCoordinates: \n" + coords + "Player: (1, 3)\n"
                               + holes + "Grid Map: \n____\n_O_P\n___O\nOG__\n" + NO_ACTION
                               + REMINDER.format(left=10))


def test_frozen_lake_player_on_goal_and_in_hole():
    env = TextFrozenLake(desc=["SFFF", "FHFF", "FFFF", "FFFG"])
    ep = _episode(env)
    ep.play("<think></think><answer>Right || Down</answer>")
    assert ep.done and "Player in hole: (1, 1)" in env.coordinates() and env.grid_text(False).split()[1] == "_X__"


@pytest.mark.parametrize("text, actions, invalid", [
    ("<think>a</think><answer>Up || Left</answer>", (0, 2), False),
    ("<think>a</think>\n \t<answer>Down</answer>", (1,), False),               # whitespace between the blocks
    ("<answer>Up</answer>", (), True),                                        # no think
    ("<THINK>a</THINK><ANSWER>Up</ANSWER>", (), True),                        # uppercase tags
    ("<think>a</think><Answer>Up</Answer>", (), True),
    ("< think >a</ think ><answer>Up</answer>", (), True),                    # spaces inside the tags
    ("<think>a</think><answer >Up</answer>", (), True),
    ("<think>a</think> so: <answer>Up</answer>", (), True),                   # text between the blocks
    ("<think>a</think><answer>Up</answer><answer>Down</answer>", (0,), False),  # the first answer block
    ("<think>a</think><answer>Up || || Left</answer>", (0, 2), False),        # empty items dropped
    ("<think>a</think><answer> || </answer>", (), True),                      # nothing left
    ("<think>a</think><answer>Up || Down || Left</answer>", (0, 1), False),   # over the cap: cut, not invalid
    ("<think>a</think><answer>up || RIGHT</answer>", (0, 3), False),          # action words: any case
    ("<think>a</think><answer>Up || Jump</answer>", (0,), True),              # unknown word dropped, invalid
    ("<think>a</think><answer>Jump || Up || Left</answer>", (0,), True),      # the cap cuts before the check
    ("<think>ü→</think><answer>Ｕｐ || Left</answer>", (2,), True),            # unicode: fullwidth is not Up
    ("<think>a</think><answer>Up<|im_end|></answer>", (0,), False),           # special tokens removed
    ("<think>a</think><answer>Up</answer", (), True),                         # unclosed
    ("<think><think>a</think><answer>Left</answer>", (2,), False),
    ("", (), True),
])
def test_strict_parse_table(text, actions, invalid):
    parsed = parse_strict(text, max_actions=2)
    assert (parsed.actions, parsed.invalid) == (actions, invalid)


def test_strict_parse_of_20k_characters_is_bounded():
    for text in ("<think>" * 3000, "<think>" + "</think>" * 2600 + "<answer>Up</answer>",
                 "<think>" + "x" * 30_000 + "</think><answer>Up</answer>"):
        t0 = time.perf_counter()
        assert parse_strict(text).invalid  # the answer lies beyond MAX_TEXT_CHARS or never comes
        assert time.perf_counter() - t0 < 5.0
    ok = "<think>" + "y" * (MAX_TEXT_CHARS - 40) + "</think><answer>Down</answer>"
    assert parse_strict(ok).actions == (1,)


@given(st.text(max_size=300))
@settings(max_examples=200)
def test_strict_parse_never_raises(text):
    assert len(parse_strict("<think>" + text, max_actions=2).actions) <= 2


def test_format_penalty_reaches_the_return_not_the_text():
    ep = _sokoban()
    texts = []
    for answer in ("no tags at all", "<think></think><answer>Right || Fly</answer>",
                   "<think></think><answer>Down</answer>"):
        out = ep.play(answer)
        texts.append(out.observation or "")
    assert ep.stats.invalid_turns == 2 and ep.stats.penalties == [-0.1, -0.1, 0.0]
    assert [reward_text(r) for r in ep.stats.env_rewards] == ["0", "-0.1", "-0.1"]
    assert texts[0].startswith("Reward:\n0\n") and texts[1].startswith("Reward:\n-0.1\n")
    assert ep.stats.episode_return == pytest.approx(-0.2 - 0.2)
    # the penalties join the return at the end: on the last turn, not their own
    assert ep.stats.turn_rewards == pytest.approx([0.0, -0.1, -0.1 - 0.2])
