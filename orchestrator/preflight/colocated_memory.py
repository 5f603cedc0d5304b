"""The colocated trial's memory check: one GPU holds a learner rank and a rollout engine, in two phases.

- generate (engine awake): the engine's share (rollout.engine.gpu_memory_utilization x the device's memory:
  weights + KV cache, what vLLM takes) + what the learner rank keeps between steps (its sharded weights, gradients
  and Adam moments, the frozen base / reference: `LearnerMemory.resident`; with learner.offload_between_steps
  only the weights the engine's phase reads: the LoRA base and adapter, or the policy for the weight sync) + each
  process's CUDA context;
- train (engine asleep): the learner's whole estimate (orchestrator/preflight/learner_memory.py) + what the
  sleeping engine still holds (nothing of its weights or KV cache: level 1 keeps the weights in host memory,
  level 2 drops them) + the CUDA contexts.
Each must fit the device less the 10% the learner check keeps free. The CUDA context size is an assumption
(about 0.5 GiB per process on an H100 with torch and NCCL loaded), not measured here.
"""

from __future__ import annotations

from dataclasses import dataclass

CUDA_CONTEXT_GIB = 0.5
PROCESSES = 2  # the learner rank and the engine's model worker


@dataclass(frozen=True)
class PhaseFit:
    """GiB each phase needs on the shared GPU, and the GiB it may use."""

    generate: float
    train: float
    usable: float
    max_utilization: float  # the largest engine share the generate phase fits (<= 0: none)

    @property
    def fits(self) -> bool:
        return self.generate <= self.usable and self.train <= self.usable


def phase_fit(utilization: float, learner_total: float, learner_resident: float, device: float,
              reserve: float) -> PhaseFit:
    """Both phases of one colocated GPU of `device` GiB (all in GiB; `reserve`: the fraction kept free)."""
    contexts = PROCESSES * CUDA_CONTEXT_GIB
    usable = device * (1 - reserve)
    return PhaseFit(generate=utilization * device + learner_resident + contexts, train=learner_total + contexts,
                    usable=usable, max_utilization=(usable - learner_resident - contexts) / device)


def refusal(fit: PhaseFit, utilization: float, offloads: bool = False) -> tuple[str, str] | None:
    """(the key to change, what to change in one sentence), or None when both phases fit. `offloads`: the learner
    already sets learner.offload_between_steps (not suggested again)."""
    if fit.train > fit.usable:
        return "resources.learner_ranks", (f"the training phase needs {fit.train:.1f} GiB of {fit.usable:.1f} usable: raise "
                "resources.learner_ranks, set learner.cpu_offload or learner.gradient_checkpointing, or use "
                "resources.placement 'separate'")
    if fit.generate > fit.usable:
        if fit.max_utilization >= 0.05:
            how = f"lower rollout.engine.gpu_memory_utilization to {int(fit.max_utilization * 100) / 100:.2f} or less"
        else:
            how = "no engine share fits beside the learner's resident state"
        offload = "" if offloads else "set learner.offload_between_steps, "
        return "rollout.engine.gpu_memory_utilization", (f"the generate phase needs {fit.generate:.1f} GiB of {fit.usable:.1f} usable (the engine at "
                f"{utilization:g} of the GPU beside the learner's resident state): {how}; or {offload}raise "
                "resources.learner_ranks, set learner.cpu_offload, or use resources.placement 'separate'")
    return None
