"""The credit-assignment stack: pure, vectorised torch functions (no Ray, no I/O).

Public entry points:

- `compute_advantages(rewards, signals, mask, config, planning=..., sepa_lambda=..., step=...)`:
  rewards `[G]`/`[N, G]` + per-token uncertainty `[G, T]`/`[N, G, T]` + bool mask -> `CreditResult`
  (token advantages, episode advantages, the pooled signal, per-batch stats).
- `planning_mask(pieces, grams=None)`: decoded token pieces of one completion -> one bool per token.
- `SepaController`: the SEPA schedule (linear / auto, sticky correctness gate, state_dict).
- `token_uncertainty(kind, logprobs=..., logits=...)`, `surprisal`, `shannon_entropy`, `varentropy`.
- `CreditConfig`, `SepaConfig`: the typed configuration (embedded in the trial config).

Modules: `episode` (GRPO, MaxRL), `token` (SEPA pooling, GTPO weights, HICRA), `planning` (strategic grams),
`gae` (token-level GAE from critic values), `schedule` (SEPA controller), `uncertainty` (signals), `plugins` (dotted-path plugins), `pipeline`
(composition). See docs/credit.md.
"""

import importlib

# name -> submodule: imported on first use, so reading the configs (the trial schema, `plan`) never imports
# torch. The function `gae` is `workers.credit.gae.gae` (the name `gae` here is its module).
_EXPORTS = {
    "NAMED_TRANSFORMS": "config",
    "CreditConfig": "config",
    "GaeConfig": "config",
    "SepaConfig": "config",
    "CreditError": "errors",
    "masked_whiten": "gae",
    "token_rewards": "gae",
    "CreditResult": "pipeline",
    "compute_advantages": "pipeline",
    "resolve_plugins": "plugin_paths",
    "DEFAULT_GRAMS": "planning",
    "planning_mask": "planning",
    "planning_masks": "planning",
    "AlgorithmContext": "plugins",
    "TransformContext": "plugins",
    "SepaController": "schedule",
    "KINDS": "uncertainty",
    "shannon_entropy": "uncertainty",
    "surprisal": "uncertainty",
    "token_uncertainty": "uncertainty",
    "varentropy": "uncertainty",
}

__all__ = [
    "DEFAULT_GRAMS", "KINDS", "NAMED_TRANSFORMS", "AlgorithmContext", "CreditConfig", "CreditError",
    "CreditResult", "GaeConfig", "SepaConfig", "SepaController", "TransformContext", "compute_advantages",
    "planning_mask", "planning_masks", "resolve_plugins", "shannon_entropy", "surprisal",
    "token_uncertainty", "varentropy", "masked_whiten", "token_rewards",
]


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
