"""Plugins by dotted path, and the config's validation."""

import pytest
import torch
from pydantic import ValidationError

from workers.credit import CreditConfig, CreditError, SepaConfig, compute_advantages, resolve_plugins

P = "tests.unit.credit.credit_plugins"
R = torch.tensor([[1.0, 0.0, 0.0], [0.0, 1.0, 1.0]])
SIG = torch.rand(2, 3, 4)
MASK = torch.tensor([[True] * 4, [True] * 2 + [False] * 2, [True] * 3 + [False]]).expand(2, 3, 4).clone()


def run(**kw):
    return compute_advantages(R, SIG, MASK, CreditConfig(**kw))


def test_advantage_plugin_one_and_two_arguments():
    out = run(advantage_mode=f"{P}.doubled").episode_advantages
    torch.testing.assert_close(out, 2 * (R - R.mean(-1, keepdim=True)))
    out = run(advantage_mode=f"{P}.scaled", advantage_params={"scale": 3.0}).episode_advantages
    torch.testing.assert_close(out, 3 * R)


def test_transform_plugin_tensor_and_lists():
    a = run(transform_mode=f"{P}.flat_transform", transform_params={"scale": 2.0}).token_advantages
    b = run(transform_mode=f"{P}.list_transform").token_advantages
    c = run(transform_mode="none").token_advantages
    torch.testing.assert_close(a, 2 * c)
    torch.testing.assert_close(b, c)


def test_algorithm_plugin_replaces_everything():
    res = run(algorithm_mode=f"{P}.constant_algorithm", algorithm_params={"value": 5.0}, transform_mode="gtpo")
    assert torch.all(res.token_advantages[MASK] == 5.0) and torch.all(res.token_advantages[~MASK] == 0)


@pytest.mark.parametrize(
    "kw, message",
    [
        ({"advantage_mode": "no_such_module_xyz.fn"}, "advantage_mode: cannot import module 'no_such_module_xyz'"),
        ({"advantage_mode": f"{P}.missing"}, "has no attribute 'missing'"),
        ({"advantage_mode": f"{P}.NOT_CALLABLE"}, "is not callable"),
        ({"advantage_mode": f"{P}.wrong_length"}, "returned 1 values for a group of 3"),
        ({"transform_mode": f"{P}.bad_shape_transform"}, r"transform_mode: returned shape \(1, 1\), expected \(6, 4\)"),
        ({"algorithm_mode": "os.path.nope"}, "algorithm_mode: module 'os.path' has no attribute 'nope'"),
    ],
)
def test_plugin_errors_are_clear(kw, message):
    with pytest.raises(CreditError, match=message):
        run(**kw)


def test_resolve_plugins_fails_early():
    found = resolve_plugins(CreditConfig(advantage_mode=f"{P}.doubled", planning_detector=f"{P}.all_planning"))
    assert set(found) == {"advantage_mode", "planning_detector"}
    with pytest.raises(CreditError, match="planning_detector"):
        resolve_plugins(CreditConfig(planning_detector="nowhere_xyz.detect"))


@pytest.mark.parametrize(
    "kw, message",
    [
        ({"advantage_mode": "ppo"}, "grpo, maxrl, gae or a dotted path"),
        ({"transform_mode": "gtpo_foo"}, "none, gtpo, gtpo_hicra, gtpo_sepa, sepa_gtpo_hicra"),
        ({"transform_mode": "gtpo_sepa"}, "`sepa:` settings"),
        ({"transform_mode": ["gtpo", "gtpo"]}, "must not repeat"),
        ({"transform_mode": ["gtpo", "kl"]}, "sepa"),
        ({"uncertainty_kind": "renyi"}, "surprisal"),
        ({"gtpo_beta": -1}, "greater than or equal"),
        ({"betta": 0.1}, "Extra inputs are not permitted"),
    ],
)
def test_config_rejects_bad_values(kw, message):
    with pytest.raises(ValidationError, match=message):
        CreditConfig(**kw)


def test_named_modes_map_to_stage_lists():
    sepa = SepaConfig()
    assert CreditConfig(transform_mode="gtpo_sepa", sepa=sepa).stages == ("sepa", "gtpo")
    assert CreditConfig(transform_mode="sepa_gtpo_hicra", sepa=sepa).stages == ("sepa", "gtpo", "hicra")
    assert CreditConfig(transform_mode=["hicra", "gtpo"]).stages == ("hicra", "gtpo")
    assert CreditConfig(transform_mode="gtpo_hicra").needs_planning
    assert not CreditConfig(transform_mode="gtpo").needs_planning
