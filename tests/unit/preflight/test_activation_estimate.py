"""The learner memory estimate's activation term against torch's measured peak on CPU: real Qwen2 / Qwen3
architectures (transformers' classes, random init, LoRA as the learner builds it) at two sizes and sequence
lengths, with and without gradient checkpointing, one micro-batch's forward and backward through the learner's
own pass (workers/learner/modules.py:response_source, workers/learner/passes/token_stats.py) with the log-prob pass in
chunks smaller than the response window. The peak is the highest running sum of the CPU allocator's
allocations and frees that torch.profiler records during the step (the weights and the adapter's gradients exist
before it). fp32 on CPU: the estimate is asked at 4 bytes per activation (bf16 on a GPU: 2)."""

from __future__ import annotations

import json

import pytest
import torch

from orchestrator.config.trial import TrialConfig
from orchestrator.preflight.learner_memory import activation_bytes, model_counts

CASES = [  # family, hidden, intermediate, layers, vocab, rows, sequence, response, chunk, checkpointing
    ("qwen2", 128, 352, 4, 4096, 4, 256, 128, 128, False),
    ("qwen2", 128, 352, 4, 4096, 4, 256, 128, 128, True),
    ("qwen3", 192, 512, 3, 6144, 2, 512, 384, 256, False),
    ("qwen3", 192, 512, 3, 6144, 2, 512, 384, 256, True),
]


def _model(family: str, h: int, i: int, layers: int, vocab: int, ckpt: bool, tmp_path):
    from peft import get_peft_model
    from transformers import AutoConfig, AutoModelForCausalLM

    from workers.learner.config import LoraSettings
    from workers.learner.modules import lora_config

    config = {"architectures": [f"{family.capitalize()}ForCausalLM"], "model_type": family, "hidden_size": h,
              "intermediate_size": i, "num_hidden_layers": layers, "num_attention_heads": 4,
              "num_key_value_heads": 2, "head_dim": h // 4, "vocab_size": vocab, "tie_word_embeddings": True,
              "max_position_embeddings": 4096}
    (tmp_path / "config.json").write_text(json.dumps(config))
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(tmp_path))
    if ckpt:  # as workers/learner/modules.py:load_causal_lm sets it
        model.config.use_cache = False
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return get_peft_model(model, lora_config(LoraSettings())).train()


def _peak_bytes(step) -> int:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step()
    events = sorted((e.start_ns(), e.nbytes()) for e in prof.profiler.kineto_results.events()
                    if e.name() == "[memory]")
    now = peak = 0
    for _, n in events:
        now += n
        peak = max(peak, now)
    return peak


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-h{c[1]}-s{c[6]}-{'ckpt' if c[-1] else 'plain'}")
def test_activation_estimate_within_20_percent_of_the_measured_peak(case, tmp_path):
    from workers.learner.modules import response_source
    from workers.learner.passes.token_stats import token_stats

    family, h, i, layers, vocab, rows, seq, resp, chunk, ckpt = case
    model = _model(family, h, i, layers, vocab, ckpt, tmp_path)
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(0, vocab, (rows, seq), generator=gen)
    attn = torch.ones_like(ids)
    idx = (seq - resp) - 1 + torch.arange(resp)[None, :].expand(rows, -1)

    def step():
        source, head = response_source(model, ids, attn, idx, True, False)
        stats = token_stats(source, ids.gather(1, idx + 1), 0.9, chunk, head=head, entropy=True)
        (stats.lp.mean() + 0.01 * stats.entropy.mean()).backward()

    step()  # the adapter's gradients exist before the measured step, as after a learner's first micro-batch
    measured = _peak_bytes(step)
    cfg = TrialConfig.model_validate({"model": {"name": str(tmp_path)}, "task": {"name": "arithmetic"}})
    counts = model_counts(str(tmp_path), cfg)
    estimate = activation_bytes(counts, rows * seq, chunk, checkpointing=ckpt, logits_from_model=False,
                                act_bytes=4, positions=rows * resp)
    print(f"estimate {estimate / 2**20:.2f} MiB, measured {measured / 2**20:.2f} MiB: {estimate / measured:.3f}")
    assert measured > 0
    assert abs(estimate - measured) <= 0.2 * measured, (estimate / 2**20, measured / 2**20)
