"""The turn protocols: what text the model reads each turn, what it must answer, and how the answer is parsed.

`ragen` (RAGEN's default for seed 004: `enable_think`, the Coord* environments):
- a system message: "You're a helpful assistant. ", the environment's instruction (rules, coordinate
  convention, an example answer), the symbol legend, the action list and the episode's action budget (RAGEN's
  legend comes from its top-level `observation_format`, which defaults to "grid", while `grid_coord` sits in the
  nested env_config: its model read both);
- user turn k: "Turn k:", the state as zero-indexed coordinates and the grid (no spaces), a warning when the
  previous turn had no valid action, the actions left, the format reminder and "Max response length: N words
  (tokens)." (N = rollout.max_tokens); from turn 2 on it starts with "Reward:" and the previous turn's env reward;
- the assistant turn prefilled with `<think>` (prompt side, never trained);
- the strict parse (`text.parse_strict`); the format penalty is never shown: it joins the return at the end.
`plain` (this project's earlier protocol): no system message, the rules and the spaced grid in the first user
turn, the lenient parse (`text.parse_answer`), the format penalty inside each turn's "Reward:" line.
"""

from __future__ import annotations

from workers.envs.text import ACTION_NAMES, ParsedTurn, format_answer, parse_answer, parse_strict

FORMAT_REMINDER = "<think> [Your thoughts] </think> <answer> [your answer] </answer>"
NO_VALID_ACTION = "No valid action provided previously. Environment state remains the same. Please try again.\n"


def reward_text(reward: float) -> str:
    """An env reward as the model reads it: shortest decimal form (-0.2, 0, 10.8)."""
    return format(round(float(reward), 6) + 0.0, "g")


def _state(env) -> str:
    """The state block of a ragen turn: a plugin env's own text, else coordinates and the unspaced grid."""
    if hasattr(env, "state_text"):
        return env.state_text()
    return f"Coordinates: \n{env.coordinates()}\nGrid Map: \n{env.grid_text(spaced=False)}"


class RagenProtocol:
    name = "ragen"
    prefill = "<think>"
    penalty_at_end = True

    def __init__(self, max_tokens: int):
        self.max_tokens = max_tokens

    def system(self, env, max_actions: int) -> str:
        actions = ", ".join(env.instruction_actions)
        legend = f"The meaning of each symbol in the state is:\n{env.legend}\n" if env.legend else ""
        return (f"You're a helpful assistant. {env.instruction}\n{legend}Your available actions are:\n{actions}\n"
                f"You can make up to {max_actions} actions, separated by the action separator \" || \"\n")

    def turn(self, env, k: int, actions_left: int, previous_reward: float | None, no_valid_action: bool,
             some_invalid: bool = False) -> str:
        head = "" if previous_reward is None else f"Reward:\n{reward_text(previous_reward)}\n"
        warning = NO_VALID_ACTION if no_valid_action else ""
        return (f"{head}\nTurn {k}:\nState:\n{_state(env)}\n{warning}You have {actions_left} actions left. Always output: "
                f"{FORMAT_REMINDER} with no extra text. Strictly follow this format. "
                f"Max response length: {self.max_tokens} words (tokens).\n")

    def parse(self, text: str, max_actions: int, names=ACTION_NAMES) -> ParsedTurn:
        return parse_strict(text, names, max_actions)


class PlainProtocol:
    name = "plain"
    prefill = ""
    penalty_at_end = False

    def __init__(self, max_actions_per_turn: int = 2):
        self.max_per_turn = max_actions_per_turn

    def system(self, env, max_actions: int) -> None:
        return None

    def turn(self, env, k: int, actions_left: int, previous_reward: float | None, no_valid_action: bool,
             some_invalid: bool = False) -> str:
        grid = env.state_text() if hasattr(env, "state_text") else env.grid_text()
        state = f"State:\n{grid}\nActions left: {actions_left}."
        if previous_reward is None:
            example = format_answer(getattr(env, "action_names", ACTION_NAMES)[:2][: self.max_per_turn])
            return f"{env.rules} Answer with {example}, at most {self.max_per_turn} actions per turn.\n{state}"
        note = ("No valid action was given. " if no_valid_action else
                "An invalid action was dropped. " if some_invalid else "")
        return f"{note}Reward: {previous_reward:.1f}\n{state}"

    def parse(self, text: str, max_actions: int, names=ACTION_NAMES) -> ParsedTurn:
        return parse_answer(text, names, max_actions)


def make_protocol(name: str, *, max_tokens: int, max_actions_per_turn: int):
    if name == "ragen":
        return RagenProtocol(max_tokens)
    if name == "plain":
        return PlainProtocol(max_actions_per_turn)
    raise ValueError(f"protocol must be 'ragen' or 'plain', got {name!r}")
