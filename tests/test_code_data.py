"""Code-v0 problem sets: the built-in set and the APPS / CodeContests / LiveCodeBench loaders.

HumanEval, MBPP, gzip files and call-based built-in problems: tests/test_code_call_data.py."""

from __future__ import annotations

import base64
import builtins
import json
import os
import pickle
import zlib
from collections import Counter
from pathlib import Path

import pytest

import llm_zoo
from llm_zoo.data.code import (
    CallSpec,
    CodeDatasetError,
    CodeProblem,
    TestCase,
    decode_livecodebench_tests,
    load_builtin_problems,
    load_code_problems,
    sniff_format,
)

FIXTURES = Path(__file__).parent / "fixtures" / "code"


# ---------------------------------------------------------------------------------------- built-in


def test_builtin_set_has_enough_problems_with_tests_references_and_a_difficulty_spread():
    problems = load_builtin_problems()
    assert len(problems) >= 40
    assert len({p.id for p in problems}) == len(problems)
    for problem in problems:
        assert problem.id.startswith("builtin/") and problem.title and problem.statement.strip()
        assert len(problem.tests) >= 5, problem.id
        assert len({t.input for t in problem.tests}) == len(problem.tests), f"{problem.id}: repeated inputs"
        compile(problem.reference, problem.id, "exec")
        if problem.call is None:  # a Python 3 program reading stdin
            assert "input()" in problem.reference or "sys.stdin" in problem.reference
            assert all(t.output.strip() for t in problem.tests)
        else:  # defines the function it is called through; never reads stdin
            assert f"def {problem.call.name}(" in problem.reference and "stdin" not in problem.reference
            assert problem.call.signature in problem.reference  # the shown signature is the real one
    counts = Counter(p.difficulty for p in problems)
    assert set(counts) == {"easy", "medium", "hard"} and min(counts.values()) >= 10
    call_counts = Counter(p.difficulty for p in problems if p.call is not None)
    assert sum(call_counts.values()) >= 12 and set(call_counts) == {"easy", "medium", "hard"}
    assert {p.call.class_name for p in problems if p.call is not None} == {None, "Solution"}


def test_builtin_splits_are_fixed_disjoint_and_about_75_25_per_difficulty():
    train, test = load_builtin_problems("train"), load_builtin_problems("test")
    assert {p.id for p in train}.isdisjoint({p.id for p in test})
    assert len(train) + len(test) == len(load_builtin_problems())
    assert 0.15 <= len(test) / (len(train) + len(test)) <= 0.35
    for difficulty in ("easy", "medium", "hard"):
        assert any(p.difficulty == difficulty for p in test)
    assert [p.id for p in load_code_problems("builtin", split="test")] == [p.id for p in test]
    with pytest.raises(ValueError, match=r"unknown split 'dev'.*'test', 'train'"):
        load_builtin_problems("dev")


def test_make_selects_the_split():
    assert {p.id for p in llm_zoo.make("Code-v0").problems} == {p.id for p in load_builtin_problems("train")}
    assert {p.id for p in llm_zoo.make("Code-v0", split="test").problems} == {
        p.id for p in load_builtin_problems("test")
    }
    assert len(llm_zoo.make("Code-v0", split="all").problems) == len(load_builtin_problems())
    with pytest.raises(ValueError, match="split must be"):
        llm_zoo.make("Code-v0", split="validation")


def test_problem_rejects_missing_tests_and_is_shared_by_deepcopy():
    import copy

    with pytest.raises(ValueError, match="tests"):
        CodeProblem(id="x", statement="s", tests=())
    problem = CodeProblem(id="x", statement="s", tests=[TestCase("1\n", "1\n")])
    assert isinstance(problem.tests, tuple) and copy.deepcopy(problem) is problem


# ---------------------------------------------------------------------------------------- APPS


def test_apps_jsonl_loads_stdin_and_call_based_problems():
    problems = load_code_problems(FIXTURES / "apps.jsonl")
    assert [p.id for p in problems] == ["apps/4001", "apps/4002", "apps/4003"]
    first, second, call_based = problems
    assert first.kind == second.kind == "stdio" and first.call is None
    # 4003 has fn_name and a LeetCode-style starter: called as Solution().add(1, 2)
    assert call_based.kind == "call" and call_based.call == CallSpec(
        "add", "Solution", "class Solution:\n    def add(self, a, b):", lenient_singleton=True
    )
    assert call_based.tests == (TestCase("[1, 2]", "3"),)
    assert call_based.reference.startswith("class Solution")
    assert first.source == "apps" and first.difficulty == "easy" and first.reference.startswith("a, b")
    assert first.tests == (TestCase("1 2\n", "3\n"), TestCase("-5 5\n", "0\n"), TestCase("100 23\n", "123\n"))
    assert first.metadata["url"].endswith("/4001")
    # inputs/outputs given as lists of lines are joined; empty "solutions" means no reference
    assert second.tests[0] == TestCase("3\n1 9 4\n", "9\n") and second.reference is None
    assert second.difficulty == "medium"


def test_malformed_record_error_names_the_file_the_record_and_its_id():
    with pytest.raises(CodeDatasetError) as error:
        load_code_problems(FIXTURES / "apps_malformed.jsonl")
    message = str(error.value)
    assert "apps_malformed.jsonl" in message and "record 1" in message and "4002" in message
    assert "input_output" in message


@pytest.mark.parametrize(
    ("record", "expected"),
    [
        ({"problem_id": 1, "input_output": "{}"}, "missing field 'question'"),
        (
            {"problem_id": 1, "question": "q", "input_output": '{"inputs": ["1"], "outputs": []}'},
            "1 inputs but 0 outputs",
        ),
        (
            {"problem_id": 1, "question": "q", "input_output": '{"inputs": [3], "outputs": ["3"]}'},
            "input 0 should be a string",
        ),
        ({"problem_id": 1, "question": "q", "input_output": "[]"}, "should hold a JSON object"),
    ],
)
def test_apps_record_errors_are_clear(record, expected):
    with pytest.raises(CodeDatasetError, match=expected) as error:
        load_code_problems([record], format="apps")
    assert "record 0" in str(error.value)


# ---------------------------------------------------------------------------------------- CodeContests


@pytest.mark.parametrize("name", ["code_contests.parquet", "code_contests.json"])
def test_code_contests_loads_from_parquet_and_json(name):
    if name.endswith(".parquet"):
        pytest.importorskip("pyarrow")
    problems = load_code_problems(FIXTURES / name)
    assert [p.id for p in problems] == ["code_contests/9001_A. Sum of Two", "code_contests/9001_B. Largest"]
    first, second = problems
    # public + private + generated, the repeated private test dropped
    assert [t.input for t in first.tests] == ["1 2\n", "10 20\n", "-3 -4\n"]
    assert first.reference.startswith("a, b = map(int, input()")  # the PYTHON3 one, not Python 2 / C++
    assert first.difficulty == "easy" and first.title == "9001_A. Sum of Two"
    assert second.reference is None and second.difficulty == "medium"


def test_parquet_without_pyarrow_names_the_package(monkeypatch):
    real_import = builtins.__import__

    def no_pyarrow(name, *args, **kwargs):
        if name.startswith("pyarrow"):
            raise ImportError("no pyarrow here")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_pyarrow)
    with pytest.raises(CodeDatasetError, match=r"code_contests.parquet.*pyarrow"):
        load_code_problems(FIXTURES / "code_contests.parquet")


# ---------------------------------------------------------------------------------------- LiveCodeBench


def test_livecodebench_decodes_compressed_private_tests_and_loads_functional():
    problems = load_code_problems(FIXTURES / "livecodebench.jsonl")
    assert [p.id for p in problems] == ["livecodebench/abc900_a", "livecodebench/1999B", "livecodebench/9999"]
    atcoder, codeforces, leetcode = problems
    assert leetcode.call is not None and leetcode.call.target == "Solution().add"
    assert "def add(self, a: int, b: int) -> int:" in leetcode.call.signature
    # one JSON value per line of "input" -> the argument list; private tests decoded too
    assert leetcode.tests[0] == TestCase("[1, 2]", "3") and len(leetcode.tests) >= 2
    assert atcoder.tests == (TestCase("1 2\n", "3\n"), TestCase("5 7\n", "12\n"), TestCase("0 0\n", "0\n"))
    assert atcoder.reference is None and atcoder.difficulty == "easy" and atcoder.title == "Sum of Two"
    assert atcoder.metadata["platform"] == "atcoder"
    assert codeforces.tests[1] == TestCase("2\n-1 -2\n", "-1\n")


class _RunsCode:
    """Unpickling this object would run a shell command."""

    def __reduce__(self):
        return (os.system, ("touch pwned_by_pickle",))


def test_livecodebench_refuses_pickles_that_are_not_plain_values(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    payload = base64.b64encode(zlib.compress(pickle.dumps(_RunsCode()))).decode()
    with pytest.raises(CodeDatasetError, match="refusing to load"):
        decode_livecodebench_tests(payload)
    assert not (tmp_path / "pwned_by_pickle").exists()
    not_a_string = base64.b64encode(zlib.compress(pickle.dumps([1, 2]))).decode()
    with pytest.raises(CodeDatasetError, match="holds list, expected str"):
        decode_livecodebench_tests(not_a_string)
    with pytest.raises(CodeDatasetError, match="neither JSON nor"):
        decode_livecodebench_tests("%%% not base64 %%%")


def test_livecodebench_refuses_a_decompression_bomb(monkeypatch):
    monkeypatch.setattr("llm_zoo.data.code_formats.MAX_DECOMPRESSED_BYTES", 1000)
    payload = base64.b64encode(zlib.compress(pickle.dumps("x" * 5000))).decode()
    with pytest.raises(CodeDatasetError, match="exceeds 1000 bytes"):
        decode_livecodebench_tests(payload)


# ---------------------------------------------------------------------------------------- sources


class FakeDataset:
    """Duck-types a ``datasets.Dataset``: iterable of row dicts, with ``column_names``."""

    def __init__(self, rows):
        self.rows = rows
        self.column_names = sorted(rows[0])

    def __iter__(self):
        return iter(self.rows)

    def __len__(self):
        return len(self.rows)


def test_dataset_objects_and_lists_of_records_are_sniffed():
    rows = [json.loads(line) for line in (FIXTURES / "livecodebench.jsonl").read_text().splitlines()]
    assert sniff_format(rows[0]) == "livecodebench"
    from_object = load_code_problems(FakeDataset(rows))
    assert [p.id for p in from_object] == [p.id for p in load_code_problems(rows)]
    problems = load_builtin_problems("test")[:2]
    assert load_code_problems(problems) == problems


def test_a_real_datasets_object_loads_when_datasets_is_installed():
    datasets = pytest.importorskip("datasets")
    rows = [json.loads(line) for line in (FIXTURES / "apps.jsonl").read_text().splitlines()]
    dataset = datasets.Dataset.from_list(rows)
    assert [p.id for p in load_code_problems(dataset)] == ["apps/4001", "apps/4002", "apps/4003"]
    contests = datasets.Dataset.from_list(json.loads((FIXTURES / "code_contests.json").read_text()))
    assert [p.reference is not None for p in load_code_problems(contests)] == [True, False]


def test_bad_sources_give_clear_errors(tmp_path):
    with pytest.raises(CodeDatasetError, match=r"no_such_file.jsonl: no such file"):
        load_code_problems(tmp_path / "no_such_file.jsonl")
    (tmp_path / "data.csv").write_text("a,b\n")
    with pytest.raises(CodeDatasetError, match=r"unknown file type '.csv'"):
        load_code_problems(tmp_path / "data.csv")
    (tmp_path / "broken.jsonl").write_text('{"question": "q"}\nnot json\n')
    with pytest.raises(CodeDatasetError, match=r"broken.jsonl, record 1: not valid JSON"):
        list(
            __import__("llm_zoo.data.code", fromlist=["read_records"]).read_records(tmp_path / "broken.jsonl")
        )
    with pytest.raises(CodeDatasetError, match=r"cannot tell the dataset format.*'apps', 'code_contests'"):
        load_code_problems([{"foo": 1}])
    with pytest.raises(ValueError, match="unknown dataset format 'hf'"):
        load_code_problems([{"foo": 1}], format="hf")
    with pytest.raises(CodeDatasetError, match="DatasetDict"):
        load_code_problems({"train": [], "test": []})
    with pytest.raises(CodeDatasetError, match="record 0: expected an object"):
        load_code_problems([["not", "a", "record"]])


def test_make_loads_a_local_file_and_uses_every_problem_in_it():
    env = llm_zoo.make("Code-v0", dataset=str(FIXTURES / "apps.jsonl"))
    assert [p.id for p in env.problems] == ["apps/4001", "apps/4002", "apps/4003"]  # the file is the split
    env = llm_zoo.make(
        "Code-v0", dataset=FIXTURES / "code_contests.json", split="test", dataset_format="code_contests"
    )
    assert len(env.problems) == 2
    with pytest.raises(CodeDatasetError, match="no such file"):
        llm_zoo.make("Code-v0", dataset="/nonexistent/apps.jsonl")
