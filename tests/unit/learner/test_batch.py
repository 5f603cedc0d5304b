"""workers/learner/batch.py: collation, the turns of a loss mask, PPO mini-batches and token-budget micro-batches,
property-tested against plain-Python references."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from workers.learner.batch import collate, micro_batches, mini_batches, sampled_runs
from workers.learner.config import OptimConfig
from workers.learner.inputs import LearnerBatch


def _batch(prompt_lens: list[int], response_lens: list[int], group: int = 1) -> LearnerBatch:
    prompts = [[5] * p for p in prompt_lens]
    responses = [[7] * r for r in response_lens]
    return LearnerBatch(prompt_ids=prompts, response_ids=responses,
                        loss_mask=[[i % 3 != 2 for i in range(r)] for r in response_lens],
                        rollout_logprobs=[[-0.5] * r for r in response_lens],
                        rewards=[[1.0] * group for _ in range(len(prompts) // group)], temperature=1.0)


def test_collate_pads_and_zeroes_unsampled_logprobs():
    b = collate(_batch([2, 5], [3, 1]), pad_id=0)
    assert b.seqs.tolist() == [[5, 5, 7, 7, 7, 0], [5, 5, 5, 5, 5, 7]]
    assert b.attn.tolist() == [[1, 1, 1, 1, 1, 0], [1, 1, 1, 1, 1, 1]]
    assert b.start.tolist() == [2, 5]
    assert b.mask.tolist() == [[True, True, False], [True, False, False]]
    assert b.old_lp.tolist() == [[-0.5, -0.5, 0.0], [-0.5, 0.0, 0.0]]
    assert (b.size, b.t, b.n_groups, b.group) == (2, 3, 2, 1)


def test_collate_keeps_the_sampled_ids_apart_from_a_wider_loss_mask():
    """learner.loss_mask assistant_segments: the loss covers forced tokens too; `sampled` marks where vLLM's
    log-probs are (None: the loss mask)."""
    base = _batch([2, 5], [3, 1])
    assert collate(base, pad_id=0).sampled.tolist() == collate(base, pad_id=0).mask.tolist()
    wide = dataclasses.replace(base, loss_mask=[[True, True, True], [True]], sampled_mask=[[False, True, False], [True]])
    b = collate(wide, pad_id=0)
    assert b.mask.tolist() == [[True, True, True], [True, False, False]]
    assert b.sampled.tolist() == [[False, True, False], [True, False, False]]
    with pytest.raises(ValueError, match="one flag per response id"):
        collate(dataclasses.replace(wide, sampled_mask=[[True], [True]]), pad_id=0)


@pytest.mark.parametrize("key, bad, msg", [
    ("loss_mask", [[True], [True]], "a response of 3 ids has 1 mask flags"),
    ("rollout_logprobs", [[-1.0] * 3], "one row per sequence"),
    ("rewards", [[1.0, 1.0, 1.0]], "rewards must be [N][G] with N*G = 2"),
])
def test_collate_refuses_rows_that_do_not_line_up(key, bad, msg):
    batch = dataclasses.replace(_batch([2, 5], [3, 1]), **{key: bad})
    with pytest.raises(ValueError) as exc:
        collate(batch, pad_id=0)
    assert msg in str(exc.value)


@given(st.lists(st.booleans(), max_size=40))
def test_sampled_runs_cover_exactly_the_true_flags(flags):
    runs = sampled_runs(flags)
    covered = [False] * len(flags)
    for s, e in runs:
        assert s < e and all(flags[s:e]) and not covered[s]
        covered[s:e] = [True] * (e - s)
        assert s == 0 or not flags[s - 1]  # maximal on the left
        assert e == len(flags) or not flags[e]  # and on the right
    assert covered == list(flags)
    assert runs == sorted(runs)


@given(size=st.integers(1, 40), mbs=st.one_of(st.none(), st.integers(1, 50)), epochs=st.integers(1, 4),
       seed=st.integers(0, 10), step=st.integers(0, 50))
def test_mini_batches_are_epochs_of_seeded_permutations(size, mbs, epochs, seed, step):
    optim = OptimConfig(mini_batch_size=mbs, ppo_epochs=epochs)
    chunks = mini_batches(size, optim, seed, step)
    assert [c.tolist() for c in chunks] == [c.tolist() for c in mini_batches(size, optim, seed, step)]
    flat = torch.cat(chunks).tolist()
    assert len(flat) == epochs * size
    for e in range(epochs):  # each epoch visits every row once
        assert sorted(flat[e * size:(e + 1) * size]) == list(range(size))
    width = mbs or size
    assert all(len(c) <= width for c in chunks)
    if (mbs is None or mbs >= size) and epochs == 1:
        assert flat == list(range(size))  # the default: the batch in order, one optimizer step


def test_mini_batch_order_depends_on_seed_and_step():
    optim = OptimConfig(mini_batch_size=4, ppo_epochs=1)
    orders = {tuple(torch.cat(mini_batches(32, optim, seed, step)).tolist()) for seed in (0, 1) for step in (0, 1)}
    assert len(orders) == 4


@settings(max_examples=200)
@given(lengths=st.lists(st.tuples(st.integers(1, 12), st.integers(1, 12)), min_size=1, max_size=24),
       budget=st.integers(1, 80), pick=st.integers(0, 2**16))
def test_token_budget_packing(lengths, budget, pick):
    b = collate(_batch([p for p, _ in lengths], [r for _, r in lengths]), pad_id=0)
    rows = torch.randperm(b.size, generator=torch.Generator().manual_seed(pick))[: max(1, b.size - pick % 3)]
    parts = list(micro_batches(b, rows, OptimConfig(max_tokens_per_micro_batch=budget, micro_batch_size=1)))
    assert sorted(torch.cat([p[-1] for p in parts]).tolist()) == sorted(rows.tolist())  # each row exactly once
    for seqs, attn, start, t, mask, r in parts:
        assert torch.equal(seqs, b.seqs[r, : seqs.shape[1]]) and torch.equal(mask, b.mask[r]) and t == b.t
        assert torch.equal(start, b.start[r]) and torch.equal(attn, b.attn[r, : seqs.shape[1]])
        longest = int(b.attn[r].sum(-1).max())
        assert seqs.shape[1] == max(longest, 2)  # columns cut to the longest sequence
        assert len(r) == 1 or len(r) * longest <= budget  # within budget, or a long sequence alone


def test_token_budget_splits_a_batch_it_cannot_hold_whole():
    b = collate(_batch([4] * 8, [2, 4, 6, 8, 2, 4, 6, 8]), pad_id=0)  # 6..12 tokens per sequence
    parts = list(micro_batches(b, torch.arange(8), OptimConfig(max_tokens_per_micro_batch=30, micro_batch_size=1)))
    # longest first, a part's width is its first row: 12 12 | 10 10 8 | 8 6 6 (3 x 12 and 4 x 10 exceed 30)
    assert [p[-1].tolist() for p in parts] == [[3, 7], [2, 6, 1], [5, 0, 4]]
    by_rows = list(micro_batches(b, torch.arange(8), OptimConfig(micro_batch_size=3)))
    assert [p[-1].tolist() for p in by_rows] == [[0, 1, 2], [3, 4, 5], [6, 7]]
