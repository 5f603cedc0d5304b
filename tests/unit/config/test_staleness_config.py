"""The staleness settings (`rollout.mode: async`, docs/guides/staleness.md): what sync and one_step_off map to,
the correction's defaults, and each refusal before launch as one line (exit 2 from the CLI)."""

from __future__ import annotations

import pytest

from orchestrator.config.errors import UserError, validate
from orchestrator.config.trial import TrialConfig
from tests.unit.config.cli_errors import trial_error


@pytest.mark.parametrize("rollout, bound, correction, cap", [
    ({}, 0, "none", None),
    ({"mode": "one_step_off"}, 1, "tis", 2.0),
    ({"mode": "async"}, 1, "tis", 2.0),
    ({"mode": "async", "max_staleness": 0}, 0, "none", None),
    ({"mode": "async", "max_staleness": 4, "correction": "decoupled", "tis_cap": 3.0}, 4, "decoupled", 3.0),
    ({"tis_cap": 1.5}, 0, "tis", 1.5),  # a sync trial's vLLM / learner mismatch, as before
])
def test_modes_map_to_a_bound_and_a_correction(rollout, bound, correction, cap):
    ro = TrialConfig(rollout=rollout).rollout
    assert (ro.staleness_bound, ro.max_staleness, ro.correction, ro.tis_cap) == (bound, bound, correction, cap)
    again = TrialConfig.model_validate(TrialConfig(rollout=rollout).model_dump(mode="json")).rollout
    assert again == ro  # the dumped config (W&B, checkpoint) reads back as the same trial


@pytest.mark.parametrize("over, needle", [
    ({"rollout": {"mode": "async", "max_staleness": -1}}, "rollout.max_staleness"),
    ({"rollout": {"max_staleness": 2}}, "max_staleness 2 needs rollout.mode 'async'"),
    ({"rollout": {"mode": "one_step_off", "admission": "discard"}}, "admission 'discard' needs rollout.mode 'async'"),
    ({"rollout": {"mode": "async", "correction": "none", "tis_cap": 2.0}}, "with correction 'none' nothing reads it"),
    ({"rollout": {"mode": "async", "correction": "decoupled"}, "learner": {"old_logprobs": "rollout"}},
     "rollout.correction 'decoupled' (or rejection, or its metrics) compares"),
    ({"rollout": {"mode": "async", "max_staleness": 0, "correction_metrics_only": True},
      "learner": {"old_logprobs": "rollout"}}, "needs learner.old_logprobs 'recompute'"),
    ({"rollout": {"mode": "async", "max_staleness": 0, "rejection": {"measure": "k5", "threshold": 1}}},
     "rollout.rejection.measure"),
    ({"rollout": {"mode": "async", "rejection": {"measure": "k1", "threshold": 0}}}, "rollout.rejection.threshold"),
    ({"rollout": {"mode": "async", "admission": "late"}}, "rollout.admission"),
    ({"rollout": {"mode": "one_step_off", "decode_per_step": 8}}, "decode_per_step admits groups as they complete"),
    ({"rollout": {"mode": "async", "decode_per_step": 0}}, "rollout.decode_per_step"),
    ({"rollout": {"mode": "async", "admission": "discard", "decode_per_step": 8, "fill": {"groups": 4}}},
     "rollout.fill chooses a step's groups"),
    ({"model": {"name": "tiny-agent"}, "task": {"name": "frozen_lake"},
      "rollout": {"mode": "async", "admission": "discard", "decode_per_step": 8}},
     "rollout.decode_per_step clocks single-turn completions"),
])
def test_refusals_are_one_line(over, needle):
    with pytest.raises(UserError) as err:
        validate(TrialConfig, over, "bad.yaml")
    text = str(err.value)
    assert "\n" not in text and text.startswith("bad.yaml: ") and needle in text, text


def test_a_correction_on_assistant_segments_is_refused():
    with pytest.raises(ValueError, match="vLLM never sampled"):
        TrialConfig(model={"name": "tiny-agent"}, task={"name": "frozen_lake"},
                    learner={"loss_mask": "assistant_segments"},
                    rollout={"mode": "async", "max_staleness": 0, "correction_metrics_only": True})


def test_async_under_colocated_is_one_line_exit_2(tmp_path):
    path, lines = trial_error(tmp_path, "rollout: {mode: async, max_staleness: 2}\n"
                                        "resources: {learner_gpus: 1, placement: colocated}\n")
    assert len(lines) == 1 and lines[0].startswith(f"error: {path}: <root>: rollout.mode async")
    assert "resources.placement 'separate'" in lines[0]


def test_decode_per_step_under_async_reads_back():
    ro = TrialConfig(rollout={"mode": "async", "admission": "discard", "decode_per_step": 8}).rollout
    assert ro.decode_per_step == 8 and TrialConfig().rollout.decode_per_step is None
    again = TrialConfig.model_validate(TrialConfig(rollout={"mode": "async", "decode_per_step": 8}).model_dump(
        mode="json")).rollout
    assert again.decode_per_step == 8
