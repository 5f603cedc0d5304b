"""A campaign's `plugins.paths` reach every trial's config (absolute, from the campaign file), and `submit` names
them in the job's PYTHONPATH relative to the uploaded working dir."""

from __future__ import annotations

import textwrap

import pytest
import yaml

from orchestrator.campaign.expand import load_campaign
from orchestrator.config.errors import UserError
from orchestrator.jobs.submit import plugin_env
from tests.unit.tasks.test_task_plugins import TASK

PLUGIN = textwrap.dedent(TASK)  # the smallest task plugin (class Good), written once


def _campaign(directory, name, **extra):
    data = {"name": "p", "seeds": [0], "conditions": {"a": {}},
            "base": {"model": {"name": "tiny"}, "task": {"name": f"{name}:Good", "size": 6}}, **extra}
    path = directory / "c.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_paths_default_to_the_campaign_directory_and_reach_the_trials(tmp_path):
    (tmp_path / "tiny_plugin_a.py").write_text(PLUGIN)
    campaign = load_campaign(_campaign(tmp_path, "tiny_plugin_a"))
    t = campaign.trials[0]
    assert t.config["plugins"] == {"paths": [str(tmp_path)]}
    assert t.config["task"] == {"name": "tiny_plugin_a:Good", "size": 6}
    assert plugin_env(campaign, tmp_path / "c.yaml", tmp_path) == {"PYTHONPATH": ".:${PYTHONPATH}"}


def test_named_paths_are_relative_to_the_campaign_and_must_be_uploaded(tmp_path):
    (tmp_path / "plugins").mkdir()
    (tmp_path / "plugins" / "tiny_plugin_b.py").write_text(PLUGIN)
    campaign = load_campaign(_campaign(tmp_path, "tiny_plugin_b", plugins={"paths": ["plugins"]}))
    assert campaign.trials[0].config["plugins"] == {"paths": [str(tmp_path / "plugins")]}
    assert plugin_env(campaign, tmp_path / "c.yaml", tmp_path)["PYTHONPATH"].startswith("plugins:")
    with pytest.raises(UserError, match="plugins.paths: .* lies outside the working dir"):
        plugin_env(campaign, tmp_path / "c.yaml", tmp_path / "plugins" / "elsewhere")


def test_plugins_in_base_are_refused(tmp_path):
    path = _campaign(tmp_path, "x")
    data = yaml.safe_load(path.read_text())
    data["base"]["plugins"] = {"paths": ["."]}
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(UserError, match="base.plugins: set by the campaign"):
        load_campaign(path)


def test_a_campaign_whose_working_dir_moved_still_resumes(tmp_path):
    """A job's uploaded working dir lands elsewhere on each cluster start: the plugin paths change, the trials
    do not."""
    from orchestrator.tune.launch import check_same_campaign, write_campaign_file

    for where in ("first", "second"):
        (tmp_path / where).mkdir()
        (tmp_path / where / "tiny_plugin_c.py").write_text(PLUGIN)
    storage = {"storage": str(tmp_path / "store")}
    first = load_campaign(_campaign(tmp_path / "first", "tiny_plugin_c", **storage))
    write_campaign_file(first)
    moved = load_campaign(_campaign(tmp_path / "second", "tiny_plugin_c", **storage))
    assert moved.directory == first.directory and moved.trials[0].config["plugins"] != first.trials[0].config["plugins"]
    check_same_campaign(moved)
