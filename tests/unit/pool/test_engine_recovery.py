"""A pool engine's restart costs a trial only time (orchestrator/trial/actors/engine_recovery.py): the trial's engine
client (shared.py:PoolEnginesClient), calling a real SharedRolloutWorker over the fake vLLM engine of
tests/unit/rollout/test_shared_batching.py through a stand-in for a Ray actor handle, meets the engine dying under its
call, or restarted between two calls (its slot not open: workers/fence.py:SlotNotOpen); it waits for the engine,
reopens its slot under its lease with the adapter it last pushed and redoes the call, which gives what the unfaulted
engine gives. The fence still applies (an earlier holder reopens nothing), an engine that never comes back is a
clear error, and any other error is not redone."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from ray.exceptions import ActorDiedError, ActorUnavailableError

import orchestrator.trial.actors.calls as calls_mod
import workers.rollout.shared as shared
from orchestrator.pool.slots import SlotTable
from orchestrator.trial.actors.engine_recovery import EngineLost
from orchestrator.trial.actors.shared import PoolEnginesClient
from tests.unit.rollout.test_shared_batching import FakeLLM, _req, _update, worker  # noqa: F401 - `worker`: a fixture
from workers.fence import SlotNotOpen, StaleLease


class Ref:
    def __init__(self, value=None, error: BaseException | None = None):
        self.value, self.error = value, error


class Handle:
    """A Ray actor handle's face over a local object: `h.method.remote(*args)` runs the method now and its ref holds
    the result or the error; while `dead`, every call fails as a dead actor's does."""

    def __init__(self, obj):
        self.obj, self.dead, self.calls = obj, False, []

    def __getattr__(self, name: str):
        return SimpleNamespace(remote=lambda *a, **k: self._run(name, a, k))

    def _run(self, name: str, args, kwargs) -> Ref:
        self.calls.append(name)
        if self.dead:
            return Ref(error=ActorDiedError())
        try:
            return Ref(getattr(self.obj, name)(*args, **kwargs))
        except Exception as e:  # noqa: BLE001 - the ref carries it, as Ray's does
            return Ref(error=e)


class Calls(calls_mod.Calls):
    """The real `Calls` (its deadlines, its hang path) with `get` over refs that are all done."""

    def get(self, refs, phase, actors):
        many = isinstance(refs, list)
        for r in refs if many else [refs]:
            if r.error is not None:
                raise r.error
        return [r.value for r in refs] if many else refs.value


def _restarted(monkeypatch) -> shared.SharedRolloutWorker:
    """A new process of the engine: a new engine, every slot empty, its fence knowing no lease."""
    monkeypatch.setattr(shared, "open_engine", lambda model, s, args: (FakeLLM(), dict(args), True))
    return shared.SharedRolloutWorker("model", 3)


def _back_as(handle: Handle, fresh) -> object:
    """An engine's `ready` check that finds it back as the restarted process `fresh`."""

    def ready(engine, timeout):
        handle.obj, handle.dead = fresh, False
        return True

    return ready


def _client(w, lease, ready=None) -> tuple[PoolEnginesClient, Handle]:
    handle = Handle(w)
    client = PoolEnginesClient([handle], lease, Calls(), wait_s=2.0)
    client.recovery.poll_s = 0.01
    if ready is not None:
        client.recovery.ready = ready
    return client, handle


def _sampled(gens) -> list:
    """What was sampled: (first prompt token, seed) per completion, and the adapter version (the fake engine's
    tokens also carry the LoRA id, a number each engine process hands out anew)."""
    return [([(c.token_ids[0], c.token_ids[2]) for group in g.completions for c in group], g.adapter_version)
            for g in gens]


def _opened(client: PoolEnginesClient, version: int) -> None:
    client.drop()
    client.load_policy(_update(0))
    client.load_policy(_update(version))


def test_an_engine_dying_under_a_generate_is_waited_for_reopened_with_the_last_adapter_and_the_call_redone(
        worker, monkeypatch):  # noqa: F811 - the fixture
    w, _ = worker
    lease = SlotTable(3).acquire("A_s0")
    client, handle = _client(w, lease)
    _opened(client, 3)
    unfaulted = _sampled(client.generate([[10], [11]], _req(5), [5], "generate"))
    assert unfaulted == [([(10, 5), (11, 6)], 3)]

    handle.dead = True  # the engine dies under the next call; it is back when it answers `ready` again
    fresh = _restarted(monkeypatch)

    def ready(engine, timeout):
        if handle.calls.count("ready") < 3:
            raise ActorUnavailableError("restarting", None)
        handle.obj, handle.dead = fresh, False
        return True

    client.recovery.ready = lambda e, t: (handle.calls.append("ready"), ready(e, t))[1]
    assert _sampled(client.generate([[10], [11]], _req(5), [5], "generate")) == unfaulted
    assert fresh.adapter_version(lease) == 3  # the adapter the trial last pushed, back in its slot
    assert [r["version"] for r in client.recovery.reopened] == [3]
    fresh.close()


def test_an_engine_dead_while_the_trial_connects_is_waited_for_and_the_slot_opened_on_its_new_process(
        worker, monkeypatch):  # noqa: F811 - the fixture
    """connect's first engine call (the slot's drop, orchestrator/trial/actors/shared.py:connect) meets an engine
    killed while the trial was starting: it waits for the engine and opens the slot there, and the trial goes on
    (seen under load in the engine-fault campaign: the trial failed with ActorUnavailableError before this)."""
    w, _ = worker
    lease = SlotTable(3).acquire("A_s0")
    client, handle = _client(w, lease)
    fresh = _restarted(monkeypatch)
    handle.dead = True
    client.recovery.ready = _back_as(handle, fresh)
    client.drop()
    client.load_policy(_update(0))
    client.load_policy(_update(2))
    assert fresh.adapter_version(lease) == 2 and handle.obj is fresh
    assert [r["version"] for r in client.recovery.reopened] == [None]  # reopened before any adapter was pushed
    assert _sampled(client.generate([[12]], _req(9), [9], "generate"))[0][1] == 2
    fresh.close()


def test_an_engine_restarted_between_two_calls_refuses_the_slot_and_the_client_reopens_it(worker, monkeypatch):  # noqa: F811
    w, _ = worker
    lease = SlotTable(3).acquire("A_s0")
    client, handle = _client(w, lease, ready=lambda e, t: True)
    _opened(client, 2)
    unfaulted = _sampled(client.generate([[12]], _req(9), [9], "generate"))
    handle.obj = fresh = _restarted(monkeypatch)  # it restarted while the trial trained
    with pytest.raises(SlotNotOpen, match="slot 0 is not open for trial A_s0 at epoch 1 in this process"):
        fresh.generate(lease, [[12]], _req(9))  # what the client meets, and answers:
    assert _sampled(client.generate([[12]], _req(9), [9], "generate")) == unfaulted
    # health reads /proc of the engine's process: stand in for it, so that the pytest process's own zombie children
    # (earlier tests' engines) do not decide this test
    answer = {"pid": 1, "ok": True, "children": []}
    monkeypatch.setattr(shared, "process_health", lambda: dict(answer))
    handle.calls.clear()
    client.health()  # answered by the new process, in one call
    assert handle.calls == ["health"]
    answer.update(ok=False, reason="process 7 (EngineCore) is stopped")
    with pytest.raises(calls_mod.PhaseTimeout, match="process 7 \\(EngineCore\\) is stopped"):
        client.health()
    fresh.close()


def test_the_fence_still_applies_an_earlier_holder_reopens_nothing(worker, monkeypatch):  # noqa: F811
    w, _ = worker
    table = SlotTable(1)
    old = table.acquire("A_s0")
    table.release("A_s0")
    new = table.acquire("B_s0")
    fresh = _restarted(monkeypatch)
    a, _ = _client(fresh, old, ready=lambda e, t: True)
    b, _ = _client(fresh, new, ready=lambda e, t: True)
    _opened(b, 4)  # B holds the slot on the restarted engine
    a.recovery.current = _update(9)  # A, a late holder, last pushed its v9
    with pytest.raises(StaleLease, match="slot 0: call of trial A_s0 at epoch 1 refused, the slot is at epoch 2"):
        a.generate([[13]], _req(1), [1], "generate")
    assert fresh.adapter_version(new) == 4  # B's adapter untouched
    # a newer holder's call that never opened the slot on this process is refused too, not served with A's adapter
    fence_only = SlotTable(1)
    first = fence_only.acquire("C_s0")
    fence_only.release("C_s0")
    second = fence_only.acquire("D_s0")
    w.drop(first)
    w.load_policy(first, _update(1))
    with pytest.raises(SlotNotOpen, match="opened at epoch 1"):
        w.generate(second, [[14]], _req(1))
    fresh.close()


def test_an_engine_that_never_comes_back_is_a_clear_error_and_other_errors_are_not_redone(worker):  # noqa: F811
    w, llm = worker
    lease = SlotTable(3).acquire("A_s0")

    def never(engine, timeout):
        raise ActorDiedError()

    client, handle = _client(w, lease, ready=never)
    _opened(client, 1)
    client.recovery.wait_s = 0.05
    handle.dead = True
    with pytest.raises(EngineLost, match=r"pool.engine\[0\] did not come back within 0.05 s \(timeouts.setup\) "
                                         "after ActorDiedError"):
        client.generate([[10]], _req(1), [1], "generate")
    handle.dead, llm.llm_engine.fail = False, True
    before = len(handle.calls)
    with pytest.raises(RuntimeError, match="bad adapter"):  # a bad adapter: the engine's own error, not redone
        client.load_policy(_update(2))
    with pytest.raises(RuntimeError, match="slot 0 unusable since a failed adapter load"):
        client.generate([[10]], _req(1), [1], "generate")
    assert handle.calls[before:] == ["load_policy", "generate"]  # no drop, no second try


def test_with_two_engines_only_the_one_that_died_is_reopened_and_its_share_redone(worker, monkeypatch):  # noqa: F811
    w, _ = worker
    lease = SlotTable(3).acquire("A_s0")
    other = _restarted(monkeypatch)
    h0, h1 = Handle(w), Handle(other)
    client = PoolEnginesClient([h0, h1], lease, Calls(), wait_s=2.0)
    client.recovery.poll_s = 0.01
    _opened(client, 5)
    unfaulted = _sampled(client.generate([[10], [11], [12], [13]], _req(3), [3, 30], "generate"))
    assert unfaulted == [([(10, 3), (11, 4)], 5), ([(12, 30), (13, 31)], 5)]  # engine j's share, seeded seeds[j]
    fresh = _restarted(monkeypatch)
    h1.dead = True
    client.recovery.ready = _back_as(h1, fresh)
    before0, before1 = len(h0.calls), len(h1.calls)
    assert _sampled(client.generate([[10], [11], [12], [13]], _req(3), [3, 30], "generate")) == unfaulted
    assert h0.calls[before0:] == ["generate"]  # the live engine's share ran once
    assert h1.calls[before1:] == ["generate", "drop", "load_policy", "generate"]
    assert [r["engine"] for r in client.recovery.reopened] == ["pool.engine[1]"]
    other.close()
    fresh.close()
