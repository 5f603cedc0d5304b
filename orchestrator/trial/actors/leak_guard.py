"""The leak guard of a shared pool's slot: a step fails when the rollouts' per-token log-probs are further from
the learner's than any rollout of the trial's own adapter can be, i.e. the engines sampled them under another
adapter (another slot's, or the bare base).

`train/logprob_gap_mean` (workers/learner/metrics.py) is the mean |vLLM log-prob - learner log-prob| over the
batch's sampled tokens, the learner's taken before its update. Measured on the tiny models (CPU):
- the same adapter (sync): ~5e-6;
- one_step_off, the batch sampled by the policy one update behind the learner's: 0.004-0.055 (test_async's
  Sokoban PPO + GAE, 5 steps; benchmarks/step.py 0.029), the largest single token 1.57;
- async (issue 57), batches up to k policies behind: k = 2 paced on a shared pool 0.021 where one_step_off on the
  same campaign was 0.018 (tests/integration/campaign/test_shared_learner_restarts.py); FrozenLake PPO + GAE at
  k = 2 under discard (test_agentic.py, a trial's own actors) 0.021 at staleness 1 and 2. Not measured past k = 2:
  were the drift to grow linearly in k at one_step_off's worst mean per update (0.055), k ~ 18 would reach the bound;
- a slot sampled under another slot's adapter: 10.9 (docs/measurements.md, Shared base); under its own adapter with
  the LoRA B matrices drawn at random: 6.74 (its own: 3.5e-7; tests/integration/campaign/test_shared_leak_guard.py).
`LEAK_GAP` sits ~18x above the largest drift and ~7-11x below another adapter."""

from __future__ import annotations

from workers.fence import SlotLease

GAP_METRIC = "train/logprob_gap_mean"
LEAK_GAP = 1.0  # nats per token, mean over the batch


class AdapterLeak(RuntimeError):
    """A slot's rollouts were sampled under another adapter than its trial's."""


def check_rollout_policy(metrics: dict[str, float], lease: SlotLease, bound: float = LEAK_GAP) -> None:
    """Raise `AdapterLeak` (one line: the slot, the trial, the gap and the bound) when the step's gap exceeds
    `bound`; a step with no gap measured (no learner batch) passes."""
    gap = metrics.get(GAP_METRIC)
    if gap is not None and gap > bound:
        raise AdapterLeak(f"slot {lease.slot} of trial {lease.trial} (epoch {lease.epoch}): its rollouts' log-probs "
                          f"are {gap:.4g} nats per token from the learner's, over the bound {bound:g}: they were "
                          "sampled under another adapter than the trial's")
