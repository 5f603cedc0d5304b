"""Agentic environments with a text face (FrozenLake, Sokoban), the episode they are played through, and the
level source of an agentic task. Model text is parsed by a fixed grammar (`text.parse_answer`), never executed."""

from __future__ import annotations

from .episode import EVAL_SEED_LIMIT, FORMAT_PENALTY, EnvTask, TextEpisode, TurnOutcome, make_env
from .text import ACTION_NAMES, ParsedTurn, format_answer, parse_answer

AGENTIC_TASKS = ("frozen_lake", "sokoban")

__all__ = ["ACTION_NAMES", "AGENTIC_TASKS", "EVAL_SEED_LIMIT", "FORMAT_PENALTY", "EnvTask", "ParsedTurn",
           "TextEpisode", "TurnOutcome", "format_answer", "make_env", "parse_answer"]
