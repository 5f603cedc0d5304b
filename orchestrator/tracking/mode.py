"""What a campaign's W&B mode is on this run.

`WANDB_MODE` (or `--wandb-mode` on `run` / `submit`, which sets it) overrides the campaign file's `wandb.mode`: a
campaign written for a laptop (offline) streams online on a cluster without editing the file. Changing the mode
does not change the campaign: a resume with another mode is allowed (tune/same_config.py).
"""

from __future__ import annotations

import dataclasses
import os

from orchestrator.config.errors import UserError

MODES = ("offline", "online", "disabled")


ALIASES = {"dryrun": "offline", "run": "online"}  # wandb's own older names


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
