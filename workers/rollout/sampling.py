"""One `generate` call's sampling, as vLLM takes it and as it comes back: `SamplingRequest` -> per-prompt
`SamplingParams` (`sampling_params`) and vLLM's `RequestOutput`s -> `Completion`s (`completions`). Shared by the
trial's own rollout worker (worker.py) and the pool's engine (shared.py), so a request samples and reads back
the same way in both."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from workers.rollout.output import Completion


@dataclass(frozen=True)
class SamplingRequest:
    """One `generate` call's sampling: `n` completions per prompt at `temperature` / `top_p`, at most `max_tokens`
    each, request i seeded `seed + i`, stopped at `stop_token_ids`; `action_token_ids` / `action_min_prob`: the
    probability floor at the action position (checked by `generate`, which names what is wrong); `base`: sample
    the base model, not the adapter the worker holds (a LoRA trial's starting policy: `rollout.difficulty_samples`)."""

    n: int
    temperature: float
    max_tokens: int
    seed: int
    top_p: float = 1.0
    stop_token_ids: list[int] | None = None
    action_token_ids: list[int] | None = None
    action_min_prob: float = 0.0
    base: bool = False


def sampling_params(prompt_ids: list[list[int]], request: SamplingRequest) -> tuple[list[dict], list, list[int] | None]:
    """(vLLM prompts, one `SamplingParams` per prompt, the action token ids under the probability floor or None).
    Prompt i is seeded `request.seed + i`: each request draws from its own generator, so what it samples does
    not depend on which other requests share the engine's batch. Raises ValueError naming a bad floor."""
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    from workers.objectives.probability_floor import EXTRA_ARGS_KEY

    r = request
    floor: dict[str, Any] = {}
    action_ids = None
    if r.action_token_ids is not None:
        action_ids = [int(t) for t in r.action_token_ids]
        if not action_ids or len(set(action_ids)) != len(action_ids) or min(action_ids) < 0:
            raise ValueError(f"action_token_ids must be non-empty, distinct, >= 0: {r.action_token_ids}")
        if not 0.0 <= r.action_min_prob < 1.0:
            raise ValueError(f"action_min_prob must lie in [0, 1), got {r.action_min_prob}")
        if r.temperature < 1e-5 or r.top_p != 1.0:
            raise ValueError("the action floor needs temperature > 0 and top_p == 1")
        floor = dict(logprobs=None, logprob_token_ids=action_ids,
                     extra_args={EXTRA_ARGS_KEY: {"token_ids": action_ids, "min_prob": float(r.action_min_prob)}})
    elif r.action_min_prob:
        raise ValueError("action_min_prob needs action_token_ids")
    params = [
        SamplingParams(
            n=r.n, temperature=r.temperature, top_p=r.top_p, max_tokens=r.max_tokens, seed=r.seed + i,
            stop_token_ids=list(r.stop_token_ids) if r.stop_token_ids else None,
            output_kind=RequestOutputKind.FINAL_ONLY,  # what LLM.generate sets; the shared engine steps itself
            **(floor or dict(logprobs=0)),
        )
        for i in range(len(prompt_ids))
    ]
    return [{"prompt_token_ids": list(p)} for p in prompt_ids], params, action_ids


def completions(outs: list, stop_token_ids: list[int] | None,
                action_ids: list[int] | None) -> tuple[list[list[Completion]], int]:
    """vLLM's `RequestOutput`s (one per prompt, in prompt order) -> (n `Completion`s per prompt, tokens in all).
    logprobs[i] is the processed log-prob of token_ids[i]; a completion is cut at its stop token."""
    from workers.envs.tokens import cut_at_stop

    out_groups, num_tokens = [], 0
    for out in outs:
        group = []
        for c in sorted(out.outputs, key=lambda c: c.index):
            ids = list(c.token_ids)
            lps = [step[t].logprob for step, t in zip(c.logprobs, ids, strict=True)]
            if stop_token_ids:  # vLLM stops there already; a turn never runs past its end token
                ids, lps = cut_at_stop(ids, lps, list(stop_token_ids))
            action = {t: c.logprobs[0][t].logprob for t in action_ids} if action_ids is not None else None
            group.append(Completion(ids, lps, str(c.finish_reason), c.text or "", action))
            num_tokens += len(ids)
        out_groups.append(group)
    return out_groups, num_tokens
