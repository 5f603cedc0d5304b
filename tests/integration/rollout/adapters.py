"""Reference pieces for the rollout integration tests: a seeded PEFT adapter saved from the tiny model, and the
log-probs transformers gives a completion (the independent reference vLLM's log-probs are checked against)."""

from __future__ import annotations

from pathlib import Path

import torch


@torch.no_grad()
def hf_logprobs(model, prompt: list[int], completion: list[int], temperature: float) -> torch.Tensor:
    ids = torch.tensor([prompt + completion])
    logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float()
    lp = torch.log_softmax(logits / temperature, dim=-1)
    return lp.gather(-1, torch.tensor(completion)[:, None])[:, 0]


def max_lp_err(model, prompt_ids, res, temperature: float) -> float:
    err = 0.0
    for prompt, group in zip(prompt_ids, res.completions, strict=True):
        for c in group:
            ref = hf_logprobs(model, prompt, c.token_ids, temperature)
            err = max(err, (ref - torch.tensor(c.logprobs)).abs().max().item())
    return err


def make_adapter(tiny_model_dir, out_dir: Path, seed: int, std: float = 0.1):
    """A PEFT LoRA (r=8, q/k/v/o) with seeded random lora_B so it changes outputs. Returns (model, files)."""
    from peft import LoraConfig, get_peft_model

    from workers.models.loading import load_model

    torch.manual_seed(seed)  # lora_A init
    pm = get_peft_model(
        load_model(tiny_model_dir, dtype=torch.float32),
        LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0, task_type="CAUSAL_LM",
                   target_modules=["q_proj", "k_proj", "v_proj", "o_proj"]),
    )
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in pm.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=g) * std)
    pm.save_pretrained(out_dir)
    files = {f.name: f.read_bytes() for f in Path(out_dir).iterdir() if f.is_file()}
    assert "adapter_model.safetensors" in files and "adapter_config.json" in files
    return pm.eval(), files
