"""The critic for PPO + GAE: a value head beside the policy on the SAME base weights.

It owns its own LoRA adapter ("critic", added to the policy's PeftModel: PEFT holds several adapters and
switches between them) plus a scalar head on the decoder's last hidden state, its own AdamW optimizer, learning
rate and gradient clip. No second copy of the base model exists. `values` predicts one value per response
position: the value of the state before that token is sampled (hidden state at position p-1, the same
alignment as the policy's log-prob of token p). The KL reference pass (`disable_adapter()`) disables both
adapters, and the policy adapter exported to vLLM never contains the critic's.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
from torch import Tensor

from workers.objectives import aggregate

ADAPTER = "critic"


def clipped_value_loss(values: Tensor, old_values: Tensor, returns: Tensor, clip: float) -> tuple[Tensor, Tensor]:
    """Per-token 0.5 * max((V - R)^2, (V_clip - R)^2), V_clip = V_old + clip(V - V_old, -c, c); and a bool
    `[B, T]` of tokens where the clipped term was the larger (the value clip was active)."""
    clipped = old_values + (values - old_values).clamp(-clip, clip)
    a, b = (values - returns).square(), (clipped - returns).square()
    return 0.5 * torch.maximum(a, b), b > a


class Critic:
    """Value adapter + head + optimizer, trained inside the learner actor (see module docstring)."""

    def __init__(self, peft_model, config: dict, lora_config, device: str, dtype: torch.dtype):
        self.model, self.cfg, self.device = peft_model, config, device
        self.model.add_adapter(ADAPTER, lora_config)
        self.model.set_adapter("default")  # the policy stays the active adapter outside `active()`
        hidden = self.model.get_base_model().config.hidden_size
        self.head = torch.nn.Linear(hidden, 1).to(device=device, dtype=torch.float32)
        with self.active():
            params = [p for p in self.model.parameters() if p.requires_grad]
        self.params = params + list(self.head.parameters())
        self.optimizer = torch.optim.AdamW(self.params, lr=config["lr"], betas=tuple(config["betas"]),
                                           weight_decay=config["weight_decay"])

    @contextmanager
    def active(self):
        """Route forwards (and gradients) through the critic adapter, then back to the policy's."""
        self.model.set_adapter(ADAPTER)
        try:
            yield
        finally:
            self.model.set_adapter("default")

    def values(self, seqs: Tensor, attn: Tensor, start: Tensor, length: int) -> Tensor:
        """`[b, length]` float32 values of the response window (call inside `active()`)."""
        hf = self.model.get_base_model()
        decoder = getattr(hf, hf.base_model_prefix)
        hidden = decoder(input_ids=seqs.to(self.device), attention_mask=attn.to(self.device)).last_hidden_state
        idx = (start[:, None] - 1 + torch.arange(length)[None, :]).clamp(max=seqs.shape[1] - 2).to(self.device)
        h = hidden.gather(1, idx[..., None].expand(-1, -1, hidden.shape[-1]))
        return self.head(h.float()).squeeze(-1)

    def update(self, micro_batches, returns: Tensor, old_values: Tensor, aggregation: str, totals: dict
               ) -> dict[str, float]:
        """One optimizer step over `micro_batches` [(seqs, attn, start, length, mask, rows)], gradient
        accumulated; returns the summed value loss, clip count and the gradient norm."""
        self.optimizer.zero_grad(set_to_none=True)
        loss_sum, clipped = 0.0, 0.0
        with self.active():
            for seqs, attn, start, length, mask, rows in micro_batches:
                v = self.values(seqs, attn, start, length)
                m = mask.to(self.device)
                per_tok, was_clipped = clipped_value_loss(v, old_values[rows].to(self.device),
                                                          returns[rows].to(self.device), self.cfg["cliprange_value"])
                loss = aggregate(per_tok, m, aggregation, **totals)
                loss.backward()
                loss_sum += loss.item()
                clipped += float((was_clipped & m).sum())
            norm = float(torch.nn.utils.clip_grad_norm_(self.params, self.cfg["grad_clip"]))
            self.optimizer.step()
        return {"value_loss": loss_sum, "clipped": clipped, "grad_norm": norm}

    def state_dict(self) -> dict:
        from peft import get_peft_model_state_dict

        return {"adapter": {k: v.detach().cpu() for k, v in get_peft_model_state_dict(
                    self.model, adapter_name=ADAPTER).items()},
                "head": {k: v.detach().cpu() for k, v in self.head.state_dict().items()},
                "optimizer": self.optimizer.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        from peft import set_peft_model_state_dict

        set_peft_model_state_dict(self.model, state["adapter"], adapter_name=ADAPTER)
        self.head.load_state_dict(state["head"])
        self.optimizer.load_state_dict(state["optimizer"])
