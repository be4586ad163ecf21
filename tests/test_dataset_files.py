"""Dataset files: parsed once per process and shared by every env made on them; records validated
with their position (index and id)."""

from __future__ import annotations

import json
import os
import re

import pytest

import llm_zoo
from llm_zoo.data import code as code_data
from llm_zoo.data import math as math_data
from llm_zoo.data.code import CodeDatasetError, load_code_problems
from llm_zoo.data.files import MAX_CACHED_FILES, cached_load, clear_cache
from llm_zoo.data.math import DatasetError, problems_from_records


def write_jsonl(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def math_records(n=30):
    return [{"id": f"p{i}", "question": f"What is {i} + 1?", "answer": str(i + 1)} for i in range(n)]


def code_records(n=5):
    return [
        {
            "id": f"c{i}",
            "statement": f"Print n + {i}.",
            "tests": [{"input": "1\n", "output": f"{1 + i}\n"}],
            "reference": f"print(int(input()) + {i})",
        }
        for i in range(n)
    ]


@pytest.fixture
def count_reads(monkeypatch):
    """How often each loader reads a file (``read_records`` of the math and code modules)."""
    clear_cache()
    reads = {"math": 0, "code": 0}

    def counting(kind, real):
        def read(path):
            reads[kind] += 1
            return real(path)

        return read

    monkeypatch.setattr(math_data, "read_records", counting("math", math_data.read_records))
    monkeypatch.setattr(code_data, "read_records", counting("code", code_data.read_records))
    yield reads
    clear_cache()


# ---------------------------------------------------------------------------------------- parsed once


def test_math_envs_on_one_file_parse_it_once_and_share_the_problem_set(tmp_path, count_reads):
    path = write_jsonl(tmp_path / "math.jsonl", math_records())
    envs = [llm_zoo.make("Math-v0", dataset=str(path)) for _ in range(5)]
    assert count_reads["math"] == 1
    assert all(env.problem_set is envs[0].problem_set for env in envs)
    envs[1].reset(seed=0)
    assert envs[1].problem.id.startswith("p")
    for env in envs:
        env.close()


def test_code_envs_on_one_file_parse_it_once_and_share_the_problems(tmp_path, count_reads):
    path = write_jsonl(tmp_path / "code.jsonl", code_records())
    envs = [llm_zoo.make("Code-v0", dataset=path) for _ in range(5)]
    assert count_reads["code"] == 1
    assert all(env.problems[i] is envs[0].problems[i] for env in envs for i in range(5))


def test_one_file_under_other_names_is_one_entry(tmp_path, count_reads, monkeypatch):
    path = write_jsonl(tmp_path / "math.jsonl", math_records())
    (tmp_path / "link.jsonl").symlink_to(path)
    monkeypatch.chdir(tmp_path)
    sets = [
        math_data.build_problem_set(name, "train")
        for name in (str(path), "math.jsonl", "./link.jsonl", tmp_path / "math.jsonl")
    ]
    assert count_reads["math"] == 1 and all(s is sets[0] for s in sets)


def test_splits_and_difficulties_share_one_parse(tmp_path, count_reads):
    records = [
        {**r, "split": "test" if i % 2 else "train", "difficulty": 1 + i % 3}
        for i, r in enumerate(math_records())
    ]
    path = write_jsonl(tmp_path / "math.jsonl", records)
    train = math_data.build_problem_set(str(path), "train")
    test = math_data.build_problem_set(str(path), "test", difficulty=[1, 2])
    assert count_reads["math"] == 1
    assert {p.split for p in train.fixed} == {"train"} and {p.difficulty for p in test.fixed} <= {1, 2}
    assert math_data.build_problem_set(str(path), "test", difficulty=[1, 2]) is test


def test_an_edited_file_is_read_again(tmp_path, count_reads):
    path = write_jsonl(tmp_path / "math.jsonl", math_records(3))
    assert len(math_data.load_math_records(path)) == 3
    write_jsonl(path, math_records(4))  # another size
    assert len(math_data.load_math_records(path)) == 4
    stat = os.stat(path)
    write_jsonl(path, [{**r, "answer": "0"} for r in math_records(4)])  # same size, ...
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))  # ... a later mtime
    assert [p.answer for p in math_data.load_math_records(path)] == ["0"] * 4
    assert count_reads["math"] == 3


def test_a_failed_parse_is_not_cached(tmp_path, count_reads):
    path = tmp_path / "math.jsonl"
    path.write_text('{"question": "1 + 1?"\n')
    with pytest.raises(DatasetError, match="line 1 is not valid JSON"):
        math_data.load_math_records(path)
    write_jsonl(path, math_records(2))
    assert len(math_data.load_math_records(path)) == 2


def test_callers_get_their_own_list_of_the_shared_problems(tmp_path, count_reads):
    path = write_jsonl(tmp_path / "code.jsonl", code_records())
    first = load_code_problems(path)
    first.clear()  # a caller changing its list must not empty the cache
    again = load_code_problems(path)
    assert len(again) == 5 and count_reads["code"] == 1


def test_the_cache_keeps_at_most_max_cached_files(tmp_path):
    clear_cache()
    loads = []

    def load(path):
        loads.append(path)
        return (path,)

    paths = [write_jsonl(tmp_path / f"{i}.jsonl", []) for i in range(MAX_CACHED_FILES + 1)]
    for path in paths:
        cached_load(path, load)
    cached_load(paths[-1], load)  # still there
    cached_load(paths[0], load)  # the least recently used one went out
    assert len(loads) == MAX_CACHED_FILES + 2
    clear_cache()


# ---------------------------------------------------------------------------------------- validation


@pytest.mark.parametrize(
    ("answer", "shown"),
    [
        ([1, 2], "[1, 2] (a list)"),
        ({"a": 1}, "{'a': 1} (a dict)"),
        (True, "True (a bool)"),
        (False, "False (a bool)"),
    ],
)
def test_math_refuses_a_gold_answer_that_is_not_one_value(tmp_path, answer, shown):
    records = math_records(3)
    records[2]["answer"] = answer
    path = write_jsonl(tmp_path / "math.jsonl", records)
    message = f"{path}: record 2 (id 'p2'): 'answer' is {shown}; it must be one string or one finite number"
    with pytest.raises(DatasetError, match=re.escape(message)) as caught:
        llm_zoo.make("Math-v0", dataset=str(path))
    assert "\n" not in str(caught.value)


def test_math_refuses_a_null_answer_naming_the_record(tmp_path):
    records = math_records(3)
    records[1]["answer"] = None
    with pytest.raises(DatasetError, match=re.escape("record 1 (id 'p1') has no 'answer' field")):
        problems_from_records(records, origin="mine")


@pytest.mark.parametrize("fmt", ["math", "aime"])
def test_math_refuses_non_scalar_answers_in_every_format(fmt):
    record = {
        "problem": "2 + 2?",
        "solution": "\\boxed{4}",
        "level": "Level 1",
        "type": "Algebra",
        "answer": [4],
    }
    if fmt == "aime":
        record = {"ID": "2024-I-1", "Problem": "2 + 2?", "Answer": [4]}
    with pytest.raises(DatasetError, match=r"'answer' is \[4\] \(a list\)"):
        problems_from_records([record], format=fmt)


def test_math_takes_numbers_as_answers():
    records = [{"question": "q", "answer": 3}, {"question": "r", "answer": 0.5}]
    assert [p.answer for p in problems_from_records(records)] == ["3", "0.5"]


def test_math_refuses_duplicate_ids_naming_both_records():
    records = math_records(4)
    records[3]["id"] = "p1"
    with pytest.raises(
        DatasetError,
        match=re.escape("mine: record 3: duplicate id 'p1', already used by record 1; ids must be unique"),
    ):
        problems_from_records(records, origin="mine")


@pytest.mark.parametrize("statement", ["", "   \n"])
def test_code_refuses_an_empty_statement_naming_the_record(tmp_path, statement):
    records = code_records(3)
    records[1]["statement"] = statement
    path = write_jsonl(tmp_path / "code.jsonl", records)
    with pytest.raises(
        CodeDatasetError, match=re.escape(f"{path}, record 1 (id 'c1'): the statement is empty")
    ):
        llm_zoo.make("Code-v0", dataset=path)


def test_code_refuses_duplicate_ids_naming_both_records(tmp_path):
    records = code_records(4)
    records[3]["id"] = "c0"
    path = write_jsonl(tmp_path / "code.jsonl", records)
    message = f"{path}, record 3: duplicate id 'c0', already used by record 0; ids must be unique"
    with pytest.raises(CodeDatasetError, match=re.escape(message)):
        llm_zoo.make("Code-v0", dataset=path)
    problems = load_code_problems(write_jsonl(tmp_path / "ok.jsonl", code_records(2)))
    with pytest.raises(CodeDatasetError, match="record 2: duplicate id 'c0'"):
        load_code_problems([*problems, problems[0]])
