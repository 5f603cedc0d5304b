"""Where a campaign's storage may lie: never inside the working dir a Ray job uploads afresh each time."""

from __future__ import annotations

from pathlib import Path

from orchestrator import storage as store
from orchestrator.campaign.schema import Campaign
from orchestrator.config.errors import UserError


def refuse_storage_inside(campaign: Campaign, working_dir: Path) -> None:
    """A job's working dir is uploaded afresh for every job: storage inside it could never be resumed."""
    if not store.is_uri(campaign.storage) and Path(campaign.storage).is_relative_to(working_dir):
        raise UserError(f"{campaign.source}: storage: {campaign.storage} lies inside the uploaded working dir, "
                        "which is new for every job (a re-submit could not resume); use an absolute path or a URI")
