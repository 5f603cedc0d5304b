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

from .config import NAMED_TRANSFORMS, CreditConfig, GaeConfig, SepaConfig
from .errors import CreditError
from .gae import gae, masked_whiten, token_rewards
from .pipeline import CreditResult, compute_advantages, resolve_plugins
from .planning import DEFAULT_GRAMS, planning_mask, planning_masks
from .plugins import AlgorithmContext, TransformContext
from .schedule import SepaController
from .uncertainty import KINDS, shannon_entropy, surprisal, token_uncertainty, varentropy

__all__ = [
    "DEFAULT_GRAMS", "KINDS", "NAMED_TRANSFORMS", "AlgorithmContext", "CreditConfig", "CreditError",
    "CreditResult", "GaeConfig", "SepaConfig", "SepaController", "TransformContext", "compute_advantages",
    "planning_mask", "planning_masks", "resolve_plugins", "shannon_entropy", "surprisal",
    "token_uncertainty", "varentropy", "gae", "masked_whiten", "token_rewards",
]
