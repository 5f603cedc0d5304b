"""Which variables a submitted job may carry (the W&B mode itself: orchestrator/tracking/mode.py).

A job's runtime_env `env_vars` are stored with the job and shown to anyone who can list jobs, so `submit`
forwards no secret (API keys, tokens) and nothing that only means something on this machine (`HF_HOME`, paths
into this home directory). Online W&B takes its key on the nodes: `WANDB_API_KEY` in the node's environment, or
a file (`wandb.api_key_file`, or `WANDB_API_KEY_FILE` set on the node, e.g. a mounted Kubernetes Secret).
"""

from __future__ import annotations

import os
import re

from orchestrator.config.errors import UserError

# forwarded when set here: they mean the same on the cluster and hold no secret
FORWARD = ("WANDB_MODE", "WANDB_PROJECT", "WANDB_ENTITY", "VLLM_CPU_KVCACHE_SPACE", "VLLM_LOGGING_LEVEL")
SECRET = re.compile(r"(?i)(KEY|TOKEN|SECRET|PASSWORD|CREDENTIAL)")






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
