"""Agentic environments with a text face (FrozenLake, Sokoban), the episode they are played through, and the
level source of an agentic task. Model text is parsed by a fixed grammar (`text.parse_strict` under the ragen turn
protocol, `text.parse_answer` under plain), never executed."""

from __future__ import annotations

from .episode import EVAL_SEED_LIMIT, FORMAT_PENALTY, EnvTask, TextEpisode, TurnOutcome, make_env
from .protocol import PlainProtocol, RagenProtocol, make_protocol
from .text import ACTION_NAMES, ParsedTurn, format_answer, parse_answer, parse_strict

AGENTIC_TASKS = ("frozen_lake", "sokoban")

__all__ = ["ACTION_NAMES", "AGENTIC_TASKS", "EVAL_SEED_LIMIT", "FORMAT_PENALTY", "EnvTask", "ParsedTurn",
           "PlainProtocol", "RagenProtocol", "TextEpisode", "TurnOutcome", "format_answer", "make_env",
           "make_protocol", "parse_answer", "parse_strict"]
