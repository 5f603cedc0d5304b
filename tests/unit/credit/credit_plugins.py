"""Plugins used by test_credit_plugins.py, named there by dotted path."""

import torch


def doubled(rewards):
    mean = sum(rewards) / len(rewards)
    return [2.0 * (r - mean) for r in rewards]


def scaled(rewards, params):
    return [params.get("scale", 1.0) * r for r in rewards]


def wrong_length(rewards):
    return [0.0]


def flat_transform(ctx):
    return ctx.episode_advantages[:, None] * ctx.mask * float(ctx.params.get("scale", 1.0))


class _Out:
    def __init__(self, token_advs):
        self.token_advs = token_advs


def list_transform(ctx):
    lengths = ctx.mask.sum(-1).tolist()
    return _Out([[float(a)] * n for a, n in zip(ctx.episode_advantages.tolist(), lengths, strict=False)])


def bad_shape_transform(ctx):
    return torch.zeros(1, 1)


def constant_algorithm(ctx):
    return torch.full(ctx.signals.shape, float(ctx.params.get("value", 3.0)))


def all_planning(pieces, grams=None):
    return [True] * len(pieces)


NOT_CALLABLE = 3
