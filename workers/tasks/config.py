"""Typed configuration of the task (problem source + reward function).

Embedded in the trial config like `CreditConfig`: field names equal YAML keys, unknown keys are errors.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator


class TaskConfig(BaseModel):
    """Which task a trial trains on; each task reads its own fields and ignores the others'.

    `arithmetic_mc` is the multiple-choice form of `arithmetic` (same problem set and fields, plus `num_choices`):
    the prompt lists labelled options and the first completion token is the chosen label (its action position).
    """

    model_config = ConfigDict(extra="forbid")

    name: Literal["arithmetic", "arithmetic_mc", "chain", "math", "frozen_lake", "sokoban"] = "arithmetic"
    # arithmetic, arithmetic_mc
    max_operand: int = Field(4, ge=1, description="operands are drawn from 0..max_operand")
    ops: list[Literal["+", "-", "*"]] = Field(default_factory=lambda: ["+"], min_length=1)
    heldout_fraction: float = Field(0.2, ge=0.0, lt=1.0, description="share of problems never trained on")
    # arithmetic_mc
    num_choices: int = Field(4, ge=2, le=4, description="options per question, labelled A, B, C, D in order")
    # chain (chained arithmetic with step-by-step solutions; the tiny-reasoner's task)
    chain_steps: int = Field(3, ge=1, le=8, description="operations per problem")
    chain_max_value: int = Field(19, ge=9, le=99, description="running values stay in 0..chain_max_value")
    chain_problems: int = Field(4000, ge=2, description="distinct problems drawn (held out by id hash)")
    # math
    dataset: str | None = Field(None, description="local .jsonl path, or a Hugging Face dataset name")
    split: str = "train"
    eval_split: str | None = Field(None, description="HF split for held-out eval; None: hold out a fraction")
    problem_field: str = "problem"
    answer_field: str = "answer"
    prompt_template: str = "{problem}\nPut the final answer in \\boxed{{}}."
    answer_fallback: Literal["last_number", "none"] = "last_number"
    grader_timeout_s: float = Field(5.0, gt=0.0)
    # frozen_lake, sokoban (agentic, multi-turn: see workers/envs)
    size: int | None = Field(None, ge=4, le=12, description="grid side; default 4 (frozen_lake), 6 (sokoban)")
    levels: Literal["ragen", "gymnasium"] = Field("ragen", description=(
        "level generator. sokoban: ragen only (gym-sokoban's reverse-play search, as RAGEN runs it); frozen_lake: "
        "ragen (random start and goal, always solvable) or gymnasium (generate_random_map's corner maps)"))
    protocol: Literal["ragen", "plain"] = Field("ragen", description=(
        "turn protocol (workers/envs/protocol.py). ragen: system message, coordinates, <think> prefill, strict "
        "parse, format penalty added to the return at the end; plain: no system message, lenient parse, the "
        "penalty shown in each turn's Reward line"))
    dynamics: Literal["shared", "independent"] = Field("shared", description=(
        "env randomness (FrozenLake slips) of a group. shared: every member plays the level's own random stream "
        "(RAGEN's: a fixed plan gives the same outcome across the group); independent: one stream per member"))
    training_context: Literal["sampled", "ragen"] = Field("sampled", description=(
        "the context each agentic turn is trained in. sampled: exactly the ids the turn was sampled from; ragen: "
        "RAGEN's rebuilt training sequence, which drops the 'No valid action provided previously' warning from "
        "the user turn after a turn with no valid action (it is still shown at generation); needs protocol ragen "
        "and learner.old_logprobs 'recompute' (vLLM's log-probs are of another context)"))
    frozen_prob: float = Field(0.9, gt=0.0, le=1.0, description="frozen_lake: probability a tile is ice")
    success_rate: float = Field(1.0, gt=0.0, le=1.0,
                                description="frozen_lake: chance a move goes where intended (1 = not slippery)")
    boxes: int = Field(1, ge=1, le=3, description="sokoban: boxes (and targets) per level")
    max_env_steps: int = Field(100, ge=1, description="sokoban: env steps before truncation")
    fixed_level: int | None = Field(None, ge=0, description=(
        "play this one level seed in training and validation (e.g. a fixed FrozenLake map); None: a new level "
        "per group"))

    @field_validator("ops")
    @classmethod
    def _unique_ops(cls, ops: list[str]) -> list[str]:
        if len(set(ops)) != len(ops):
            raise ValueError(f"ops must not repeat: {ops}")
        return ops

    @field_validator("prompt_template")
    @classmethod
    def _template_formats(cls, template: str) -> str:
        if "{problem}" not in template:
            raise ValueError("prompt_template must contain '{problem}'")
        try:
            template.format(problem="x")
        except (KeyError, IndexError, ValueError) as e:
            raise ValueError(f"prompt_template does not format with only 'problem': {e!r}") from e
        return template

    @model_validator(mode="after")
    def _math_needs_dataset(self) -> TaskConfig:
        if self.name == "math" and not self.dataset:
            raise ValueError("task 'math' requires 'dataset' (a local .jsonl path or a Hugging Face name)")
        if self.training_context == "ragen" and self.protocol != "ragen":
            raise ValueError("training_context 'ragen' is RAGEN's rebuilt training sequence: it needs protocol "
                             f"'ragen', got {self.protocol!r}")
        if self.name == "sokoban" and self.levels != "ragen":
            raise ValueError(f"levels {self.levels!r} is for frozen_lake; sokoban has levels 'ragen' only")
        return self

    @property
    def agentic(self) -> bool:
        """Multi-turn tasks played against an environment (workers/envs), not prompt -> one completion."""
        return self.name in ("frozen_lake", "sokoban")
