"""The samples files' rows, planning spans, advantages mapping, compression and the per-trial size cap."""

from __future__ import annotations

import json

import pytest

from orchestrator.config.trial import TrialConfig
from orchestrator.storage import gzip_jsonl as encode
from orchestrator.storage import read_gzip_jsonl
from orchestrator.trial.artifacts.samples import (
    ROW_KEYS,
    Credit,
    SamplesWriter,
    SampleText,
    TrialSamples,
    read_samples,
    runs,
    sample_rows,
)
from orchestrator.trial.collect.rollouts import SampleGroup
from orchestrator.trial.step.sequence import StepOutcome


class PieceTokenizer:
    """Each id decodes to one fixed piece; a sequence decodes to their concatenation (byte-level BPE's shape)."""

    def __init__(self, vocab: list[str]):
        self.vocab = vocab

    def batch_decode(self, seqs):
        return ["".join(self.vocab[i] for i in s) for s in seqs]

    def decode(self, ids, **_):
        return "".join(self.vocab[i] for i in ids)


VOCAB = ["Let", " me", " check", ":", " 4", "<obs>", " ok", " wait", " let", " me", " think", " 5"]
TOK = PieceTokenizer(VOCAB)


def test_runs_splits_into_maximal_equal_runs():
    assert runs([True, True, False, True]) == [(0, 2, True), (2, 3, False), (3, 4, True)]
    assert runs([False]) == [(0, 1, False)]
    assert runs([]) == []


def test_single_turn_text_and_planning_span():
    text, turns, spans = SampleText(TOK).completion([0, 1, 2, 3, 4], None)
    assert text == "Let me check: 4"
    assert turns == [{"role": "assistant", "text": text}]
    assert spans == [[0, 12]] and text[0:12] == "Let me check"  # the gram "let me check", case-insensitive


def test_episode_turns_spans_offset_past_observations_and_grams_never_span_turns():
    # turn 1 "Let me", observation "<obs> ok", turn 2 " check wait let me think 5": "let me | check" spans the
    # observation and must not match; "wait let me" and "let me think" in turn 2 overlap into one span
    ids = [0, 1, 5, 6, 2, 7, 8, 9, 10, 11]
    mask = [True, True, False, False, True, True, True, True, True, True]
    text, turns, spans = SampleText(TOK).completion(ids, mask)
    assert text == "Let me<obs> ok check wait let me think 5"
    assert [t["role"] for t in turns] == ["assistant", "observation", "assistant"]
    assert turns[1]["text"] == "<obs> ok"
    start = text.index(" wait")
    assert spans == [[start, text.index(" 5")]]


def test_custom_grams_and_detector_are_used():
    assert SampleText(TOK, grams=["check"]).completion([0, 1, 2], None)[2] == [[6, 12]]
    every_other = SampleText(TOK, detector=lambda pieces, grams: [i % 2 == 0 for i in range(len(pieces))])
    assert every_other.completion([0, 1, 2], None)[2] == [[0, 3], [6, 12]]


def test_credit_maps_kept_groups_in_order():
    credit = Credit(kept=[1, 3], episode=[0.5, -0.5, 1.0, -1.0], token_mean=[0.1, 0.2, 0.3, 0.4])
    assert credit.of(0, 0, 2) == (None, None)
    assert credit.of(1, 1, 2) == (-0.5, 0.2)
    assert credit.of(3, 0, 2) == (1.0, 0.3)
    assert Credit([1], None, None).of(1, 0, 2) == (None, None)


def groups() -> list[SampleGroup]:
    return [SampleGroup("p0", "What is 2+2?", [[0, 1, 2, 3, 4], [4]], [1.0, 0.0], [True, False], [False, True]),
            SampleGroup("p1", "What is 1+4?", [[11], [4]], [1.0, 1.0], [True, True], [False, False])]


def test_sample_rows_one_per_completion_with_scores_and_credit():
    rows = sample_rows(SampleText(TOK), groups(), step=3, split="train", version=2,
                       credit=Credit([0], [0.7, -0.7], [0.6, -0.8]))
    assert [tuple(r) for r in rows] == [ROW_KEYS] * 4
    first, second, third = rows[0], rows[1], rows[2]
    assert (first["problem"], first["sample"], first["completion"], first["length"]) == ("p0", 0, "Let me check: 4", 5)
    assert (first["reward"], first["correct"], first["truncated"], first["trained"]) == (1.0, True, False, True)
    assert (first["episode_advantage"], first["token_advantage"]) == (0.7, 0.6)
    assert (second["truncated"], second["token_advantage"], second["planning_spans"]) == (True, -0.8, [])
    assert (third["group"], third["trained"], third["episode_advantage"]) == (1, False, None)
    assert {r["adapter_version"] for r in rows} == {2} and first["turns"] is None
    json.dumps(rows)  # plain JSON


def test_encode_is_deterministic_and_round_trips(tmp_path):
    rows = sample_rows(SampleText(TOK), groups(), step=0, split="eval", version=0)
    assert encode(rows) == encode(rows)
    (tmp_path / "f.gz").write_bytes(encode(rows))
    assert read_gzip_jsonl(str(tmp_path / "f.gz")) == rows and read_gzip_jsonl(str(tmp_path / "none")) is None


def test_writer_cap_skips_files_past_it_and_says_so_once(tmp_path):
    rows = sample_rows(SampleText(TOK), groups(), step=0, split="train", version=0)
    size = len(encode(rows))
    writer = SamplesWriter(str(tmp_path), max_mb=(2 * size + size // 2) / 2**20)  # room for two files
    assert writer.write(0, "train", rows) and writer.write(0, "eval", rows)
    assert writer.write(0, "train", rows)  # rewriting a file (a resumed step) does not count it twice
    assert writer.write(1, "train", rows) is None and writer.write(2, "eval", rows) is None
    events = [json.loads(ln) for ln in (tmp_path / "events.jsonl").read_text().splitlines()]
    assert [e["event"] for e in events] == ["samples_capped"] and events[0]["step"] == 1
    assert sorted(p.name for p in (tmp_path / "samples").iterdir()) == ["eval_step_0.jsonl.gz", "step_0.jsonl.gz"]
    assert read_samples(str(tmp_path), 0) == rows and read_samples(str(tmp_path), 1) is None
    assert sum(p.stat().st_size for p in (tmp_path / "samples").iterdir()) <= writer.cap


class FakeRollouts:
    def __init__(self):
        g = groups()
        self.groups_info = [{"problem": x.problem, "prompt": x.prompt, "truncated": x.truncated} for x in g]
        self.response_ids = [x.response_ids for x in g]
        self.rewards, self.correct = [x.rewards for x in g], [x.correct for x in g]
        self.loss_mask = [[[True] * len(ids) for ids in x.response_ids] for x in g]


@pytest.mark.parametrize(("every", "per_step", "steps_written"), [(1, 2, [0, 1, 2]), (2, 1, [0, 2]), (0, 2, [])])
def test_record_follows_the_settings_and_pops_the_private_keys(tmp_path, every, per_step, steps_written):
    cfg = TrialConfig(logging={"samples": {"every": every, "per_step": per_step}})
    samples = TrialSamples(cfg, str(tmp_path), TOK)
    for step in range(3):
        row = {"step": step, "rollout/adapter_version": step}
        outcome = StepOutcome(row, FakeRollouts(), [1], step, advantages=([0.0, 0.0], [0.25, -0.25]),
                              eval_samples=groups()[:1] if step == 1 else [])
        tables = samples.record(step, outcome, eval_version=step)
        assert set(row) == {"step", "rollout/adapter_version"}
        assert ("samples/train" in tables) == (step in steps_written)
        assert ("samples/eval" in tables) == (step == 1)
    for step in range(3):
        got = read_samples(str(tmp_path), step)
        assert (got is not None) == (step in steps_written)
        if got:
            assert {r["group"] for r in got} == set(range(per_step))
            assert [r["token_advantage"] for r in got] == [None, None, 0.25, -0.25][:2 * per_step]
    assert [r["split"] for r in read_samples(str(tmp_path), 1, "eval")] == ["eval", "eval"]


def test_bad_samples_setting_is_one_line(tmp_path):
    from tests.unit.config.cli_errors import trial_error

    path, lines = trial_error(tmp_path, "logging: {samples: {every: -1}}\n")
    assert len(lines) == 1 and str(path) in lines[0] and "logging.samples.every" in lines[0], lines
