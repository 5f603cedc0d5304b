"""What crosses the learner's boundary: what the trial gives a learner when it is built (`RunSettings`), the batch
the trial driver sends each step (`LearnerBatch`) and what one training step returns (`StepResult`).

Plain Python data only (lists, floats, ints, bools, None) in the batch, so `ray.put` pickles it cheaply and
without torch; `workers.learner.batch.collate` turns it into padded tensors. No torch import here: the trial
driver builds batches without it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from workers.objectives.settings import OffPolicySettings


@dataclass(frozen=True)
class LearnerBatch:
    """One training batch of B = N * G sequences, grouped by prompt / level (G sequences per group).

    prompt_ids        [B][*] ids of each prompt
    response_ids      [B][*] everything after the prompt: for multi-turn episodes the sampled ids of every turn
                      with the observation ids between them
    rollout_logprobs  [B][*] vLLM's log-probs, aligned with response_ids; read only where loss_mask is True
    rewards           [N][G] episode returns
    temperature       the sampling temperature (the learner scores at it)
    loss_mask         [B][*] True on the trained ids: the sampled ids, and under learner.loss_mask
                      'assistant_segments' each turn's forced tokens too; None = all True (the single-turn case)
    sepa_lambda       SEPA's lambda this step
    step              the training step (seeds the mini-batch shuffle, drives the entropy-floor schedule)
    loss_scale        multiplies the loss (the reward-variance filter's scaling)
    action_token_ids  the one-token action set under the probability floor; None = no floor
    tis_cap           truncated importance weight min(pi_old / pi_rollout, tis_cap) per token; None = off
                      (needs old_logprobs 'recompute')
    offpolicy         the off-policy correction, rejection and mismatch metrics (workers/objectives/offpolicy.py);
                      None = token-level tis at `tis_cap` (or nothing without it). Needs old_logprobs 'recompute'
    want_uncertainty  return per-token uncertainty samples before / after the token stages
    reward_positions  [B][*] the critic's turn ends: the response index of each turn's last sampled id; None =
                      one turn ending at the last sampled id
    turn_rewards      [B][*] each turn's reward, aligned with reward_positions; None = the sequence's reward
    sampled_mask      [B][*] True on the ids vLLM sampled (where rollout_logprobs are vLLM's); None = loss_mask
    """

    prompt_ids: list[list[int]]
    response_ids: list[list[int]]
    rollout_logprobs: list[list[float]]
    rewards: list[list[float]]
    temperature: float
    loss_mask: list[list[bool]] | None = None
    sepa_lambda: float = 0.0
    step: int = 0
    loss_scale: float = 1.0
    action_token_ids: list[int] | None = None
    tis_cap: float | None = None
    want_uncertainty: bool = False
    reward_positions: list[list[int]] | None = None
    turn_rewards: list[list[float]] | None = None
    sampled_mask: list[list[bool]] | None = None
    offpolicy: OffPolicySettings | None = None

    def offpolicy_settings(self) -> OffPolicySettings:
        """The batch's off-policy settings: `offpolicy`, or token-level tis at `tis_cap` when it is None."""
        if self.offpolicy is not None:
            return self.offpolicy
        return OffPolicySettings("tis", cap=self.tis_cap) if self.tis_cap is not None else OffPolicySettings()


@dataclass(frozen=True)
class StepResult:
    """One training step's outcome.

    metrics      metric name -> value (losses, optimizer, credit, critic, ... : workers/learner/metrics.py)
    exec_values  the raw uncertainties of the execution tokens (a 1-D tensor), for SEPA's auto schedule
    uncertainty  per-token uncertainty samples (`<cls>_before` / `<cls>_after` lists), or None when the batch
                 did not ask for them
    episode_advantages      [B] each sequence's episode-level advantage (0 under GAE, which has none)
    token_advantage_means   [B] each sequence's token advantages averaged over its loss-masked tokens
    (the trial's samples files show both beside the text: orchestrator/trial/artifacts/samples.py)
    """

    metrics: dict[str, float]
    exec_values: Any
    uncertainty: dict[str, list[float]] | None = None
    episode_advantages: list[float] | None = None
    token_advantage_means: list[float] | None = None


@dataclass(frozen=True)
class RunSettings:
    """What a learner takes from its trial besides the `learner:` / `credit:` / `interventions:` settings:
    the `seed` (initial weights, RNGs, mini-batch shuffle; the same on every rank), the trial's `total_steps`
    (LR schedule, entropy-floor schedule), the compute `dtype` ("auto": bfloat16 on a GPU, float32 on CPU) and the
    process group's collective timeout."""

    seed: int
    total_steps: int
    dtype: str = "auto"
    collective_timeout_s: float = 600.0  # one torch.distributed collective, before the rank fails (ranks.join_group)
