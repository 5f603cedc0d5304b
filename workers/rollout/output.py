"""What a rollout worker's `generate` returns (workers/rollout/worker.py): typed, so the trial's sources and
episodes (orchestrator/trial/collect/) read fields, never string keys. Plain dataclasses of lists: they cross Ray
by pickle, and a test builds them by hand."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Completion:
    """One sampled completion. `logprobs[i]` is the processed (temperature/top-p) log-prob of `token_ids[i]`;
    `token_ids` include the EOS / stop token when generation stopped on one (`finish_reason` "stop"; "length": the
    token budget cut it). `text`: vLLM's detokenised text (for reading; the trial scores its own decode).
    `action_logprobs`: under the probability floor, the floored log-prob of every action token at the action
    position (None without the floor)."""

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str
    text: str = ""
    action_logprobs: dict[int, float] | None = None

    @property
    def truncated(self) -> bool:
        """The token budget cut it (vLLM's finish reason "length")."""
        return self.finish_reason == "length"


@dataclass(frozen=True)
class Generation:
    """One `generate` call's answer: `completions[p]` holds prompt p's n completions; `adapter_version` is the
    policy version it sampled with (adapter or full weights; None = the model the engine was built with)."""

    adapter_version: int | None
    completions: list[list[Completion]]
    num_tokens: int
    elapsed_s: float = 0.0
