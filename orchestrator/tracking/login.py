"""W&B login and where a campaign's views and reports are saved (entity / project)."""

from __future__ import annotations

import os
from pathlib import Path

from orchestrator import storage as store
from orchestrator.campaign.schema import Campaign
from orchestrator.config.errors import UserError


def wandb_login(campaign: Campaign) -> None:
    """The API key for the library's `wandb.Api()`: the environment's, else `wandb.api_key_file`, else what
    `wandb login` stored; none of them: one line naming the campaign file."""
    key_file = campaign.config.wandb.api_key_file
    if os.environ.get("WANDB_API_KEY"):
        return
    if key_file:
        try:
            os.environ["WANDB_API_KEY"] = Path(store.expand(key_file)).read_text().strip()
        except OSError as exc:
            raise UserError(f"{campaign.source}: wandb.api_key_file: cannot read {key_file} ({exc})") from None
        return
    import wandb

    try:
        wandb.Api()
    except wandb.errors.UsageError:
        raise UserError(f"{campaign.source}: no W&B API key: set WANDB_API_KEY, `wandb.api_key_file`, or run "
                        "`wandb login` (or use --dry-run)") from None


def where_to_save(campaign: Campaign, entity: str | None, project: str | None, *, online: bool) -> tuple[str, str]:
    """Entity and project: the flags, else the campaign's `wandb:`, else (online) the key's default entity."""
    w = campaign.config.wandb
    entity, project = entity or w.entity, project or w.project
    if not entity and online:
        import wandb

        entity = wandb.Api().default_entity
    return entity or "", project
