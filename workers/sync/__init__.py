"""The policy on the rollout engines: LoRA adapters or full weights, one interface.

- `policy.PolicyUpdate`: one version of the policy as the learner exports it (`Learner.export_policy`): a kind,
  the version, the files as bytes and, for full weights, the checksum the engine must reproduce.
- `policy.PolicySync`: how one rollout worker's engine takes updates of one kind: the `vllm.LLM` arguments it
  needs (`engine_args`), `apply(llm, update)`, and the `LoRARequest` generate passes. Implementations:
  `adapter.AdapterSync` (`learner.mode: lora`: PEFT files hot-swapped with a fresh LoRA id each time) and
  `full_weights.FullWeightSync` (`learner.mode: full`: safetensors reloaded in place by a vLLM worker
  extension, checked by checksum).
- `policy.push(workers, update)`: the driver's side (orchestrator/trial/actors/learner_group.py:LearnerGroup.push_policy):
  one object-store copy of the update, `RolloutWorker.apply_policy` on every worker. It never looks at the kind.

Why the seam sits on the worker: how an update is installed depends on how the engine was built (LoRA or not),
which only the worker knows. A third transport, e.g. CUDA IPC when learner and engine share a GPU, is a new
update kind (handles instead of files) plus a `PolicySync` that opens them in the engine; the driver and the
learner group stay as they are. A transport that needs the learner and the engines in one collective (an NCCL
broadcast) would add a driver-side step next to `push`.
"""
