"""The report's isolation check for trials sampled on a shared pool (issue 56): each pool trial probed its slot
once, after step 0 (workers/rollout/isolation.py, written to trials/<trial>/isolation.json): teacher-forced
log-probs of its own step-0 samples scored alone and in one batch with the other slots' adapters. Bit for bit is
required of CPU engines and of vLLM's batch-invariant kernels (`resources.shared_base.batch_invariant`); GPU
engines without them are accepted within ISOLATION_TOLERANCE. The line says which of the two held, per trial."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from orchestrator.report.load import Group

# The largest |log-prob alone - log-prob mixed| (nats, one token) accepted on GPU engines without batch-invariant
# kernels: a bf16 logit of magnitude ~10 rounds by ~0.04, and a different reduction order moves it by about that.
# A stated value, not measured (no GPU was lent to this project): the report names it wherever it was used.
ISOLATION_TOLERANCE = 0.05


class IsolationCheck(NamedTuple):
    probed: int  # pool trials with a probe
    identical: int  # of them, every log-prob the same bits alone and mixed
    within: int  # not identical, within ISOLATION_TOLERANCE (engines not batch-invariant)
    largest: float  # the largest difference among those within
    bad: list[str]  # the others: "trial: max |delta| x (why)"


def isolation_check(groups: Sequence[Group]) -> IsolationCheck:
    probed = identical = within = 0
    largest, bad = 0.0, []
    for g in groups:
        for r in g.runs:
            rec = r.isolation
            if not rec:
                continue
            probed += 1
            diff = float(rec.get("max_abs_diff", float("nan")))
            if rec.get("identical"):
                identical += 1
            elif rec.get("batch_invariant") or not rec.get("gpu"):
                why = "batch-invariant kernels" if rec.get("batch_invariant") else "CPU engines"
                bad.append(f"{r.name}: max |delta| {diff:.3g} where {why} must give the same bits")
            elif diff <= ISOLATION_TOLERANCE:
                within, largest = within + 1, max(largest, diff)
            else:
                bad.append(f"{r.name}: max |delta| {diff:.3g}, beyond the stated tolerance {ISOLATION_TOLERANCE:g}")
    return IsolationCheck(probed, identical, within, largest, bad)


def markdown(groups: Sequence[Group]) -> list[str]:
    """The check's line (nothing when no trial ran on a pool)."""
    probed, identical, within, largest, bad = isolation_check(groups)
    if not probed:
        return []
    return ["", "Isolation (pool trials: teacher-forced log-probs of each trial's step-0 samples scored alone and in "
                f"one batch with the other slots' adapters): the same bits for {identical} of {probed} trials"
            + (f"; within the stated tolerance {ISOLATION_TOLERANCE:g} nats (engines not batch-invariant) for "
               f"{within}, largest {largest:.3g}" if within else "")
            + ("." if not bad else "; beyond: " + "; ".join(bad) + ".")]
