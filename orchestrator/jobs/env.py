"""What a campaign's W&B mode is on this run, and which variables a submitted job may carry.

- `WANDB_MODE` (or `--wandb-mode` on `run` / `submit`, which sets it) overrides the campaign file's `wandb.mode`:
  a campaign written for a laptop (offline) streams online on a cluster without editing the file. Changing the
  mode does not change the campaign: a resume with another mode is allowed (launch.py `_stable`).
- A job's runtime_env `env_vars` are stored with the job and shown to anyone who can list jobs, so `submit`
  forwards no secret (API keys, tokens) and nothing that only means something on this machine (`HF_HOME`, paths
  into this home directory). Online W&B takes its key on the nodes: `WANDB_API_KEY` in the node's environment, or
  a file (`wandb.api_key_file`, or `WANDB_API_KEY_FILE` set on the node, e.g. a mounted Kubernetes Secret).
"""

from __future__ import annotations

import dataclasses
import os
import re

from orchestrator.config.errors import UserError

MODES = ("offline", "online", "disabled")
ALIASES = {"dryrun": "offline", "run": "online"}  # wandb's own older names
# forwarded when set here: they mean the same on the cluster and hold no secret
FORWARD = ("WANDB_MODE", "WANDB_PROJECT", "WANDB_ENTITY", "VLLM_CPU_KVCACHE_SPACE", "VLLM_LOGGING_LEVEL")
SECRET = re.compile(r"(?i)(KEY|TOKEN|SECRET|PASSWORD|CREDENTIAL)")


def wandb_mode(flag: str | None = None) -> str | None:
    """The override (the flag, else $WANDB_MODE), checked; None when neither is set. The flag is exported so
    that everything this process starts (and `submit`'s job) sees the same mode."""
    mode = flag or os.environ.get("WANDB_MODE") or None
    if mode is None:
        return None
    where = "--wandb-mode" if flag else "WANDB_MODE"
    mode = ALIASES.get(mode, mode)
    if mode not in MODES:
        raise UserError(f"{where}: {mode!r} is not a W&B mode this runs with; allowed: {', '.join(MODES)}")
    os.environ["WANDB_MODE"] = mode
    return mode


def with_wandb_mode(campaign, mode: str | None):
    """The campaign with every trial's `wandb.mode` set to `mode` (unchanged when None)."""
    if mode is None or mode == campaign.config.wandb.mode:
        return campaign
    cfg = campaign.config.model_copy(update={"wandb": campaign.config.wandb.model_copy(update={"mode": mode})})
    trials = []
    for t in campaign.trials:
        trial = t.trial.model_copy(update={"wandb": t.trial.wandb.model_copy(update={"mode": mode})})
        trials.append(dataclasses.replace(t, trial=trial, config=trial.model_dump(mode="json")))
    return dataclasses.replace(campaign, config=cfg, trials=trials)


def job_env(storage_vars: list[str]) -> dict[str, str]:
    """The variables a submitted job carries: the ones `storage:` names, plus FORWARD, never a secret."""
    env = {}
    for k in (*FORWARD, *storage_vars):
        if k in os.environ:
            if SECRET.search(k):
                raise UserError(f"storage: names ${{{k}}}, which looks like a secret; a job's variables are shown "
                                "to anyone who can list jobs: use a variable that holds no secret")
            env[k] = os.environ[k]
    return env


def secrets_note(mode: str) -> str | None:
    """What to tell a user who submits an online campaign with the key only in this shell."""
    if mode == "online" and os.environ.get("WANDB_API_KEY"):
        return ("note: WANDB_API_KEY is not sent with the job (a job's variables are visible to anyone who can list "
                "jobs); the nodes read it from their own environment or a key file: see docs/deploy.md")
    return None
