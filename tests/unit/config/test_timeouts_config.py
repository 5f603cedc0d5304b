"""`timeouts:` in the trial config: defaults, validation, and the CLI's one-line error."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from orchestrator.config.sections import TimeoutsConfig
from orchestrator.config.trial import TrialConfig
from tests.unit.config.cli_errors import trial_error


def test_defaults_are_generous_and_adaptive():
    t = TrialConfig().timeouts
    assert t.generate is None and t.train is None and t.sync is None  # adaptive
    assert t.min_s >= 60 and t.first_s >= t.min_s and t.multiple >= 2 and t.collective < 1800


@pytest.mark.parametrize("bad", [{"generate": 0}, {"train": -1}, {"multiple": 0.5}, {"warmup": 0},
                                 {"min_s": 100, "first_s": 10}, {"score": 5}])
def test_bad_timeouts_are_refused(bad):
    with pytest.raises(ValidationError):
        TimeoutsConfig(**bad)


def test_cli_names_the_key_and_exits_2(tmp_path):
    path, lines = trial_error(tmp_path, "timeouts: {generate: 0}\n")
    assert len(lines) == 1 and str(path) in lines[0] and "timeouts.generate" in lines[0], lines
    assert "greater than 0" in lines[0]
