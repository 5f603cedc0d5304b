"""SEPA controller: how strongly to pool at each step.

Semantics (and their order inside a trial step, the "lag" of the SEPA doc):
1. `lam = controller.lambda_for(step)` before the step's advantages are computed. It reads only state built
   from earlier steps.
2. After the step, `controller.observe(correct_rate, exec_values)` opens the sticky gate when the batch
   correct rate reaches `correct_rate_gate`, and (auto schedule) folds the batch's execution-token
   uncertainty variance into an EMA. So a batch that opens the gate is itself trained with lambda 0.

Schedules:
- linear: lam = clip((step - delay_steps) / steps, 0, 1)   (0 when steps == 0)
- auto:   after `warmup` observed batches the EMA is frozen as var_0;
          auto = 1 - min(ema / var_0 / threshold, 1);  lam = max(auto, linear)
- gate:   lam = 0 while the gate is closed (a gate of 0 starts open).
"""

from __future__ import annotations

import math
from typing import Any

from torch import Tensor

from .config import SepaConfig

_EPS = 1e-8


class SepaController:
    """Stateful SEPA schedule; `state_dict()` / `load_state_dict()` restore it exactly."""

    def __init__(self, config: SepaConfig | None = None) -> None:
        self.config = config or SepaConfig()
        self.var_ema: float | None = None
        self.var_0: float | None = None
        self.warmup_seen = 0
        self.gate_open = self.config.correct_rate_gate <= 0.0

    # -- schedule ---------------------------------------------------------------------------------------
    def linear_lambda(self, step: float) -> float:
        c = self.config
        if c.steps <= 0:
            return 0.0
        return min(max((step - c.delay_steps) / c.steps, 0.0), 1.0)

    def auto_lambda(self) -> float:
        if self.config.schedule != "auto" or self.var_ema is None or self.var_0 is None:
            return 0.0
        ratio = max(self.var_ema, 0.0) / max(self.var_0, _EPS)
        return 1.0 - min(ratio / self.config.threshold, 1.0)

    def lambda_for(self, step: float) -> float:
        """Pooling strength for `step`, from what was observed before it."""
        if not self.gate_open:
            return 0.0
        linear = self.linear_lambda(step)
        return max(self.auto_lambda(), linear) if self.config.schedule == "auto" else linear

    # -- observation ------------------------------------------------------------------------------------
    def observe(self, correct_rate: float | None, exec_values: Tensor | None = None) -> None:
        """Fold one finished batch into the state.

        Args:
            correct_rate: fraction of the batch's completions that were correct (None: unknown).
            exec_values: 1-D tensor of the batch's raw execution-token uncertainties (auto schedule only).
        """
        if not self.gate_open and correct_rate is not None and math.isfinite(correct_rate):
            if correct_rate >= self.config.correct_rate_gate:
                self.gate_open = True
        if self.config.schedule != "auto" or exec_values is None or exec_values.numel() == 0:
            return
        var = float(exec_values.double().var(unbiased=False))
        if not math.isfinite(var):
            return
        d = self.config.ema_decay
        self.var_ema = var if self.var_ema is None else d * self.var_ema + (1.0 - d) * var
        if self.var_0 is None:
            self.warmup_seen += 1
            if self.warmup_seen >= self.config.warmup:
                self.var_0 = max(self.var_ema, _EPS)

    def metrics(self, step: float) -> dict[str, float]:
        return {"sepa_lambda": self.lambda_for(step), "sepa_gate_open": float(self.gate_open)}

    # -- checkpointing ----------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {
            "config": self.config.model_dump(),
            "var_ema": self.var_ema,
            "var_0": self.var_0,
            "warmup_seen": self.warmup_seen,
            "gate_open": self.gate_open,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore state; raises ValueError on a corrupt or mismatched state and leaves `self` unchanged."""
        if not isinstance(state, dict):
            raise ValueError(f"SEPA state must be a dict, got {type(state).__name__}")
        missing = {"var_ema", "var_0", "warmup_seen", "gate_open"} - state.keys()
        if missing:
            raise ValueError(f"SEPA state is missing {sorted(missing)}")
        if "config" in state and SepaConfig(**state["config"]) != self.config:
            raise ValueError("SEPA state was saved with different sepa settings")

        def _opt_float(key: str, positive: bool) -> float | None:
            v = state[key]
            if v is None:
                return None
            if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
                raise ValueError(f"SEPA state {key!r} must be a finite number or None, got {v!r}")
            if v < 0 or (positive and v <= 0):
                raise ValueError(f"SEPA state {key!r} must be {'> 0' if positive else '>= 0'}, got {v!r}")
            return float(v)

        var_ema, var_0 = _opt_float("var_ema", False), _opt_float("var_0", True)
        seen, gate = state["warmup_seen"], state["gate_open"]
        if isinstance(seen, bool) or not isinstance(seen, int) or seen < 0:
            raise ValueError(f"SEPA state 'warmup_seen' must be an int >= 0, got {seen!r}")
        if not isinstance(gate, bool):
            raise ValueError(f"SEPA state 'gate_open' must be a bool, got {gate!r}")
        if var_0 is not None and var_ema is None:
            raise ValueError("SEPA state has var_0 without var_ema")
        self.var_ema, self.var_0, self.warmup_seen, self.gate_open = var_ema, var_0, seen, gate
