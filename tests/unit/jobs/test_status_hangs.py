"""`status` on a trial that missed a deadline: retrying until its next attempt starts, then resumed."""

from __future__ import annotations

from orchestrator.jobs.status import hang_label


def _hang(t: float, **kw) -> dict:
    return {"event": "hang", "phase": "generate", "late": ["rollout[0]"], "frozen": [], "step": 3, "time": t, **kw}


def test_retrying_then_resumed():
    starts = [{"event": "start", "from_step": 0, "time": 1.0}]
    assert hang_label([_hang(5.0)], starts) == "(retrying after a hang in generate of rollout[0] at step 3; 1 so far)"
    starts.append({"event": "start", "from_step": 2, "time": 9.0})
    frozen = _hang(7.0, phase="train", late=["learner[0]", "learner[1]"], frozen=["learner[1]"])
    assert hang_label([_hang(5.0), frozen], starts) == \
        "(resumed after a hang in train of learner[1] at step 3; 2 so far)"  # the frozen rank, not the waiting one
