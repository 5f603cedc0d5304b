"""The exported directory's README.md (orchestrator/trial/export.py): a model card of our own in place of PEFT's
blank one. It says which run the policy is (campaign, condition, seed, step), what it trained from and how (the
trial's config, its credit and intervention settings), what it scored on held-out problems, and how to load it.

Every fact is also in the card's YAML front matter under `credit_orchestrator:` (`read_card` gives it back), beside
the Hugging Face keys (`base_model` only when the base is a hub id, `library_name`, `tags`).

Held-out metrics of a checkpoint of step S: the in-training evaluation of step S + 1 measured that very policy
(it runs before step S + 1's update), and `python -m orchestrator eval` rows of checkpoint S (trials/<t>/eval/).
The last checkpoint has none in training (no evaluation follows its update) until `eval` measures it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import yaml

from orchestrator import storage as store
from orchestrator.config.trial import TrialConfig

CARD_FILE = "README.md"
CARD_KEY = "credit_orchestrator"
CONFIG_FILE = store.TRIAL_CONFIG_FILE  # beside the card: the trial's whole config as it ran (the checkpoint's copy)
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


@dataclass(frozen=True)
class Exported:
    """What one export wrote: the trial, the checkpoint, the kind of directory."""

    trial: str
    campaign: str | None  # None: a lone `orchestrator trial` run
    step: int
    policy_version: int | None
    kind: str  # adapter | merged | full
    checkpoint: str
    cfg: TrialConfig
    base_path: str  # where the base model was loaded from (a local model's built directory)


def hub_id(name: str) -> str | None:
    """`name` when it is a Hugging Face hub id (`org/model`), not a local path or one of our built local models."""
    from workers.tiny.local import is_local_model

    if is_local_model(name) or not _HUB_ID.match(name) or Path(name).expanduser().exists():
        return None
    return name


def heldout_metrics(cfg: TrialConfig, step: int) -> dict[str, dict]:
    """The held-out numbers of the policy of checkpoint `step`, by where they were measured: `training` (the
    `eval/...` of the metrics row of step + 1) and `eval command: <set>` (each set's newest CSV row of this
    checkpoint)."""
    if cfg.output_dir is None:
        return {}
    out: dict[str, dict] = {}
    row = next((r for r in store.read_jsonl(store.join(cfg.output_dir, store.METRICS_FILE))
                if r.get("step") == step + 1), {})
    training = {k: v for k, v in row.items() if k.startswith("eval/") and isinstance(v, int | float)}
    if training:
        out[f"training (evaluation of step {step + 1})"] = training
    folder = store.join(cfg.output_dir, store.EVAL_DIR)
    for name in sorted(n for n in store.file_sizes(folder) if n.endswith(".csv")):
        rows = [r for r in store.read_csv(store.join(folder, name)) if r.get("checkpoint_step") == str(step)]
        if rows:
            out[f"eval command: {name.removesuffix('.csv')}"] = {k: _number(v) for k, v in rows[-1].items() if v}
    return out


def _number(text: str) -> float | int | str:
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def _load_text(e: Exported, out: str) -> str:
    base = hub_id(e.cfg.model.name) or e.base_path
    if e.kind == "adapter":
        return f"""```python
# transformers + PEFT
from peft import PeftModel
from transformers import AutoModelForCausalLM, AutoTokenizer
base = AutoModelForCausalLM.from_pretrained("{base}")
model = PeftModel.from_pretrained(base, "{out}")
tokenizer = AutoTokenizer.from_pretrained("{out}")  # the base's tokenizer and chat template, copied here

# vLLM: the base model with this adapter as a LoRA
from vllm import LLM, SamplingParams
from vllm.lora.request import LoRARequest
llm = LLM(model="{base}", enable_lora=True, max_lora_rank={max(8, e.cfg.learner.lora.rank)})
outputs = llm.generate(["..."], SamplingParams(max_tokens=256), lora_request=LoRARequest("policy", 1, "{out}"))
```
One merged model instead (no PEFT needed): export again with `--merge`."""
    return f"""```python
# transformers
from transformers import AutoModelForCausalLM, AutoTokenizer
model = AutoModelForCausalLM.from_pretrained("{out}")
tokenizer = AutoTokenizer.from_pretrained("{out}")

# vLLM
from vllm import LLM
llm = LLM(model="{out}")
```
{"The LoRA adapter merged into the base weights (`--merge`): a whole model." if e.kind == "merged" else
 "Every weight trained (learner.mode full): the whole model, gathered from the checkpoint's shards."}"""


def card_facts(e: Exported) -> dict:
    """The card's `credit_orchestrator:` front matter."""
    cfg = e.cfg
    return {
        "campaign": e.campaign, "trial": e.trial, "condition": cfg.labels.get("condition"),
        "seed": cfg.seed, "swept": {k: v for k, v in cfg.labels.items() if k not in ("condition", "seed")},
        "step": e.step, "policy_version": e.policy_version, "kind": e.kind, "base_model": cfg.model.name,
        "checkpoint": e.checkpoint, "config": CONFIG_FILE, "heldout": heldout_metrics(cfg, e.step),
        "credit": cfg.credit.model_dump(mode="json"), "interventions": cfg.interventions.model_dump(mode="json"),
    }


def card_text(e: Exported, out: str) -> str:
    """The README.md of export directory `out`."""
    facts = card_facts(e)
    hub = hub_id(e.cfg.model.name)
    front = {**({"base_model": hub} if hub else {}),
             "library_name": "peft" if e.kind == "adapter" else "transformers",
             "tags": ["credit-orchestrator", "reinforcement-learning", *(["lora"] if e.kind != "full" else [])],
             CARD_KEY: facts}
    who = f"campaign `{e.campaign}`, " if e.campaign else "a lone trial, "
    run = (f"{who}trial `{e.trial}` (condition `{facts['condition']}`, seed {facts['seed']}"
           + "".join(f", {k} = {v}" for k, v in facts["swept"].items()) + ")")
    credit = e.cfg.credit
    metrics = "\n".join(f"- {where}: " + ", ".join(f"`{k}` {v:.4g}" if isinstance(v, float) else f"`{k}` {v}"
                                                   for k, v in numbers.items())
                        for where, numbers in facts["heldout"].items()) or (
        "- none recorded: this is the trial's last checkpoint, or no evaluation followed it"
        + (f"; measure it with `python -m orchestrator eval <campaign file> --step {e.step}`" if e.campaign else ""))
    return f"""---
{yaml.safe_dump(front, sort_keys=False).strip()}
---
# {e.trial}, step {e.step}

A policy trained by reinforcement learning with the credit orchestrator: {run}, the checkpoint of step {e.step}
(policy version {e.policy_version}) exported as {"a LoRA adapter" if e.kind == "adapter" else "a whole model"} of
base model `{e.cfg.model.name}`{f" ([hub](https://huggingface.co/{hub}))" if hub else " (a local model)"}, task
`{e.cfg.task.name}`.

Checkpoint: `{e.checkpoint}`

## Held-out metrics of this policy
{metrics}

## Credit assignment and interventions
Advantage `{credit.advantage_mode}`, token transform `{credit.transform_mode}`. Whole settings:
```yaml
{yaml.safe_dump({"credit": facts["credit"], "interventions": facts["interventions"]}, sort_keys=False).strip()}
```

## How to load it
{_load_text(e, out)}

## The trial's config
As it ran (the checkpoint's copy; also `{CONFIG_FILE}` here):
```yaml
{yaml.safe_dump(e.cfg.model_dump(mode="json"), sort_keys=False).strip()}
```
"""


def read_card(path: str | Path) -> dict:
    """A card's front matter (all of it: the Hugging Face keys and `credit_orchestrator:`)."""
    text = Path(path).read_text()
    if not text.startswith("---\n"):
        return {}
    return yaml.safe_load(text[4:text.index("\n---\n", 4)]) or {}
