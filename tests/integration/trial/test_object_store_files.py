"""The trial driver's checkpoint pieces in the object store (orchestrator/trial/actors/learner_group.py:ObjectStoreFiles): any
byte range reads back exactly as slicing the file would, across piece boundaries, and the object pickles without
its cache (it travels to every learner rank)."""

from __future__ import annotations

import pickle

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.trial.actors.learner_group import ObjectStoreFiles

pytestmark = pytest.mark.integration

FILES = {"a.distcp": bytes(range(256)) * 3 + b"tail", "empty": b"", ".metadata": b"m" * 10}


@pytest.fixture(scope="module")
def store(ray_local) -> ObjectStoreFiles:
    return ObjectStoreFiles(FILES, piece=100)


def test_sizes_and_membership(store):
    assert {n: store.size(n) for n in FILES} == {n: len(d) for n, d in FILES.items()}
    assert "a.distcp" in store and "b.distcp" not in store
    assert len(store.pieces["a.distcp"]) == 8 and store.read("empty") == b"" and store.read(".metadata") == b"m" * 10


@settings(max_examples=60, deadline=None)
@given(start=st.integers(0, 800), length=st.integers(0, 400))
def test_a_range_reads_as_slicing(store, start, length):
    data = FILES["a.distcp"]
    assert store.read("a.distcp", start, start + length) == data[start:start + length]
    again = pickle.loads(pickle.dumps(store))  # what a rank receives: the refs, no cached piece
    assert again._last is None and again.read("a.distcp", start, start + length) == data[start:start + length]
