"""`eval.sets` in the trial loop (orchestrator/trial/collect/eval_sets.py), with the sampler faked: each set is sampled
with the held-out seeds and settings of the task's own set at that step (what `eval` reproduces offline), on its
own problems, and logged under `eval/<set>/...` names the tracker knows."""

from __future__ import annotations

import pytest

from orchestrator.actors.models import resolve_model
from orchestrator.config.trial import TrialConfig
from orchestrator.tracking.names import logged_metrics
from orchestrator.trial.actors.context import TrialContext
from orchestrator.trial.collect import sources
from orchestrator.trial.collect.eval_sets import EvalSets, under_set
from orchestrator.trial.collect.sampling import step_seed
from workers.models.loading import load_tokenizer
from workers.rollout.output import Completion, Generation
from workers.tasks import make_task

CFG = TrialConfig(seed=3, model={"name": "tiny"}, task={"name": "arithmetic"}, rollout={"num_workers": 2},
                  eval={"every": 1, "problems": 3, "n": 2, "k": 2, "temperature": 0.7,
                        "sets": [{"name": "more", "problems": 5},
                                 {"name": "mul", "task": {"name": "arithmetic", "ops": ["*"]}}]})


@pytest.fixture
def calls(monkeypatch) -> list[dict]:
    seen = []

    def fake_sample(ctx, prompt_ids, *, n, temperature, seeds, floor=True, phase="generate"):
        seen.append({"prompts": len(prompt_ids), "n": n, "temperature": temperature, "seeds": seeds,
                     "phase": phase, "task": ctx.task})
        return [Generation(1, [[Completion([1], [0.0], "stop")] * n for _ in prompt_ids], n * len(prompt_ids))]

    monkeypatch.setattr(sources, "sample", fake_sample)
    return seen


def test_each_set_is_sampled_with_the_held_out_seeds_of_the_step(calls):
    task = make_task(CFG.task, CFG.seed)
    ctx = TrialContext(CFG, [object(), object()], None, load_tokenizer(resolve_model(CFG.model)), task)
    sets = EvalSets(ctx)
    own = sources.SingleTurnSource(ctx).evaluate(4).metrics
    row = sets.evaluate(4)
    want = [step_seed(CFG.seed + sources.EVAL_SEED_OFFSET, 4, j) for j in range(2)]
    assert [c["seeds"] for c in calls] == [want] * 3
    assert {(c["n"], c["temperature"], c["phase"]) for c in calls} == {(2, 0.7, "eval")}
    assert [c["prompts"] for c in calls] == [3, 5, 3]  # the own set, `more` (5 problems), `mul`
    assert calls[1]["task"] is task and calls[2]["task"] is not task  # `mul` has a task of its own
    assert row["eval/more/problems"] == 5 and row["eval/mul/k"] == 2 and "eval/pass@1" in own
    assert set(row) == {k for k in logged_metrics(CFG) if k.startswith(("eval/more/", "eval/mul/"))} | {
        "time/eval_more_s", "time/eval_mul_s"}
    assert {"time/eval_more_s", "time/eval_mul_s"} <= logged_metrics(CFG)
    sets.close()


def test_under_set_renames_eval_keys_and_drops_the_generations():
    got = under_set("gsm", {"eval/pass@1": 0.5, "eval/src_a/pass@1": 1.0, "time/eval_s": 2.0, "_samples": [1]})
    assert got == {"eval/gsm/pass@1": 0.5, "eval/gsm/src_a/pass@1": 1.0, "time/eval_gsm_s": 2.0}
