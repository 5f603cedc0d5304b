"""Saved training batches (orchestrator/trial/artifacts/batches.py) and their replay (orchestrator/trial/artifacts/replay.py): the file
round trip is exact, the file is plain numpy, a replayed step builds the very learner batch the run built, and
`trial --replay` refuses what it cannot replay with one line before anything starts."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from orchestrator.cli import main
from orchestrator.config.placement import bundles, engines, worker_slots
from orchestrator.config.trial import TrialConfig, sepa_settings
from orchestrator.storage import BATCHES_DIR, TRIAL_CONFIG_FILE, batch_file
from orchestrator.trial.actors.context import TrialContext
from orchestrator.trial.artifacts.batches import FORMAT, TrialBatches, decode, encode, header_of
from orchestrator.trial.artifacts.replay import ReplaySource, check_replay, replay_source
from orchestrator.trial.collect.rollouts import Rollouts
from orchestrator.trial.step.sequence import prepare
from workers.credit import SepaController

P, G = 3, 2
BASE = dict(model={"name": "tiny"}, task={"name": "arithmetic"}, steps=2, eval={"every": 0},
            rollout={"prompts_per_step": P, "n": G, "max_tokens": 6}, logging={"batches": True})


def _roll(step: int = 0, *, multi_turn: bool = False) -> Rollouts:
    """Three groups of two: one informative, one uniform, one with a NaN reward; ragged lengths, a refill choice."""
    resp = [[[5, 6, 7], [8]], [[9, 9], [1, 2, 3, 4]], [[3], [4, 4]]]
    extra = {}
    if multi_turn:
        extra = {"reward_positions": [[[2], [0]], [[0, 1], [3]], [[0], [1]]],
                 "turn_rewards": [[[1.0], [0.0]], [[0.5, 0.5], [1.0]], [[0.0], [0.0]]],
                 "sampled_mask": [[[True, False, True], [True]], [[True, True], [True, False, False, True]],
                                  [[True], [True, True]]]}
    return Rollouts(
        prompt_ids=[[[1, 2, step]] * G, [[3]] * G, [[4, 5]] * G], response_ids=resp,
        loss_mask=[[[True] * len(r) for r in g] for g in resp],
        logprobs=[[[-0.1 / (i + 1) - 1e-9 * j for j in range(len(r))] for i, r in enumerate(g)] for g in resp],
        rewards=[[1.0, 0.0], [1.0, 1.0], [float("nan"), 0.0]], correct=[[True, False], [True, True], [False, False]],
        num_tokens=15, versions={2}, metrics={"train/grader_errors": 1, "time/score_s": 0.25, "time/generate_s": 3.0},
        extra=extra, groups_info=[{"problem": f"p{i}", "prompt": f"{i}+1=", "truncated": [False, i == 1]}
                                  for i in range(P)],
        truncated=[[False, False], [False, True], [False, False]], lengths=[[3, 1], [2, 4], [1, 2]],
        train=[True, False, False])


def _same(a: Rollouts, b: Rollouts) -> bool:
    """Equal field by field, NaN equal to NaN (json renders both the same)."""
    return json.dumps(a.__dict__, default=sorted, sort_keys=True) == json.dumps(b.__dict__, default=sorted, sort_keys=True)


@pytest.mark.parametrize("multi_turn", [False, True])
def test_round_trip_is_exact_to_the_bit(multi_turn):
    roll = _roll(multi_turn=multi_turn)
    back, header = decode(encode(roll, header_of(TrialConfig(**BASE), 0, roll)))
    assert _same(back, roll)
    assert back.logprobs[0][0] == roll.logprobs[0][0]  # float64: vLLM's log-probs come back bit for bit
    assert type(back.correct[0][0]) is bool and type(back.response_ids[0][0][0]) is int
    assert header["format"] == FORMAT and header["rollout"]["n"] == G and header["model"]["name"] == "tiny"


def test_without_optional_fields_they_stay_absent():
    roll = Rollouts(prompt_ids=[[[1]]], response_ids=[[[]]], loss_mask=[[[]]], logprobs=[[[]]], rewards=[[0.0]],
                    correct=[[False]], num_tokens=0, versions={None}, metrics={})
    back, _ = decode(encode(roll, header_of(TrialConfig(**BASE), 0, roll)))
    assert _same(back, roll) and back.train == [] and back.truncated == [] and back.extra == {}


def test_the_file_is_plain_numpy_with_a_json_header(tmp_path):
    cfg = TrialConfig(**BASE)
    TrialBatches(cfg, str(tmp_path)).record(4, _roll())
    with np.load(tmp_path / BATCHES_DIR / batch_file(4), allow_pickle=False) as z:
        header = json.loads(str(z["header"]))
        ids = np.split(z["response_ids"], np.cumsum(z["response_ids_lens"])[:-1])
        assert header["step"] == 4 and [a.tolist() for a in ids] == [r for g in _roll().response_ids for r in g]
        assert z["rewards"].shape == (P * G,) and z["group_sizes"].tolist() == [G] * P
    TrialBatches(TrialConfig(**{**BASE, "logging": {}}), str(tmp_path / "off")).record(0, _roll())
    assert not (tmp_path / "off").exists()  # off by default


def test_a_replayed_step_builds_the_run_s_learner_batch_and_row(tmp_path):
    cfg = TrialConfig(**BASE)
    roll = _roll()
    TrialBatches(cfg, str(tmp_path)).record(0, roll)
    replay = cfg.model_copy(update={"replay": str(tmp_path)})
    ctx = TrialContext(replay, [], None, None, None)
    source = replay_source(ctx, inner=None)
    assert isinstance(source, ReplaySource)
    again = source.collect(0)
    assert again.versions == set() and "time/score_s" not in again.metrics and again.metrics["time/generate_s"] >= 0
    a, b = (prepare(ctx, 0, r, SepaController(sepa_settings(cfg)), 2) for r in (roll, again))
    (row_a, batch_a, rate_a), (row_b, batch_b, rate_b) = (a.row, a.batch, a.correct_rate), (b.row, b.batch, b.correct_rate)
    assert a.kept == b.kept
    assert batch_a == batch_b and rate_a == rate_b and batch_a is not None
    volatile = ("time/", "rollout/tokens_per_s")
    assert {k: v for k, v in row_a.items() if not k.startswith(volatile)} == {
        k: v for k, v in row_b.items() if not k.startswith(volatile)}
    assert source.collect(0).response_ids == again.response_ids  # an ordinary source: a step's collect is its saved batch


def test_engines_only_for_a_replay_with_evaluation():
    plain = TrialConfig(**{**BASE, "rollout": {**BASE["rollout"], "num_workers": 2}})
    replay = plain.model_copy(update={"replay": "/x"})
    assert engines(plain) == 2 and engines(replay) == 0 and worker_slots(replay) == []
    assert len(bundles(replay)) == len(bundles(plain)) - 2  # driver + learner rank only
    evaluated = TrialConfig(**{**plain.model_dump(), "replay": "/x", "eval": {"every": 1}})
    assert engines(evaluated) == 2


def _saved_run(tmp_path, steps: int = 2, **over) -> str:
    cfg = TrialConfig(**{**BASE, **over})
    for s in range(steps):
        TrialBatches(cfg, str(tmp_path / "run")).record(s, _roll(s))
    return str(tmp_path / "run")


def test_a_lone_trial_s_directory_leads_to_its_output_dir(tmp_path):
    run = _saved_run(tmp_path)
    lone = tmp_path / "results" / "local"
    lone.mkdir(parents=True)
    (lone / TRIAL_CONFIG_FILE).write_text(json.dumps({"name": "local", "output_dir": run}))
    assert check_replay(TrialConfig(**BASE), str(lone), "t.yaml") == run
    assert check_replay(TrialConfig(**BASE), run, "t.yaml") == run


def _refusal(tmp_path, capsys, yaml: str, run: str) -> str:
    path = tmp_path / "t.yaml"
    path.write_text(yaml)
    assert main(["trial", str(path), "--replay", run, "--storage", str(tmp_path / "out")]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {path}: "), lines
    return lines[0]


def _yaml(steps: int = 2, model: str = "{name: tiny}", **rollout) -> str:
    ro = {"prompts_per_step": P, "n": G, "max_tokens": 6, **rollout}
    return (f"model: {model}\ntask: {{name: arithmetic}}\neval: {{every: 0}}\nsteps: {steps}\n"
            f"rollout: {{{', '.join(f'{k}: {v}' for k, v in ro.items())}}}\n")


@pytest.mark.parametrize(("yaml", "needle"), [
    (_yaml(steps=3), "steps: 3, but"),
    (_yaml(n=4), "rollout.n: 4, but the saved batches were sampled with 2"),
    (_yaml(prompts_per_step=5), "rollout.prompts_per_step: 5"),
    (_yaml(temperature=0.7), "rollout.temperature: 0.7"),
    (_yaml(model="{name: tiny, tiny_seed: 3}"), "model.tiny_seed: 3"),
    (_yaml(mode="one_step_off"), "rollout.mode: one_step_off"),
])
def test_replay_refusals_are_one_line(tmp_path, capsys, yaml, needle):
    assert needle in _refusal(tmp_path, capsys, yaml, _saved_run(tmp_path))


def test_replay_refuses_a_run_without_batches_and_a_model_it_did_not_sample(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    line = _refusal(tmp_path, capsys, _yaml(), str(tmp_path / "empty"))
    assert "no saved batches" in line and "logging: {batches: true}" in line
    run = _saved_run(tmp_path, model={"name": "tiny-reasoner"}, task={"name": "chain"})
    assert "model.name: 'tiny', but the saved batches were sampled with 'tiny-reasoner'" in _refusal(
        tmp_path, capsys, _yaml(), run)
    (tmp_path / "run" / BATCHES_DIR / batch_file(0)).write_bytes(b"not a zip")
    assert "unreadable" in _refusal(tmp_path, capsys, _yaml(), run)


def test_saved_rewards_keep_their_nan_for_the_filter(tmp_path):
    run = _saved_run(tmp_path, steps=1)
    source = ReplaySource(TrialConfig(**{**BASE, "replay": run}), inner=None)
    assert math.isnan(source.saved(0).rewards[2][0])
    with pytest.raises(FileNotFoundError, match="step 1"):
        source.saved(1)


def test_replay_refuses_the_same_model_name_holding_another_tokenizer(tmp_path, capsys):
    """A local path (or a hub name at another revision) keeps its name while its files change: the saved token
    ids are checked against the replaying trial's tokenizer by its vocabulary, before launch and in the trial."""
    from workers.models.loading import TINY_VOCAB, build_tiny_model, load_tokenizer, tokenizer_fingerprint

    model = tmp_path / "model"
    build_tiny_model(model, seed=0)
    cfg = TrialConfig(**{**BASE, "model": {"name": str(model)}})
    saved = tokenizer_fingerprint(load_tokenizer(str(model)))
    for s in range(2):
        TrialBatches(cfg, str(tmp_path / "run"), saved).record(s, _roll(s))
    run = str(tmp_path / "run")
    assert check_replay(cfg, run, "t.yaml") == run  # the same files: replays
    assert ReplaySource(cfg.model_copy(update={"replay": run}), inner=None, tokenizer=saved).run == run

    build_tiny_model(model, seed=0, vocab=(*TINY_VOCAB, "extra"))  # rebuilt in place, one token more
    other = tokenizer_fingerprint(load_tokenizer(str(model)))
    assert other != saved
    capsys.readouterr()  # the builds' progress bars
    line = _refusal(tmp_path, capsys, _yaml(model=f"{{name: {model}}}"), run)
    assert f"model.name: '{model}' now has another tokenizer (vocabulary {other})" in line and saved in line
    with pytest.raises(ValueError, match="another tokenizer"):
        ReplaySource(cfg.model_copy(update={"replay": run}), inner=None, tokenizer=other)


def test_a_shared_trial_s_first_rollout_must_come_from_its_adapter_not_the_bare_base():
    """Step 0 accepts the bare base (None) or adapter v0 from a trial's own engine; on a shared engine only v0: a
    slot there always holds its trial's adapter, so a bare-base rollout is a leak or an engine restarted empty. The
    step learns which from its engines (EnginesPort.initial_versions), never from the config."""
    from orchestrator.trial.actors.calls import Calls
    from orchestrator.trial.actors.engines import RolloutEngines
    from orchestrator.trial.actors.shared import PoolEnginesClient
    from workers.fence import SlotLease

    roll = _roll()
    separate = TrialConfig(**BASE)
    shared = TrialConfig(**{**BASE, "learner": {"mode": "lora"}, "resources": {"shared_base": {"slots": 2}}})
    own, pool = RolloutEngines([]), PoolEnginesClient([], SlotLease(0, 1, shared.name), Calls())
    for cfg, port, ok in [(separate, own, {None, 0}), (shared, pool, {0})]:
        assert port.initial_versions == frozenset(ok)
        for version in (None, 0, 1):
            roll.versions = {version}
            ctx = TrialContext(cfg, [], None, None, None, engines=port)
            if version in ok:
                prepare(ctx, 0, roll, SepaController(sepa_settings(cfg)), 0)
            else:
                with pytest.raises(RuntimeError, match="sampled with adapter"):
                    prepare(ctx, 0, roll, SepaController(sepa_settings(cfg)), 0)

