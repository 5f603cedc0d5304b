"""The critic for PPO + GAE, in two shapes (`learner.critic.model`):

- `LoraCritic`: a value head beside the policy on the SAME base weights. It owns its own LoRA adapter ("critic")
  plus a scalar head, its own AdamW, learning rate and gradient clip. No second copy of the base model exists.
  Under lora mode the adapter joins the policy's PeftModel (PEFT holds several adapters and switches between
  them); the KL reference pass (`disable_adapter()`) disables both, and the policy adapter exported to vLLM never
  contains the critic's. Under full mode (`on_full_policy`) the base weights ARE the policy, trained every step:
  the critic reads the current policy's hidden states through its adapter, the adapter is switched off for every
  policy pass, and the base is frozen while the critic learns (its value loss never moves the policy).
- `FullCritic` (full mode, RAGEN's shape): its own full model (the policy's initial decoder) plus a value head,
  every weight trained; sharded over the learner group like the policy.

`values` predicts one value per response position: the value of the state before that token is sampled (hidden
state at position p-1, the same alignment as the policy's log-prob of token p).
"""

from __future__ import annotations

from contextlib import contextmanager, nullcontext
from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn

from workers.learner.ranks import ONE_RANK, Ranks
from workers.objectives.losses import aggregate

if TYPE_CHECKING:
    from workers.learner.config import CriticConfig

ADAPTER = "critic"


def clipped_value_loss(values: Tensor, old_values: Tensor, returns: Tensor, clip: float) -> tuple[Tensor, Tensor]:
    """Per-token 0.5 * max((V - R)^2, (V_clip - R)^2), V_clip = V_old + clip(V - V_old, -c, c); and a bool
    `[B, T]` of tokens where the clipped term was the larger (the value clip was active)."""
    clipped = old_values + (values - old_values).clamp(-clip, clip)
    a, b = (values - returns).square(), (clipped - returns).square()
    return 0.5 * torch.maximum(a, b), b > a


def _window(hidden: Tensor, start: Tensor, length: int, width: int) -> Tensor:
    """`[b, length, H]` hidden states at the positions before each response token."""
    idx = (start[:, None] - 1 + torch.arange(length)[None, :]).clamp(max=width - 2).to(hidden.device)
    return hidden.gather(1, idx[..., None].expand(-1, -1, hidden.shape[-1]))


class _Critic:
    """What both critics share: the PPO value update over (micro-batch, real) passes."""

    cfg: CriticConfig
    device: str
    params: list[nn.Parameter]
    optimizer: torch.optim.Optimizer
    ranks: Ranks

    def active(self):
        return nullcontext()

    def train(self, on: bool) -> None:
        """Train / eval mode of the critic's own modules (the LoRA critic's model is the policy's)."""

    def values(self, seqs: Tensor, attn: Tensor, start: Tensor, length: int) -> Tensor:
        raise NotImplementedError

    def update(self, passes, returns: Tensor, old_values: Tensor, aggregation: str, totals: dict) -> dict[str, float]:
        """One optimizer step over `passes` [((seqs, attn, start, length, mask, rows), real)], gradient accumulated
        (a pass that is not `real` keeps the group's collectives in step and adds nothing); returns this rank's
        summed value loss, clip count and the gradient norm."""
        self.optimizer.zero_grad(set_to_none=True)
        loss_sum, clipped = 0.0, 0.0
        with self.active():
            for (seqs, attn, start, length, mask, rows), real in passes:
                v = self.values(seqs, attn, start, length)
                m = mask.to(self.device)
                per_tok, was_clipped = clipped_value_loss(v, old_values[rows].to(self.device),
                                                          returns[rows].to(self.device), self.cfg.cliprange_value)
                loss = aggregate(per_tok, m, aggregation, **totals)
                (loss if real else loss * 0.0).backward()
                if real:
                    loss_sum += loss.item()
                    clipped += float((was_clipped & m).sum())
            norm = self._clip()
            self.optimizer.step()
        return {"value_loss": loss_sum, "clipped": clipped, "grad_norm": norm}

    def _clip(self) -> float:
        from workers.learner.modules import clip_grad_norm

        return clip_grad_norm(self.params, self.cfg.grad_clip)


class LoraCritic(_Critic):
    """Value adapter + head + optimizer on the policy's PeftModel (see module docstring)."""

    def __init__(self, peft_model, config: CriticConfig, lora_config, device: str, ranks: Ranks = ONE_RANK):
        """`peft_model`: the lora-mode policy (its adapter "default"), or `on_full_policy`'s wrapper of a full-mode
        policy, which already holds this critic's adapter (`lora_config` is then unused)."""
        self.model, self.cfg, self.device, self.ranks = peft_model, config, device, ranks
        self.full_policy = "default" not in peft_model.peft_config  # the base itself is the trained policy
        if not self.full_policy:
            self.model.add_adapter(ADAPTER, lora_config)
        self._use(None)  # the policy's view outside `active()`
        hidden = self.model.get_base_model().config.hidden_size
        self.head = nn.Linear(hidden, 1).to(device=device, dtype=torch.float32)
        self.module = nn.ModuleDict({"lm": self.model, "head": self.head})  # what the critic's checkpoint holds
        self.sharded = False  # set by the learner once the PeftModel is FSDP-sharded

    @staticmethod
    def on_full_policy(policy: nn.Module, lora_config):
        """Wrap a full-mode policy (a transformers model, every weight trained) in a PeftModel holding only the
        critic's adapter, with the base weights left trainable: PEFT freezes them when it wraps."""
        from peft import get_peft_model

        model = get_peft_model(policy, lora_config, adapter_name=ADAPTER)
        for p in model.parameters():
            p.requires_grad_(True)
        return model

    def owns(self, name: str) -> bool:
        """Whether a parameter / state-dict key of the PeftModel belongs to the critic (its adapter)."""
        return f".{ADAPTER}." in name

    def policy_weights(self, state: dict[str, Tensor]) -> dict[str, Tensor]:
        """Full mode: the PeftModel's state dict as the transformers model's (the names vLLM loads), without the
        critic's adapter: `base_model.model.` dropped, each wrapped Linear's `.base_layer.` unwrapped."""
        prefix = "base_model.model."
        return {k.removeprefix(prefix).replace(".base_layer.", "."): v for k, v in state.items() if not self.owns(k)}

    def _use(self, adapter: str | None) -> None:
        """Route forwards through the critic's adapter (`adapter` = "critic") or the policy's view (None): the
        adapter "default" (lora mode), or the bare base weights with the critic's adapter off (full mode).
        PEFT's `set_adapter` / `enable_adapters` also set requires_grad; the adapters stay trainable here (an
        adapter the forward skipped gets no gradient, and which one learns is decided by which optimizer steps).
        Under full mode the base weights are frozen while the critic is in use: its backward then computes no
        gradient for the policy's weights (FSDP2 re-reads requires_grad each time it gathers a parameter)."""
        if self.full_policy:
            tuner = self.model.base_model
            tuner.enable_adapter_layers() if adapter == ADAPTER else tuner.disable_adapter_layers()
        else:
            self.model.set_adapter(adapter or "default")
        for name, p in self.model.named_parameters():
            p.requires_grad_("lora_" in name or (self.full_policy and adapter is None))

    def make_optimizer(self) -> None:
        """After sharding: the adapter's (possibly sharded) parameters plus the head's."""
        params = [p for n, p in self.model.named_parameters() if self.owns(n)]
        self.params = params + list(self.head.parameters())
        self.optimizer = torch.optim.AdamW(self.params, lr=self.cfg.lr, betas=tuple(self.cfg.betas),
                                           weight_decay=self.cfg.weight_decay)

    @contextmanager
    def active(self):
        """Route forwards (and gradients) through the critic adapter, then back to the policy's."""
        self._use(ADAPTER)
        try:
            yield
        finally:
            self._use(None)

    def values(self, seqs: Tensor, attn: Tensor, start: Tensor, length: int) -> Tensor:
        """`[b, length]` float32 values of the response window (call inside `active()`)."""
        ids, mask = seqs.to(self.device), attn.to(self.device)
        hf = self.model.get_base_model()
        decoder = getattr(hf, hf.base_model_prefix)
        if self.sharded:  # the root's forward gathers the parameters; the decoder's output is taken on its way
            seen = {}

            def keep(_module, _args, out) -> None:  # returns None: the forward's output is left as it is
                seen["h"] = out.last_hidden_state

            hook = decoder.register_forward_hook(keep)
            try:
                self.model(input_ids=ids, attention_mask=mask, logits_to_keep=1, use_cache=False)
            finally:
                hook.remove()
            hidden = seen["h"]
        else:
            hidden = decoder(input_ids=ids, attention_mask=mask).last_hidden_state
        return self.head(_window(hidden, start, length, seqs.shape[1]).float()).squeeze(-1)

    def _clip(self) -> float:
        from workers.learner.modules import clip_grad_norm, sum_grads

        if self.ranks.grouped:  # the head is replicated, outside FSDP: its gradient is summed here
            sum_grads(list(self.head.parameters()))
        return clip_grad_norm(self.params, self.cfg.grad_clip)


class ValueModel(nn.Module):
    """A decoder plus a scalar value head: `forward(ids, mask, start, length) -> [b, length]` values."""

    def __init__(self, decoder: nn.Module, hidden: int):
        super().__init__()
        self.decoder = decoder
        self.head = nn.Linear(hidden, 1, dtype=torch.float32)

    def forward(self, ids: Tensor, mask: Tensor, start: Tensor, length: int) -> Tensor:
        hidden = self.decoder(input_ids=ids, attention_mask=mask, use_cache=False).last_hidden_state
        h = _window(hidden, start, length, ids.shape[1])
        return self.head(h.to(self.head.weight.dtype)).float().squeeze(-1)


class FullCritic(_Critic):
    """Its own full model + value head, every weight trained (see module docstring)."""

    def __init__(self, model_path: str, config: CriticConfig, device: str, dtype: torch.dtype, *, ranks: Ranks = ONE_RANK,
                 shard_fn=None, gradient_checkpointing: bool = False):
        from transformers import AutoModel

        self.cfg, self.device, self.ranks = config, device, ranks
        decoder = AutoModel.from_pretrained(model_path, dtype=dtype).to(device)
        if gradient_checkpointing:
            decoder.config.use_cache = False
            decoder.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        self.model = ValueModel(decoder, decoder.config.hidden_size).to(device)
        if shard_fn is not None:
            shard_fn(self.model)
        self.module = self.model  # what the critic's checkpoint holds
        self.params = list(self.model.parameters())
        self.optimizer = torch.optim.AdamW(self.params, lr=config.lr, betas=tuple(config.betas),
                                           weight_decay=config.weight_decay)

    def values(self, seqs: Tensor, attn: Tensor, start: Tensor, length: int) -> Tensor:
        return self.model(seqs.to(self.device), attn.to(self.device), start, length)

    def train(self, on: bool) -> None:
        self.model.train(on)
