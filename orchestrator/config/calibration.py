"""A calibration file (`plan --calibration FILE`, written by benchmarks/calibrate.py): the constants the cost model
assumes, measured on a machine with the project's own actors, which then replace them in `plan`:
- `decode`: the engine's decode throughput (tokens a second) against the sequences in flight, measured points;
  between them linear, below the first proportional to the sequences (decode is bound by reading the weights:
  fewer sequences, the same time a token step), beyond the last flat. Replaces EFFICIENCY['generate'] and
  GENERATE_BATCHED (orchestrator/preflight/cost_model.py, shared_plan.py);
- `learner_tokens_per_s`: tokens (prompt + response) one learner process trains a second in a step, for every
  token the learner scores or trains (scoring at the training rate: an upper bound). Replaces the learner's rates;
- `adapter_export_s`, `adapter_load_s`: a step's LoRA adapter out of the learner and into an engine (a pool's
  engine loads every slot's each cycle);
- `startup_s`: a trial's actors built and ready (engines, learner). Replaces the modelled start-up;
- `step_overhead_s`: a trial step's wall beyond what the rates above predict for it (the driver's grading and
  collating, the learner's scoring pass, the Ray calls), measured on the calibration's own trial steps. Added to
  every step (in a pool: to the trial's own part of the cycle, which nothing overlaps);
- `task`, `prompt_tokens`, `completion_tokens` (`calibrate.py --campaign`): the mean prompt and completion lengths
  of the measured trial steps, on that task with that model. A trial of the same model and task is planned with
  them instead of the upper bounds (256-token prompts, every completion at max_tokens).
The device and model it was measured on are recorded, not checked: a calibration predicts for that pair."""

from __future__ import annotations

from pydantic import Field, ValidationError, field_validator

from orchestrator.config.errors import UserError
from orchestrator.config.sections import StrictConfig


class DecodePoint(StrictConfig):
    sequences: float = Field(gt=0.0, description="sequences decoding at once in one engine")
    tokens_per_s: float = Field(gt=0.0, description="tokens the engine generates a second at that load")


class Calibration(StrictConfig):
    device: str = Field(description="where it was measured (e.g. 'cpu, 2 cores', 'H100')")
    model: str = Field(description="the model it was measured with")
    decode: list[DecodePoint] = Field(min_length=1, description="decode throughput against sequences in flight")
    learner_tokens_per_s: float = Field(gt=0.0, description="tokens one learner trains a second")
    adapter_export_s: float = Field(ge=0.0, description="seconds to export a step's adapter from the learner")
    adapter_load_s: float = Field(ge=0.0, description="seconds to load a step's adapter into an engine")
    startup_s: float = Field(ge=0.0, description="seconds for a trial's engines and learner to be built and ready")
    step_overhead_s: float = Field(default=0.0, ge=0.0, description="a trial step's seconds beyond the rates' "
                                   "prediction (grading, collate, scoring, Ray calls)")
    task: str | None = Field(default=None, description="the task the lengths were measured on")
    prompt_tokens: float | None = Field(default=None, gt=0.0, description="mean prompt tokens of a sequence")
    completion_tokens: float | None = Field(default=None, gt=0.0, description="mean completion tokens")

    @field_validator("decode")
    @classmethod
    def _sorted(cls, v: list[DecodePoint]) -> list[DecodePoint]:
        return sorted(v, key=lambda p: p.sequences)

    def decode_rate(self, sequences: float) -> float:
        """Tokens a second one engine generates with `sequences` in flight (module docstring)."""
        pts = self.decode
        if sequences <= pts[0].sequences:
            return pts[0].tokens_per_s * sequences / pts[0].sequences
        for a, b in zip(pts, pts[1:], strict=False):
            if sequences <= b.sequences:
                f = (sequences - a.sequences) / (b.sequences - a.sequences)
                return a.tokens_per_s + f * (b.tokens_per_s - a.tokens_per_s)
        return pts[-1].tokens_per_s


    def lengths(self, model: str, task: str) -> dict[str, float]:
        """`step_tokens`' keyword arguments for a trial of `model` on `task`: the measured mean lengths when the
        calibration measured that pair, else none (the plan's upper bounds)."""
        if self.task != task or self.model != model or self.prompt_tokens is None or self.completion_tokens is None:
            return {}
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens}


def load_calibration(path: str) -> Calibration:
    """The calibration file at `path` (YAML or JSON); UserError (one line) when it is missing or invalid."""
    from orchestrator.config.files import load_yaml

    data = load_yaml(path)  # a missing or unreadable file: its own one-line UserError
    try:
        return Calibration.model_validate(data)
    except ValidationError as e:
        err = e.errors()[0]
        raise UserError(f"--calibration: {path}: {'.'.join(str(x) for x in err['loc']) or '<root>'}: "
                        f"{err['msg']} (benchmarks/calibrate.py writes this file)") from None
