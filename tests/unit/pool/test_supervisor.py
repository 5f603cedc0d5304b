"""The pool supervisor's decisions (orchestrator/pool/supervisor.py:judge), over what its probes of one actor gave:
a frozen actor (no answer), a stopped engine child, an engine whose step counter stands still while it has work, a
learner call over its deadline are killed; an idle engine, a moving one, a restarting one are not; each kill, each
death seen and each return is one event. The learner's call clock and `status`'s lines from those events."""

from __future__ import annotations

from orchestrator.config.sections import SupervisorConfig
from orchestrator.jobs.status import pool_lines
from orchestrator.pool.probe import CallClock, ProbeAnswer
from orchestrator.pool.supervisor import Down, NoAnswer, Watch, judge

CFG = SupervisorConfig(every_s=1.0, answer_s=5.0, engine_stall_s=20.0, learner_call_s=100.0)


def _engine(progress: int, pending: int, ok: bool = True, reason: str = "") -> ProbeAnswer:
    return ProbeAnswer(pid=7, ok=ok, reason=reason, progress=progress, pending=pending)


def _learner(call_s: float) -> ProbeAnswer:
    return ProbeAnswer(pid=8, ok=True, call="train_step" if call_s else None, call_s=call_s)


def test_an_idle_engine_is_never_killed_a_moving_one_neither():
    w = Watch("p", "engine0", "engine")
    for t in range(0, 1000, 10):  # idle for long: nothing pending
        assert not judge(w, _engine(5, 0), float(t), CFG).kill
    for t in range(1000, 2000, 10):  # busy, one step every probe
        assert not judge(w, _engine(t, 3), float(t), CFG).kill


def test_an_engine_whose_steps_stand_still_with_work_in_flight_is_killed_after_its_stall_deadline():
    w = Watch("p", "engine0", "engine")
    assert judge(w, _engine(10, 0), 0.0, CFG) == judge(w, _engine(10, 2), 5.0, CFG)  # its work begins at 5 s
    assert not judge(w, _engine(10, 2), 25.0, CFG).kill  # 20 s without a step: at the deadline, not over it
    verdict = judge(w, _engine(10, 2), 25.5, CFG)
    assert verdict.kill and verdict.event["event"] == "pool_actor_killed" and verdict.event["actor"] == "engine0"
    assert "no progress for 20 s with 2 request(s) or call(s) pending" in verdict.event["reason"]


def test_a_moving_counter_restarts_the_stall_clock():
    w = Watch("p", "engine0", "engine")
    judge(w, _engine(1, 1), 0.0, CFG)
    judge(w, _engine(2, 1), 19.0, CFG)  # one step just before the deadline
    assert not judge(w, _engine(2, 1), 38.0, CFG).kill
    assert judge(w, _engine(2, 1), 39.5, CFG).kill


def test_a_probe_without_answer_or_a_stopped_child_is_killed():
    frozen = judge(Watch("p", "engine0", "engine"), NoAnswer(), 0.0, CFG)
    assert frozen.kill and "no answer to a probe within 5 s" in frozen.event["reason"]
    stopped = judge(Watch("p", "engine0", "engine"), _engine(1, 0, ok=False, reason="process 9 (EngineCore) is "
                                                                              "stopped"), 0.0, CFG)
    assert stopped.kill and stopped.event["reason"] == "process 9 (EngineCore) is stopped"
    assert judge(Watch("p", "learner", "learner"), NoAnswer(), 0.0, CFG).kill


def test_a_learner_call_over_its_deadline_is_killed_and_a_long_idle_learner_is_not():
    w = Watch("p", "learner", "learner")
    assert not judge(w, _learner(0.0), 0.0, CFG).kill
    assert not judge(w, _learner(100.0), 1.0, CFG).kill
    verdict = judge(w, _learner(101.0), 2.0, CFG)
    assert verdict.kill and verdict.event["reason"] == "its call train_step has run 101 s, over 100 s"


def test_a_killed_actor_is_not_judged_while_it_restarts_and_its_return_is_an_event():
    w = Watch("p", "engine0", "engine")
    judge(w, _engine(4, 1), 0.0, CFG)
    assert judge(w, NoAnswer(), 10.0, CFG).kill
    for seen in (NoAnswer(), Down("ActorUnavailableError: restarting"), NoAnswer()):  # its new engine building
        verdict = judge(w, seen, 40.0, CFG)
        assert not verdict.kill and verdict.event is None
    back = judge(w, _engine(0, 1), 70.0, CFG)  # the new process counts from 0: a fresh baseline, no kill
    assert not back.kill and back.event == {"event": "pool_actor_back", "pool": "p", "actor": "engine0",
                                            "down_s": 60.0, "pid": 7}
    assert not judge(w, _engine(0, 1), 85.0, CFG).kill and judge(w, _engine(0, 1), 90.5, CFG).kill


def test_a_new_process_frozen_right_after_its_restart_is_killed_again():
    w = Watch("p", "engine0", "engine")
    assert not judge(w, Down("ActorUnavailableError: restarting"), 10.0, CFG).kill  # SIGKILLed: it went down at 10
    # a probe sent within answer_s of the death may have reached the dying process: given up on, not judged
    assert judge(w, NoAnswer(sent=14.0), 19.0, CFG) == judge(w, Down("restarting"), 20.0, CFG)
    # one sent later reached the new process (a restarting actor refuses calls at once): frozen, killed again
    again = judge(w, NoAnswer(sent=15.0), 20.5, CFG)
    assert again.kill and "after its restart" in again.event["reason"] and w.down_since == 20.5
    assert not judge(w, NoAnswer(sent=21.0), 26.5, CFG).kill  # the next probes count from the new kill
    assert judge(w, _engine(0, 0), 40.0, CFG).event["event"] == "pool_actor_back"


def test_a_death_the_supervisor_did_not_cause_is_recorded_not_killed():
    w = Watch("p", "learner", "learner")
    died = judge(w, Down("ActorDiedError: killed"), 3.0, CFG)
    assert not died.kill and died.event["event"] == "pool_actor_died" and died.event["error"] == "ActorDiedError: killed"
    assert judge(w, _learner(0.0), 33.0, CFG).event["down_s"] == 30.0


def test_the_call_clock_reports_the_oldest_running_call():
    now = [0.0]
    clock = CallClock(clock=lambda: now[0])
    assert clock.oldest() == (None, 0.0)
    with clock.running("train_step"):
        now[0] = 5.0
        with clock.running("export_policy"):
            now[0] = 7.0
            assert clock.oldest() == ("train_step", 7.0)
        assert clock.oldest() == ("train_step", 7.0)
    assert clock.oldest() == (None, 0.0)


def test_status_says_per_pool_actor_how_often_it_was_killed_or_died_and_the_last_why():
    events = [{"event": "slot_release", "trial": "a"},
              {"event": "pool_actor_died", "pool": "p", "actor": "engine0", "error": "ActorDiedError: x"},
              {"event": "pool_actor_back", "pool": "p", "actor": "engine0", "down_s": 30.0},
              {"event": "pool_actor_killed", "pool": "p", "actor": "engine0", "reason": "no answer to a probe"},
              {"event": "pool_actor_back", "pool": "p", "actor": "learner", "down_s": 1.0}]
    assert pool_lines(events) == ["shared pool p engine0: killed by the supervisor 1x, died 1x; last: no answer to a "
                                  "probe (restarting)"]
