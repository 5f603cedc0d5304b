"""`python -m orchestrator export`: a trial's trained policy out of its checkpoint, as a model directory.

The checkpoint (the newest, or the one of `--step`) is verified first with the restore code (its sealed sha256
manifest, orchestrator/trial/artifacts/restore.py); a damaged one is refused, never replaced by another. The policy is
written by workers/learner/export.py (a PEFT adapter, a merged model, or the full model gathered from the shards);
the base model's tokenizer files (chat template included) and generation config are copied beside it, the trial's
config and a model card (README.md: which run, its held-out metrics, how to load it; model_card.py) are written,
and `EXPORT_MANIFEST` records the trial, step, base model and the sha256 of every file written.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from orchestrator import storage as store
from orchestrator.actors.models import resolve_model
from orchestrator.config.trial import TrialConfig
from orchestrator.trial.artifacts.restore import verified_checkpoint
from orchestrator.trial.model_card import CARD_FILE, CONFIG_FILE, Exported, card_text

EXPORT_MANIFEST = "export_manifest.json"
BASE_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json", "vocab.txt",
              "merges.txt", "added_tokens.json", "tokenizer.model", "chat_template.jinja", "chat_template.json",
              "generation_config.json")


def lone_trial_tune_dir(trial_dir: str) -> str:
    """The Tune directory of a lone `orchestrator trial` run from the directory it wrote (`<storage>/<name>`, which
    holds the trial's config): `<storage>/<name>/<name>`. ValueError when it is no such directory."""
    text = store.read_text(store.join(trial_dir, store.TRIAL_CONFIG_FILE))
    if text is None:
        raise ValueError(f"{trial_dir}: not a trial directory (no {store.TRIAL_CONFIG_FILE}); give a campaign YAML "
                         "with --trial, or the directory `python -m orchestrator trial` wrote (<storage>/<name>)")
    return store.join(trial_dir, json.loads(text)["name"])


def copy_base_files(model_path: str, out: Path) -> list[str]:
    """The base model's tokenizer files (chat template included) and generation config, into `out`."""
    src = Path(model_path)
    if src.is_dir():
        names = [n for n in BASE_FILES if (src / n).is_file()]
        for n in names:
            shutil.copyfile(src / n, out / n)
        return names
    from transformers import AutoTokenizer, GenerationConfig  # a hub name: from the local cache

    AutoTokenizer.from_pretrained(model_path).save_pretrained(out)
    try:
        GenerationConfig.from_pretrained(model_path).save_pretrained(out)
    except OSError:  # the base has none
        pass
    return sorted(p.name for p in out.iterdir() if p.name in BASE_FILES)


def export_trial(tune_dir: str, trial: str, out: Path, *, step: int | None = None, merge: bool = False,
                 campaign: str | None = None) -> dict:
    """Export trial `trial` (its Tune directory `tune_dir`; of `campaign`, None for a lone trial) into the new
    directory `out`, with its model card (model_card.py); returns the manifest. Raises CheckpointError (damaged),
    LookupError (no such step) or ValueError (a request that cannot be met)."""
    from workers.learner.export import export_policy_dir

    if out.exists() and any(out.iterdir()):
        raise ValueError(f"--out {out}: not empty; export into a new directory")
    fs, path = store.filesystem(tune_dir)
    state, files, where = verified_checkpoint(fs, path, step)
    cfg = TrialConfig.model_validate(state["config"])
    if merge and cfg.learner.mode == "full":
        raise ValueError(f"--merge: trial {trial} trained every weight (learner.mode full); its export is already "
                         "a whole model")
    if cfg.learner.mode == "full" and cfg.credit.uses_critic and cfg.learner.critic.model == "lora":
        raise ValueError(f"trial {trial}: a full-mode policy sharing its weights with a LoRA critic cannot be "
                         "exported yet (its checkpoint holds the policy inside the critic's PeftModel)")
    model_path = resolve_model(cfg.model)
    out.mkdir(parents=True, exist_ok=True)
    learner_files = {k: v for k, v in files.items() if k == "learner.pt" or k.startswith(store.SHARDS_DIR + "/")}
    kind = export_policy_dir(learner_files, model_path, cfg.learner, out, merge=merge, source=where)
    copied = copy_base_files(model_path, out)
    exported = Exported(trial, campaign, state["step"], state.get("adapter_version"), kind, where, cfg,
                        model_path)
    (out / CONFIG_FILE).write_text(json.dumps(state["config"], indent=1))
    (out / CARD_FILE).write_text(card_text(exported, str(out)))  # in place of PEFT's blank card
    manifest = {
        "trial": trial, "step": state["step"], "policy_version": state.get("adapter_version"), "kind": kind,
        "base_model": cfg.model.name, "base_path": model_path, "checkpoint": where,
        "copied_from_base": copied,
        "files": {p.relative_to(out).as_posix(): {"bytes": p.stat().st_size, "sha256": store.sha256_hex(p.read_bytes())}
                  for p in sorted(out.rglob("*")) if p.is_file()},
    }
    (out / EXPORT_MANIFEST).write_text(json.dumps(manifest, indent=1))
    return manifest
