"""`task: {name: dataset}`: JSONL, verl-format Parquet and save_to_disk files read into the same problems;
graders exact / regex / math / a plugin function; held-out from a second file or a seeded fraction."""

from __future__ import annotations

import json

import pytest

from workers.tasks import make_task, task_config

VERL_ROWS = [
    {"data_source": "openai/gsm8k", "prompt": [{"role": "user", "content": f"What is {i} + {i}?"}],
     "ability": "math", "reward_model": {"style": "rule", "ground_truth": str(2 * i)},
     "extra_info": {"index": i, "split": "train"}} for i in range(6)
] + [
    {"data_source": "lighteval/MATH", "prompt": [{"role": "system", "content": "Be brief."},
                                                 {"role": "user", "content": f"Simplify {i}/2."}],
     "ability": "math", "reward_model": {"style": "rule", "ground_truth": f"\\frac{{{i}}}{{2}}"},
     "extra_info": {"index": i, "split": "train"}} for i in range(1, 5)
]


def write_verl_parquet(path, rows=VERL_ROWS):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def _all(task):
    return sorted(task.train + task.held, key=lambda p: p.id)


def test_verl_parquet_reads_as_is(tmp_path):
    path = write_verl_parquet(tmp_path / "train.parquet")
    task = make_task(task_config(name="dataset", path=str(path), heldout_fraction=0.2), seed=0)
    problems = {p.prompt: p for p in task.train + task.held}
    assert len(problems) == 10 and len(task.held) == 2
    p = problems["Simplify 3/2."]
    assert (p.system, p.answer, p.source) == ("Be brief.", "\\frac{3}{2}", "lighteval/MATH")
    assert problems["What is 2 + 2?"].system is None and problems["What is 2 + 2?"].source == "openai/gsm8k"
    scored = task.score([p, p, p], ["so \\boxed{1.5}", "\\boxed{\\frac{3}{2}}", "\\boxed{2}"])
    assert scored.rewards == [1.0, 1.0, 0.0]  # math-verify: 1.5 == 3/2
    task.close()


def test_seeded_fraction_and_second_file(tmp_path):
    path = write_verl_parquet(tmp_path / "train.parquet")
    a = make_task(task_config(name="dataset", path=str(path), heldout_fraction=0.5, heldout_seed=1), seed=0)
    b = make_task(task_config(name="dataset", path=str(path), heldout_fraction=0.5, heldout_seed=1), seed=9)
    c = make_task(task_config(name="dataset", path=str(path), heldout_fraction=0.5, heldout_seed=2), seed=0)
    assert a.held == b.held and len(a.held) == 5 and {p.id for p in a.held} != {p.id for p in c.held}
    held = write_verl_parquet(tmp_path / "test.parquet", VERL_ROWS[:3])
    d = make_task(task_config(name="dataset", path=str(path), heldout_path=str(held)), seed=0)
    assert len(d.train) == 10 and [p.prompt for p in d.held] == [f"What is {i} + {i}?" for i in range(3)]


def test_jsonl_parquet_and_save_to_disk_give_the_same_problems(tmp_path):
    rows = [{"q": f"{i} + 1 =", "a": i + 1, "src": "toy"} for i in range(8)]
    (tmp_path / "d.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    write_verl_parquet(tmp_path / "d.parquet", rows)
    fields = {"prompt_field": "q", "answer_field": "a", "source_field": "src", "grader": "exact"}
    tasks = [make_task(task_config(name="dataset", path=str(tmp_path / "d.jsonl"), **fields), 0),
             make_task(task_config(name="dataset", path=str(tmp_path / "d.parquet"), **fields), 0)]
    datasets = pytest.importorskip("datasets")
    datasets.Dataset.from_list(rows).save_to_disk(str(tmp_path / "saved"))
    tasks.append(make_task(task_config(name="dataset", path=str(tmp_path / "saved"), **fields), 0))
    assert _all(tasks[0]) == _all(tasks[1]) == _all(tasks[2])
    p = _all(tasks[0])[3]
    assert (p.prompt, p.answer, p.source) == ("3 + 1 =", "4", "toy")
    assert tasks[0].score([p, p, p], ["4", "answer: 4.0", "\\boxed{4}"]).rewards == [1.0, 0.0, 1.0]


def test_regex_and_plugin_graders(tmp_path, monkeypatch):
    rows = [{"prompt": "say hi", "reward_model": {"ground_truth": "hi"}}]
    (tmp_path / "d.jsonl").write_text(json.dumps(rows[0]) + "\n")
    regex = make_task(task_config(name="dataset", path=str(tmp_path / "d.jsonl"), grader="regex",
                                  answer_pattern=r"ANSWER: (\w+)", heldout_fraction=0.0), 0)
    p = regex.train[0]
    assert regex.score([p, p, p], ["ANSWER: no ANSWER: hi", "ANSWER: hi!", "hi"]).rewards == [1.0, 1.0, 0.0]
    (tmp_path / "my_grader.py").write_text("def grade(completion, answer):\n    return answer in completion\n"
                                           "def boom(completion, answer):\n    raise RuntimeError('x')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    plugin = make_task(task_config(name="dataset", path=str(tmp_path / "d.jsonl"), grader="my_grader:grade",
                                   heldout_fraction=0.0), 0)
    assert plugin.score([p, p], ["oh hi", "hello"]).rewards == [1.0, 0.0]
    boom = make_task(task_config(name="dataset", path=str(tmp_path / "d.jsonl"), grader="my_grader:boom",
                                 heldout_fraction=0.0), 0)
    assert boom.score([p], ["hi"]).grader_errors == 1


@pytest.mark.parametrize("rows, fields, needle", [
    ([{"prompt": "x"}], {}, "train row 0 has no field 'reward_model.ground_truth'"),
    ([{"prompt": [{"role": "assistant", "content": "x"}], "reward_model": {"ground_truth": "1"}}], {},
     "chat prompts must be [system?, user] messages"),
])
def test_bad_rows_say_which(tmp_path, rows, fields, needle):
    (tmp_path / "d.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(ValueError, match=needle.replace("[", r"\[").replace("?", r"\?")):
        make_task(task_config(name="dataset", path=str(tmp_path / "d.jsonl"), **fields), 0)
