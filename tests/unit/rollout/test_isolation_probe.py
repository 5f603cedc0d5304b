"""The pool engine's isolation probe in pieces (workers/rollout/isolation.py, admission.py): which positions it
scores, how it compares the two scorings, and the admission rule that lets it run only on an idle engine. The
probe on the real engine: tests/integration/rollout/test_shared_engine.py."""

from __future__ import annotations

from collections import deque
from types import SimpleNamespace

from hypothesis import given
from hypothesis import strategies as st

from workers.rollout.admission import admissible
from workers.rollout.isolation import POSITIONS, compare, engine_facts, positions


@given(st.integers(0, 5000))
def test_positions_are_distinct_in_range_and_end_at_the_last_token(length):
    ts = positions(length)
    assert ts == sorted(set(ts)) and all(1 <= t < length for t in ts)
    assert len(ts) == min(POSITIONS, max(length - 1, 0))  # a short sequence: every position
    assert (ts[-1] == length - 1 and ts[0] == 1) if length >= 2 else ts == []


def test_compare_names_the_largest_difference_and_identity_is_exact():
    alone = [[-1.0, -2.0], [-0.5]]
    same = compare(alone, [[-1.0, -2.0], [-0.5]], batch=9)
    assert (same.identical, same.max_abs_diff, same.tokens, same.batch) == (True, 0.0, 3, 9)
    assert abs(same.mean_logprob - (-3.5 / 3)) < 1e-12
    moved = compare(alone, [[-1.0, -2.0 + 2 ** -40], [-0.53]], batch=9)
    assert not moved.identical and abs(moved.max_abs_diff - 0.03) < 1e-12  # one ulp-scale change also counts
    assert not compare([[-1.0]], [[-1.0 + 2 ** -40]], batch=2).identical


def _call(slot=None, run=None, drain=False):
    return SimpleNamespace(slot=slot, run=run, drain=drain)


def test_a_draining_call_waits_for_the_engine_to_be_idle_and_holds_what_comes_after_it():
    gen0, probe, gen1 = _call(0), _call(run=lambda: None, drain=True), _call(1)
    taken, left, stop = admissible(deque([gen0, probe, gen1]), busy=set(), running=False)
    assert (taken, list(left), stop) == ([gen0], [probe, gen1], False)  # gen0 starts; the probe is not at the head
    taken, left, _ = admissible(left, busy={0}, running=True)
    assert (taken, list(left)) == ([], [probe, gen1])  # gen0's requests in flight: nothing starts, gen1 waits too
    taken, left, _ = admissible(left, busy=set(), running=False)
    assert (taken, list(left)) == ([probe], [gen1])  # idle: the probe runs alone, gen1 next
    hold = _call(run=lambda: None)  # a call of no slot that does not drain starts at the head at once
    assert admissible(deque([hold]), busy={0}, running=True)[0] == [hold]
    assert admissible(deque([None]), busy={0}, running=True)[2] is False  # close waits for requests in flight
    assert admissible(deque([None]), busy=set(), running=False)[2] is True


def test_the_engine_says_whether_its_kernels_are_batch_invariant_from_its_own_environment(monkeypatch):
    monkeypatch.delenv("VLLM_BATCH_INVARIANT", raising=False)
    assert engine_facts()["batch_invariant"] is False
    monkeypatch.setenv("VLLM_BATCH_INVARIANT", "1")  # orchestrator/config/pool_key.py:engine_env sets it so
    assert engine_facts()["batch_invariant"] is True
    monkeypatch.setenv("VLLM_BATCH_INVARIANT", "0")
    assert engine_facts()["batch_invariant"] is False
