"""Tasks: arithmetic problem sets, seeded resumable order, answer extraction and isolated math grading."""

from __future__ import annotations

import json
import time

import pytest
from pydantic import ValidationError

import workers.tasks.math as mathmod
from workers.tasks import Problem, make_task, task_config
from workers.tasks.arithmetic import all_problems
from workers.tasks.math import extract_answer, last_boxed

# ---------------------------------------------------------------- arithmetic


def test_arithmetic_problem_set_and_heldout_disjoint():
    cfg = task_config(max_operand=4, ops=["+", "-"], heldout_fraction=0.2)
    task = make_task(cfg, seed=0)
    train, held = {p.id for p in task.train}, {p.id for p in task.heldout()}
    assert len(train) + len(held) == 2 * 5 * 5 and not train & held
    assert len(held) == 10
    # held-out set is seed-independent and never served by next_batch, across epochs
    assert {p.id for p in make_task(cfg, seed=123).heldout()} == held
    assert not {p.id for p in task.next_batch(3 * len(train))} & held
    assert task.heldout(3) == task.heldout()[:3]


def test_arithmetic_prompt_and_answer_format():
    probs = {p.id: p for p in all_problems(4, ["+", "-", "*"])}
    assert probs["3+4"].prompt == "3 + 4 =" and probs["3+4"].answer == "7"
    assert probs["0-2"].prompt == "0 - 2 =" and probs["0-2"].answer == "-2"
    assert probs["3*4"].answer == "12"


def test_order_seeded_and_epochs_are_permutations():
    cfg = task_config(max_operand=4)
    a, b, c = make_task(cfg, 1), make_task(cfg, 1), make_task(cfg, 2)
    n = len(a.train)
    first_a, first_c = a.next_batch(n), c.next_batch(n)
    assert first_a == b.next_batch(n)
    assert first_a != first_c
    assert sorted(p.id for p in first_a) == sorted(p.id for p in a.train)
    second = a.next_batch(n)  # next epoch: a new permutation of the same set
    assert sorted(p.id for p in second) == sorted(p.id for p in first_a) and second != first_a


def test_resume_equivalence_via_state_dict():
    cfg = task_config(max_operand=3, ops=["+", "*"])
    orig = make_task(cfg, seed=7)
    orig.next_batch(5)
    orig.next_batch(len(orig.train))  # crosses an epoch boundary
    state = json.loads(json.dumps(orig.state_dict()))
    restored = make_task(cfg, seed=7)
    restored.load_state_dict(state)
    for n in (3, 11, 40):
        assert restored.next_batch(n) == orig.next_batch(n)


@pytest.mark.parametrize(
    "bad",
    [
        None,
        {},
        {"task": "math", "epoch": 0, "position": 0, "size": 20, "seed": 7},
        {"task": "arithmetic", "epoch": -1, "position": 0, "size": 20, "seed": 7},
        {"task": "arithmetic", "epoch": 0, "position": 99, "size": 20, "seed": 7},
        {"task": "arithmetic", "epoch": 0, "position": "1", "size": 20, "seed": 7},
        {"task": "arithmetic", "epoch": 0, "position": 0, "size": 19, "seed": 7},
        {"task": "arithmetic", "epoch": 0, "position": 0, "size": 20, "seed": 8},
    ],
)
def test_load_state_dict_rejects_corrupt(bad):
    task = make_task(task_config(max_operand=4), seed=7)  # 25 problems, 20 for training
    with pytest.raises(ValueError):
        task.load_state_dict(bad)


def test_arithmetic_scoring():
    task = make_task(task_config(ops=["+", "-"]), seed=0)
    p_add = Problem("3+4", "3 + 4 =", "7")
    p_neg = Problem("0-2", "0 - 2 =", "-2")
    res = task.score(
        [p_add, p_add, p_add, p_add, p_neg, p_neg],
        [" 7", "7 8", "6", "no number", "-2", " 2"],
    )
    assert res.rewards == [1.0, 1.0, 0.0, 0.0, 1.0, 0.0]
    assert res.grader_errors == res.grader_timeouts == 0
    # the tiny model decodes digits space-separated: only the first integer group counts
    assert task.score([Problem("9+3", "9 + 3 =", "12")], ["1 2"]).rewards == [0.0]
    with pytest.raises(ValueError):
        task.score([p_add], [])


# ---------------------------------------------------------------- config


def test_config_validation():
    with pytest.raises(ValidationError):
        task_config(unknown_key=1)
    with pytest.raises(ValidationError):
        task_config(name="math")
    with pytest.raises(ValidationError):
        task_config(heldout_fraction=1.0)
    with pytest.raises(ValidationError):
        task_config(max_operand=0)
    with pytest.raises(ValidationError):
        task_config(ops=["/"])
    with pytest.raises(ValidationError):
        task_config(prompt_template="no placeholder")
    assert task_config(name="math", dataset="x.jsonl").dataset == "x.jsonl"


# ---------------------------------------------------------------- math extraction


def test_last_boxed_nested_and_last_wins():
    assert last_boxed(r"so \boxed{\frac{1}{2}}") == r"\frac{1}{2}"
    assert last_boxed(r"\boxed{1} then \boxed{\sqrt{\frac{a}{b}}} done") == r"\sqrt{\frac{a}{b}}"
    assert last_boxed(r"\boxed{3} and truncated \boxed{\frac{1}{") == "3"  # unclosed last box is skipped
    assert last_boxed("no box") is None


def test_extract_answer_fallback():
    assert extract_answer("x = 3, then 4.5 is it") == "4.5"
    assert extract_answer("x = 3, then -12") == "-12"
    assert extract_answer("x = 3", fallback="none") is None
    assert extract_answer(r"\boxed{7} but 9", fallback="none") == "7"
    assert extract_answer("nothing here") is None


# ---------------------------------------------------------------- math task (spawns one grader process)


@pytest.fixture(scope="module")
def math_data(tmp_path_factory):
    path = tmp_path_factory.mktemp("math") / "toy.jsonl"
    rows = [{"problem": f"What is {i} + {i}?", "answer": str(2 * i)} for i in range(10)]
    rows[0] = {"problem": "Half of one?", "answer": r"\frac{1}{2}"}
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    return path


@pytest.fixture(scope="module")
def math_task(math_data):
    task = make_task(task_config(name="math", dataset=str(math_data), heldout_fraction=0.2), seed=0)
    yield task
    task.close()


def test_math_jsonl_loading_split_and_prompt(math_task):
    assert len(math_task.train) == 8 and len(math_task.heldout()) == 2
    assert not {p.id for p in math_task.train} & {p.id for p in math_task.heldout()}
    p = next(p for p in math_task.train + math_task.heldout() if p.answer == r"\frac{1}{2}")
    assert p.prompt == "Half of one?\nPut the final answer in \\boxed{}."
    batch = math_task.next_batch(3)
    assert len(batch) == 3 and all(isinstance(q, Problem) for q in batch)


def test_math_scoring_equivalence_and_safety(math_task, capfd):
    half = Problem("h", "Half of one?", r"\frac{1}{2}")
    four = Problem("f", "2 + 2?", "4")
    res = math_task.score(
        [half, half, half, four, four, four, four],
        [
            r"It is \boxed{0.5}.",
            r"\boxed{\frac{2}{4}}",
            r"\boxed{1/3}",
            r"first \boxed{3} then \boxed{4}",
            "so the answer is 4",
            r"\boxed{__import__('os').system('echo hi')}",
            "",
        ],
    )
    assert res.rewards == [1.0, 1.0, 0.0, 1.0, 1.0, 0.0, 0.0]
    assert res.grader_errors == 0 and res.grader_timeouts == 0
    assert "hi" not in capfd.readouterr().out  # the code-like answer was never executed


def _raising_grader(gold, pred):
    raise RuntimeError("grader bug")


def _sleeping_grader(gold, pred):
    time.sleep(30)
    return True


def test_math_grader_error_counted(math_task, monkeypatch):
    monkeypatch.setattr(mathmod, "grade_answer", _raising_grader)
    res = math_task.score([Problem("f", "2 + 2?", "4")] * 2, [r"\boxed{4.0}", r"\boxed{5}"])
    assert res.rewards == [0.0, 0.0] and res.grader_errors == 2 and res.grader_timeouts == 0


def test_math_grader_timeout_counted_then_recovers(math_data, monkeypatch):
    task = make_task(task_config(name="math", dataset=str(math_data), grader_timeout_s=0.3), seed=0)
    try:
        monkeypatch.setattr(mathmod, "grade_answer", _sleeping_grader)
        t0 = time.monotonic()
        res = task.score([Problem("f", "2 + 2?", "4")], [r"\boxed{4.0}"])
        assert time.monotonic() - t0 < 25  # the grader was cut off, not waited for (it sleeps 30 s)
        assert res.rewards == [0.0] and res.grader_timeouts == 1 and res.grader_errors == 0
        monkeypatch.undo()  # the killed grader is replaced and grades normally again
        assert task.score([Problem("f", "2 + 2?", "4")], [r"\boxed{4.0}"]).rewards == [1.0]
    finally:
        task.close()


def test_math_scoring_off_main_thread(math_task):
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(1) as pool:
        res = pool.submit(math_task.score, [Problem("h", "?", r"\frac{1}{2}")], [r"\boxed{0.5}"]).result()
    assert res.rewards == [1.0] and res.grader_errors == 0


def test_math_missing_file_and_bad_rows(tmp_path):
    with pytest.raises(FileNotFoundError):
        make_task(task_config(name="math", dataset=str(tmp_path / "missing.jsonl")), seed=0)
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"question": "q", "answer": "1"}) + "\n")
    with pytest.raises(ValueError):
        make_task(task_config(name="math", dataset=str(bad)), seed=0)


# ---------------------------------------------------------------- arithmetic, multiple choice (arithmetic_mc)


def _mc_options(prompt: str) -> dict[str, int]:
    """{"A": 7, ...} parsed back from "what is a op b ? A: 7, B: 5, .... answer:"."""
    listed = prompt.split("?", 1)[1].rsplit(". answer:", 1)[0]
    return {k.strip(): int(v) for k, v in (item.split(":") for item in listed.split(","))}


def test_mc_config_from_yaml():
    import yaml

    cfg = task_config(**yaml.safe_load("name: arithmetic_mc\nmax_operand: 3\nops: ['+', '-']\nnum_choices: 3"))
    assert cfg.name == "arithmetic_mc" and cfg.num_choices == 3
    assert task_config(name="arithmetic_mc").num_choices == 4
    for bad in (1, 5):
        with pytest.raises(ValidationError):
            task_config(name="arithmetic_mc", num_choices=bad)


@pytest.mark.parametrize("num_choices", [2, 3, 4])
def test_mc_problems_well_formed(num_choices):
    cfg = task_config(name="arithmetic_mc", max_operand=5, ops=["+", "-", "*"], num_choices=num_choices)
    task = make_task(cfg, seed=0)
    labels = ["A", "B", "C", "D"][:num_choices]
    assert task.action_tokens == labels
    plain = {p.id: p for p in all_problems(5, ["+", "-", "*"])}
    seen = set()
    for p in task.train + task.heldout():
        opts = _mc_options(p.prompt)
        assert list(opts) == labels and len(set(opts.values())) == num_choices  # distinct options, in label order
        assert p.answer in labels and opts[p.answer] == int(plain[p.id].answer)  # exactly the right value
        assert sum(v == int(plain[p.id].answer) for v in opts.values()) == 1
        assert p.prompt.startswith(f"what is {plain[p.id].prompt[:-2]} ?") and p.prompt.endswith("answer:")
        seen.add(p.answer)
    assert seen == set(labels)  # the right answer is not always in the same place


def test_mc_same_problem_split_as_arithmetic_and_seed_independent_content():
    cfg = dict(max_operand=4, ops=["+", "*"], heldout_fraction=0.2)
    mc, ar = make_task(task_config(name="arithmetic_mc", **cfg), 0), make_task(task_config(**cfg), 0)
    assert [p.id for p in mc.heldout()] == [p.id for p in ar.heldout()]
    assert sorted(p.id for p in mc.train) == sorted(p.id for p in ar.train)
    other = make_task(task_config(name="arithmetic_mc", **cfg), 99)
    assert sorted(mc.train, key=lambda p: p.id) == sorted(other.train, key=lambda p: p.id)  # prompts fixed


def test_mc_prompts_and_labels_are_tiny_vocab_tokens(tmp_path):
    from workers.models.loading import build_tiny_model, load_tokenizer

    tok = load_tokenizer(str(build_tiny_model(tmp_path / "tiny")))
    task = make_task(task_config(name="arithmetic_mc", max_operand=4, ops=["+", "-", "*"]), 0)
    for p in task.train + task.heldout():
        assert tok.unk_token_id not in tok.encode(p.prompt, add_special_tokens=False)
    ids = [tok.encode(label, add_special_tokens=False) for label in task.action_tokens]
    assert all(len(i) == 1 for i in ids) and len({i[0] for i in ids}) == len(ids)


def test_mc_scoring_first_label():
    task = make_task(task_config(name="arithmetic_mc"), 0)
    p = task.train[0]
    wrong = next(lbl for lbl in task.action_tokens if lbl != p.answer)
    cases = {p.answer: 1.0, f" {p.answer} 7 .": 1.0, f"{p.answer}.": 1.0, wrong: 0.0, f"{wrong} {p.answer}": 0.0,
             "": 0.0, "7": 0.0, f"{p.answer.lower()}": 0.0, f"{p.answer}nswer": 0.0}
    res = task.score([p] * len(cases), list(cases))
    assert res.rewards == list(cases.values())
    with pytest.raises(ValueError):
        task.score([p], [])


def test_mc_seeded_order_and_resume():
    cfg = task_config(name="arithmetic_mc", max_operand=3, ops=["+", "-"])
    a, b, c = make_task(cfg, 3), make_task(cfg, 3), make_task(cfg, 4)
    n = len(a.train)
    assert a.next_batch(n) == b.next_batch(n) and c.next_batch(n) != make_task(cfg, 3).next_batch(n)
    a.next_batch(5)
    state = json.loads(json.dumps(a.state_dict()))
    assert state["task"] == "arithmetic_mc"
    restored = make_task(cfg, 3)
    restored.load_state_dict(state)
    for k in (2, 9, 30):
        assert restored.next_batch(k) == a.next_batch(k)
    with pytest.raises(ValueError):  # an arithmetic cursor is not an arithmetic_mc cursor
        restored.load_state_dict(dict(state, task="arithmetic"))


def test_action_tokens_none_for_free_form_tasks():
    assert make_task(task_config(), 0).action_tokens is None
