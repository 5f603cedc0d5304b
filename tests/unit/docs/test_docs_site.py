"""The docs site builds in strict mode (a broken link, anchor or nav entry fails), and its generated settings
reference lists every field of the campaign and trial models (walked here on their own, nested models included)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import typing
from pathlib import Path

import pytest
from pydantic import BaseModel

ROOT = Path(__file__).resolve().parents[3]
MKDOCS = shutil.which("mkdocs", path=str(Path(sys.executable).parent)) or shutil.which("mkdocs")


def build(tmp: Path, config: Path = ROOT / "mkdocs.yml") -> subprocess.CompletedProcess:
    return subprocess.run([MKDOCS, "build", "--strict", "-f", str(config), "-d", str(tmp / "site")],
                          cwd=config.parent, capture_output=True, text=True, timeout=120,
                          env={"NO_MKDOCS_2_WARNING": "1", "PATH": "/usr/bin:/bin", "HOME": str(tmp),
                               "PYTHONPATH": str(ROOT)})


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    if MKDOCS is None:
        pytest.fail("mkdocs is not installed: it is in the dev extra (make setup)")
    tmp = tmp_path_factory.mktemp("docs")
    done = build(tmp)
    assert done.returncode == 0, done.stdout + done.stderr
    return tmp / "site"


def test_strict_build(site: Path):
    for page in ("index.html", "reference/settings.html", "reference/cli.html", "reference/credit.html",
                 "measurements.html", "architecture.html", "deploy.html"):
        assert (site / page).is_file(), page


def test_broken_link_fails_the_build(tmp_path: Path):
    """The same build on a copy of the sources with one link broken must fail (strict is really on)."""
    copy = tmp_path / "repo"
    shutil.copytree(ROOT / "docs", copy / "docs")
    shutil.copy(ROOT / "mkdocs.yml", copy / "mkdocs.yml")
    page = copy / "docs" / "index.md"
    page.write_text(page.read_text() + "\n[gone](guides/no-such-page.md)\n")
    done = build(tmp_path, copy / "mkdocs.yml")
    assert done.returncode != 0 and "no-such-page.md" in done.stdout + done.stderr


def model_keys(model: type[BaseModel], prefix: str = "") -> set[str]:
    """Every dotted key of `model`, nested models walked (X | None, list[X], dict[str, X], unions)."""
    keys: set[str] = set()
    for name, field in model.model_fields.items():
        key = f"{prefix}{name}"
        keys.add(key)
        for sub in _held(field.annotation):
            keys |= model_keys(sub, key + ".")
    return keys


def _held(ann) -> list[type[BaseModel]]:
    if isinstance(ann, type) and issubclass(ann, BaseModel):
        return [ann]
    return [m for a in typing.get_args(ann) for m in _held(a)]


def page_keys(html: str, section: str) -> set[str]:
    """The dotted keys in the first column of the settings page's tables, within one section."""
    text = html.split(f'id="{section}"', 1)[1]
    text = re.split(r'<h2 id="', text, maxsplit=1)[0]
    return set(re.findall(r"<tr>\s*<td><code>([\w.]+)</code></td>", text))


def test_settings_reference_lists_every_field(site: Path):
    from orchestrator.campaign.schema import CampaignConfig
    from orchestrator.config.trial import TrialConfig
    from workers.tasks.config import BUILTIN
    from workers.tasks.mix import MixConfig

    html = (site / "reference" / "settings.html").read_text()
    trial = model_keys(TrialConfig)
    for task in (*BUILTIN, MixConfig):  # `task` is a union chosen by its name: every variant's keys
        trial |= model_keys(task, "task.")
    shown = page_keys(html, "trial-settings")
    assert trial - shown == set(), f"trial settings missing from the page: {sorted(trial - shown)}"
    assert shown - trial == set(), f"keys on the page that are no trial setting: {sorted(shown - trial)}"
    campaign = model_keys(CampaignConfig)
    shown = page_keys(html, "campaign-settings")
    assert campaign - shown == set(), f"campaign settings missing from the page: {sorted(campaign - shown)}"
    assert shown - campaign == set(), f"keys on the page that are no campaign setting: {sorted(shown - campaign)}"


def test_commands_reference_lists_every_command(site: Path):
    html = (site / "reference" / "cli.html").read_text()
    for command in ("expand", "plan", "run", "status", "submit", "report", "samples", "export", "eval",
                    "dashboard", "doctor", "trial"):
        assert f'id="{command}"' in html, command
    assert "--compare-placement" in html and "--wandb-mode" in html
