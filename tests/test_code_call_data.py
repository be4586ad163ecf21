"""Call-based Code-v0 sources: HumanEval / MBPP / APPS fn_name / LiveCodeBench functional fixtures in
their published schemas, gzip files, JSON-object files, and the assert-to-call-test converter."""

from __future__ import annotations

import ast
import gzip
import json
from pathlib import Path

import pytest

from llm_zoo.checkers.call_harness import literal
from llm_zoo.data.code import CallSpec, CodeDatasetError, TestCase, load_code_problems, sniff_format
from llm_zoo.data.code_call_formats import convert_asserts, static_value
from llm_zoo.data.code_problem import CHECK_TEST
from llm_zoo.data.math import load_math_records

FIXTURES = Path(__file__).parent / "fixtures" / "code"


def test_humaneval_gz_loads_with_converted_asserts_and_a_check_for_the_rest():
    problems = load_code_problems(FIXTURES / "humaneval.jsonl.gz")
    assert [p.id for p in problems] == ["HumanEval/900", "HumanEval/901", "HumanEval/902"]
    add_all, mean, shuffle_back = problems
    assert add_all.call.checker is None and mean.call.checker is None
    # random inputs: not fixed calls; the prompt and the whole test run as the check
    assert shuffle_back.tests == (CHECK_TEST,) and shuffle_back.metadata["unconverted_statements"] == 1
    assert shuffle_back.call.checker.startswith("def shuffle_back(s: str) -> str:")
    assert (
        "def check(candidate):" in shuffle_back.call.checker and "import random" in shuffle_back.call.checker
    )
    assert "checker" not in repr(shuffle_back.call)  # hidden test source stays out of reprs
    assert add_all.call == CallSpec("add_all", None, add_all.call.signature)
    assert add_all.call.signature.startswith("def add_all(values: list) -> int:")
    assert add_all.reference == add_all.call.signature + "\n" + "    return sum(values)\n"
    # literals, arithmetic and an unrolled loop over range(3)
    assert add_all.tests == (
        TestCase("[[]]", "0"), TestCase("[[1, 2]]", "3"), TestCase("[[10, 10, 10]]", "30"),
        TestCase("[[]]", "0"), TestCase("[[0]]", "0"), TestCase("[[0, 1]]", "1"),
    )  # fmt: skip
    assert add_all.metadata["unconverted_statements"] == 0 and add_all.source == "humaneval"
    # abs(candidate(x) - y) < tol forms
    assert [(t.input, literal(t.output)) for t in mean.tests] == [
        ("[[1.0, 2.0]]", 1.5), ("[[1, 2, 4]]", pytest.approx(7 / 3)), ("[[2]]", 2), ("[[0]]", 0),
    ]  # fmt: skip


def test_mbpp_loads_with_the_function_from_the_first_assert():
    with pytest.warns(UserWarning, match="mbpp/9003: it needs test_setup_code"):
        problems = load_code_problems(FIXTURES / "mbpp.jsonl")
    assert [p.id for p in problems] == ["mbpp/9001", "mbpp/9002"]
    largest, distinct = problems
    assert sniff_format(json.loads((FIXTURES / "mbpp.jsonl").read_text().splitlines()[0])) == "mbpp"
    assert largest.call == CallSpec("largest_of_three", None, "def largest_of_three(a, b, c):")
    assert largest.statement.startswith("Write a function to find the largest") and largest.reference
    assert largest.tests[1] == TestCase("[-1, -5, -2]", "-1")
    # set(f(x)) == set(y) is order-free: not one expected value, so it runs as a check
    assert [t.input for t in distinct.tests] == ["[[3, 1, 3]]", "[[]]", CHECK_TEST.input]
    assert distinct.metadata["unconverted_statements"] == 1 and largest.call.checker is None
    assert (
        distinct.call.checker
        == "def check(candidate):\n    assert set(distinct_sorted([2, 2])) == set((2,))\n"
    )


def test_apps_call_based_records_keep_apps_lenient_expected_lists():
    (problem,) = load_code_problems(FIXTURES / "apps_call.jsonl")
    assert problem.call == CallSpec("count_vowels", None, "def count_vowels(s):", lenient_singleton=True)
    assert problem.tests == (
        TestCase("['hello']", "[2]"),
        TestCase("['xyz']", "[0]"),
        TestCase("['aeiou']", "5"),
    )


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("3 * 19 * 3", 171),
        ("[i**2 for i in range(-3, 4, 2) if i > 0]", [1, 9]),
        ("sum([i for i in range(5)])", 10),
        ("tuple(sorted([3, 1, 2]))", (1, 2, 3)),
        ("{1: 'a', 'b': (2,)}", {1: "a", "b": (2,)}),
        ("'ab' * 2 + 'c'[0:1]", "ababc"),
        ("-0.5 if True else 1", None),  # IfExp is outside the subset
        ("__import__('os').system('true')", None),
        ("open('/etc/passwd').read()", None),
        ("2 ** 100000", None),  # exponent too large
        ("'x' * 10**9", None),  # value too large
        ("[0] * 10**6", None),
    ],
)
def test_static_values_are_evaluated_without_eval_and_with_limits(source, expected):
    if expected is None:
        with pytest.raises(ValueError, match="not a static expression"):
            static_value(source)
    else:
        assert static_value(source) == expected


def test_assert_conversion_forms_and_dropped_statements():
    source = """
x = [1, 2]
assert f(x) == 3, "message"
assert 4 == f([4])
assert tuple(f([1])) == tuple([1])
assert f(*x) == 3
assert f(y) == 1
assert f([0]) is None
assert not f([5])
assert f([6])
import math
assert math.isclose(f([0.5]), 0.5, rel_tol=1e-9)
assert math.isclose(f([0.25]), 0.25, rel_tol=0.001)
assert abs(f([0.75]) - 0.75) < 0.01
assert abs(f([1.75]) - 1.75) <= 1e-7
assert True
"""
    tests, unconverted = convert_asserts(ast.parse(source).body, "f")
    assert [(t.input, t.output) for t in tests] == [
        ("[[1, 2]]", "3"), ("[[4]]", "4"), ("[[1]]", "[1]"), ("[[0]]", "None"), ("[[5]]", "False"),
        ("[[6]]", "True"), ("[[0.5]]", "0.5"), ("[[1.75]]", "1.75"),
    ]  # fmt: skip
    # the starred call, the unknown name y, the import, the two loose tolerances
    assert [ast.unparse(n).split("(")[0] for n in unconverted] == [
        "assert f", "assert f", "import math", "assert math.isclose", "assert abs",
    ]  # fmt: skip


@pytest.mark.parametrize("name", ["object.json"])
def test_a_json_file_holding_an_object_names_its_keys(name):
    with pytest.raises(CodeDatasetError, match=r"one JSON object with the keys \['problems', 'version'\]"):
        load_code_problems(FIXTURES / name)


def test_json_gz_lists_load_in_the_code_and_math_loaders(tmp_path):
    mbpp = [json.loads(line) for line in (FIXTURES / "mbpp.jsonl").read_text().splitlines()][:2]
    packed = tmp_path / "mbpp.json.gz"
    packed.write_bytes(gzip.compress(json.dumps(mbpp).encode()))
    assert [p.id for p in load_code_problems(packed)] == ["mbpp/9001", "mbpp/9002"]
    math_file = tmp_path / "math.json.gz"
    math_file.write_bytes(gzip.compress(json.dumps([{"question": "1 + 1?", "answer": "2"}]).encode()))
    assert [p.answer for p in load_math_records(math_file)] == ["2"]


def test_gzip_errors_are_clear(tmp_path):
    bad = tmp_path / "data.jsonl.gz"
    bad.write_bytes(b"not gzip at all")
    with pytest.raises(CodeDatasetError, match=r"data.jsonl.gz: cannot read it as a gzip file"):
        load_code_problems(bad)
    (tmp_path / "data.csv.gz").write_bytes(b"")
    with pytest.raises(CodeDatasetError, match=r"unknown file type '.csv'.*\.jsonl\.gz"):
        load_code_problems(tmp_path / "data.csv.gz")


def test_llm_zoo_format_call_records_round_trip_json_values():
    record = {
        "id": "x/1", "statement": "s", "call": {"name": "f", "signature": "def f(a):"},
        "tests": [{"input": [[1, 2], {"k": None}], "output": [True, 1.5]}],
    }  # fmt: skip
    (problem,) = load_code_problems([record])
    assert problem.kind == "call" and problem.tests == (TestCase("[[1, 2], {'k': None}]", "[True, 1.5]"),)
    record["tests"] = [{"input": "1", "output": 1}]
    with pytest.raises(CodeDatasetError, match="'input' should be the list of arguments"):
        load_code_problems([record])
    record["call"] = {"name": "not an identifier"}
    with pytest.raises(CodeDatasetError, match="identifier"):
        load_code_problems([record])
