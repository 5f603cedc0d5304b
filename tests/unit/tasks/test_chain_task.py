"""The chain task: problem set, held-out split by id hash, traces with deliberate mistakes, scoring."""

from __future__ import annotations

import json
import re

import numpy as np

from workers.credit.planning import match_spans
from workers.tasks import make_task, task_config
from workers.tasks.chain import (
    CORPUS_MIN_FRACTION,
    Chain,
    TraceStyle,
    final_answer,
    parse_chain,
    problem_fraction,
    solution_trace,
)


def test_problem_set_split_and_format():
    cfg = task_config(name="chain", heldout_fraction=0.2)
    task = make_task(cfg, seed=0)
    train, held = {p.id for p in task.train}, {p.id for p in task.heldout()}
    assert len(train) + len(held) == cfg.chain_problems and not train & held
    assert 0.15 < len(held) / cfg.chain_problems < 0.25
    assert {p.id for p in make_task(cfg, seed=9).heldout()} == held  # seed-independent
    assert all(problem_fraction(i) < 0.2 for i in held)  # never in the reasoner's corpus (fraction >= 0.5)
    assert all(problem_fraction(i) < CORPUS_MIN_FRACTION for i in held)
    p = task.heldout(1)[0]
    c = parse_chain(p.id)
    assert c.id == p.id and p.prompt == c.prompt() and p.answer == str(c.answer)
    assert p.prompt.startswith("solve ") and p.prompt.endswith(" :")
    for p in task.train[:200]:
        vals = parse_chain(p.id).values()
        assert len(vals) == cfg.chain_steps and all(0 <= v <= cfg.chain_max_value for v in vals)


def test_resume_and_scoring():
    cfg = task_config(name="chain", chain_problems=300)
    a = make_task(cfg, seed=3)
    a.next_batch(50)
    b = make_task(cfg, seed=3)
    b.load_state_dict(json.loads(json.dumps(a.state_dict())))
    assert a.next_batch(400) == b.next_batch(400)
    prob = a.heldout(1)[0]
    good = f" whatever . answer {prob.answer}"
    bad = f" answer {int(prob.answer) + 1}"
    fixed = f" answer {int(prob.answer) + 1} . wait let me check . answer {prob.answer}"  # the last answer counts
    assert a.score([prob] * 4, [good, bad, fixed, "no answer here"]).rewards == [1.0, 0.0, 1.0, 0.0]
    assert final_answer("answer 12 . answer 7") == 7 and final_answer("") is None


def test_traces_carry_mistakes_catches_and_strategic_grams():
    rng = np.random.default_rng(0)
    chain = Chain(9, (("+", 2), ("+", 5), ("-", 4)))
    clean = solution_trace(chain, rng, TraceStyle(error=0.0, catch=0.0, verify=0.0, plan=0.0))
    assert clean == " 9 + 2 = 11 . 11 + 5 = 16 . 16 - 4 = 12 . answer 12"
    # always wrong, never caught: the final answer is wrong, and the chain builds on the wrong values
    wrong = solution_trace(chain, rng, TraceStyle(error=1.0, catch=0.0, verify=0.0, plan=0.0))
    assert final_answer(wrong) != 12 and not match_spans(wrong)
    # always wrong, always caught: right answer, a strategic gram per step
    caught = solution_trace(chain, rng, TraceStyle(error=1.0, catch=1.0, verify=0.0, plan=0.0))
    assert final_answer(caught) == 12 and len(match_spans(caught)) >= 3
    # the default style: imperfect on purpose, and a few strategic phrases
    style = TraceStyle()
    task = make_task(task_config(name="chain"), 0)
    traces = [(parse_chain(p.id), solution_trace(parse_chain(p.id), rng, style)) for p in task.train[:800]]
    acc = np.mean([final_answer(t) == c.answer for c, t in traces])
    assert 0.35 < acc < 0.8
    assert 0.2 < np.mean([bool(match_spans(t)) for _, t in traces]) < 0.8
    # wrong intermediate values never make a later step negative
    for _, t in traces:
        assert all(int(x) >= 0 for x in re.findall(r"= (-?\d+)", t))
