"""Typed configuration of the task (problem source + reward function).

Embedded in the trial config like `CreditConfig`: field names equal YAML keys, unknown keys are errors.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator


class TaskConfig(BaseModel):
    """Which task a trial trains on; `arithmetic` fields and `math` fields are ignored by the other task.

    `arithmetic_mc` is the multiple-choice form of `arithmetic` (same problem set and fields, plus `num_choices`):
    the prompt lists labelled options and the first completion token is the chosen label (its action position).
    """

    model_config = ConfigDict(extra="forbid")

    name: Literal["arithmetic", "arithmetic_mc", "math"] = "arithmetic"
    # arithmetic, arithmetic_mc
    max_operand: int = Field(4, ge=1, description="operands are drawn from 0..max_operand")
    ops: list[Literal["+", "-", "*"]] = Field(default_factory=lambda: ["+"], min_length=1)
    heldout_fraction: float = Field(0.2, ge=0.0, lt=1.0, description="share of problems never trained on")
    # arithmetic_mc
    num_choices: int = Field(4, ge=2, le=4, description="options per question, labelled A, B, C, D in order")
    # math
    dataset: str | None = Field(None, description="local .jsonl path, or a Hugging Face dataset name")
    split: str = "train"
    eval_split: str | None = Field(None, description="HF split for held-out eval; None: hold out a fraction")
    problem_field: str = "problem"
    answer_field: str = "answer"
    prompt_template: str = "{problem}\nPut the final answer in \\boxed{{}}."
    answer_fallback: Literal["last_number", "none"] = "last_number"
    grader_timeout_s: float = Field(5.0, gt=0.0)

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
        return self
