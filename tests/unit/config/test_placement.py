"""resources.placement: the bundles each placement asks for (by hand), where each actor goes, the combinations
colocated refuses (one line, exit 2 from the CLI), and the campaign key that flips it."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from orchestrator.config.placement import (
    COLOCATED_SHARE,
    bundle_roles,
    bundles,
    learner_slots,
    trial_gpus,
    with_placement,
    worker_slots,
)
from orchestrator.config.trial import TrialConfig
from tests.unit.config.cli_errors import trial_error

RES = {"learner_ranks": 2, "learner_gpus": 1, "worker_gpus": 1, "worker_cpus": 2, "learner_cpus": 3,
       "driver_cpus": 0.5, "accelerator_type": "H100"}


def test_separate_and_colocated_bundles():
    h = {"accelerator_type:H100": 0.001}
    sep = TrialConfig(rollout={"num_workers": 1}, resources=RES)
    assert bundle_roles(sep) == ["driver", "rollout worker", "learner rank", "learner rank"]
    assert bundles(sep) == [{"CPU": 0.5}, {"CPU": 2, "GPU": 1, **h}, {"CPU": 3, "GPU": 1, **h},
                            {"CPU": 3, "GPU": 1, **h}]
    col = TrialConfig(resources={**RES, "placement": "colocated"})
    assert col.rollout.num_workers == 2  # one engine beside each rank
    assert bundle_roles(col) == ["driver"] + ["learner rank + rollout engine"] * 2
    assert bundles(col) == [{"CPU": 0.5}, {"CPU": 5, "GPU": 1, **h}, {"CPU": 5, "GPU": 1, **h}]
    assert (trial_gpus(sep), trial_gpus(col)) == (3, 2)
    # engine i and rank i share bundle 1 + i; their GPU fractions fill it exactly, so Ray gives both its one GPU
    w, r = worker_slots(col), learner_slots(col)
    assert [s.bundle for s in w] == [s.bundle for s in r] == [1, 2]
    assert all(a.gpus + b.gpus == 1 and a.gpus == COLOCATED_SHARE for a, b in zip(w, r, strict=True))
    assert all(a.cpus + b.cpus == 5 for a, b in zip(w, r, strict=True))
    assert [s.bundle for s in learner_slots(sep)] == [2, 3] and [s.bundle for s in worker_slots(sep)] == [1]


@pytest.mark.parametrize("over, words", [
    ({"rollout": {"mode": "one_step_off"}}, "one_step_off generates while the learner trains"),
    ({"resources": {"learner_gpus": 0.5}}, "needs resources.learner_gpus 1"),
    ({"rollout": {"num_workers": 3}}, "rollout.num_workers (3) must equal resources.learner_ranks (2)"),
    ({"rollout": {"engine": {"tensor_parallel_size": 2}}, "resources": {"worker_gpus": 2}},
     "tensor_parallel_size 1"),
])
def test_colocated_refuses(over, words):
    data = {"resources": {**RES, "placement": "colocated", **over.get("resources", {})},
            "rollout": over.get("rollout", {})}
    with pytest.raises(ValidationError, match=words.replace("(", r"\(").replace(")", r"\)")):
        TrialConfig.model_validate(data)


def test_one_step_off_under_colocated_is_one_line_exit_2(tmp_path):
    path, lines = trial_error(tmp_path, "rollout: {mode: one_step_off}\n"
                                        "resources: {learner_gpus: 1, placement: colocated}\n")
    assert len(lines) == 1 and lines[0].startswith(f"error: {path}: <root>: rollout.mode one_step_off")
    assert "resources.placement 'separate'" in lines[0]


def test_a_dumped_colocated_trial_validates_again():
    cfg = TrialConfig(resources={**RES, "placement": "colocated"})
    assert TrialConfig.model_validate(json.loads(cfg.model_dump_json())) == cfg


def test_with_placement_flips_both_ways():
    sep = TrialConfig(rollout={"num_workers": 1}, resources=RES)
    col = with_placement(sep, "colocated")
    assert col.resources.placement == "colocated" and col.rollout.num_workers == 2 and trial_gpus(col) == 2
    back = with_placement(col, "separate")
    assert back.resources.placement == "separate" and trial_gpus(back) == 4  # 2 engines, each on its own GPU
    assert with_placement(TrialConfig(), "colocated") is None  # a CPU trial has no GPU to share
    assert with_placement(TrialConfig(rollout={"mode": "one_step_off"}, resources=RES), "colocated") is None
