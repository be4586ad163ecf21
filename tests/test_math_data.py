"""The built-in math sets (generator, word problems) and the public-format loaders."""

from __future__ import annotations

import builtins
import collections
import functools
import itertools
import json
import math
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

from llm_zoo.data import math_generator
from llm_zoo.data.math import (
    DatasetError,
    MathProblem,
    ProblemSet,
    build_problem_set,
    generated_problem,
    load_math_records,
    problems_from_records,
    read_records,
    word_problems,
)

FIXTURES = Path(__file__).parent / "fixtures" / "math"


# ---------------------------------------------------------------------------- word problems
# Each word problem re-solved independently, mostly by brute force over the situation described.


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _fib_like(a: int, b: int, n: int) -> int:
    terms = [a, b]
    while len(terms) < n:
        terms.append(terms[-1] + terms[-2])
    return terms[n - 1]


WORD_SOLVERS = {
    "word-001": lambda: 4 * 3 + 7 * 2,
    "word-002": lambda: (13 * 60 + 15) - (9 * 60 + 40),
    "word-003": lambda: 300 - 300 * Fraction(1, 3) - 300 * Fraction(2, 5),
    "word-004": lambda: 1 / (Fraction(1, 6) + Fraction(1, 3)),
    "word-005": lambda: next(4 * s for s in range(1, 200) if 4 * s + 20 == 2 * (s + 20)),
    "word-006": lambda: sum(1 for n in range(10, 100) if sum(map(int, str(n))) == 9),
    "word-007": lambda: Fraction(sum(1 for a in range(1, 7) for b in range(1, 7) if a + b == 8), 36),
    "word-008": lambda: 9 * (46 // 2 - 9),
    "word-009": lambda: next(n for n in range(1, 1000) if n % 3 == 2 and n % 5 == 3 and n % 7 == 2),
    "word-010": lambda: 80 * Fraction(125, 100) * Fraction(80, 100),
    "word-011": lambda: Fraction(14 * 36, 24),
    "word-012": lambda: 7 + 24 * Fraction(43 - 7, 9),
    "word-013": lambda: sum(1 for p in itertools.permutations(range(5)) if abs(p.index(0) - p.index(1)) != 1),
    "word-014": lambda: next(w for w in range(100) if Fraction(30, 100) * 12 == Fraction(20, 100) * (12 + w)),
    "word-015": lambda: Fraction(20 * 21) / math.isqrt(20**2 + 21**2),
    "word-016": lambda: Fraction(6 * 400, 15),
    "word-017": lambda: max(n for n in range(100, 1000) if n % 13 == 0),
    "word-018": lambda: sum(1 for n in range(1, 200) if n % 6 == 0 and n % 9 != 0),
    "word-019": lambda: next(abs(a - (30 - a)) for a in range(31) if a * (30 - a) == 221),
    "word-020": lambda: Fraction(6 * 10, 4),
    "word-021": lambda: Fraction(
        sum(1 for a, b in itertools.combinations("RRRRBBBBBB", 2) if a == b), math.comb(10, 2)
    ),
    "word-022": lambda: next(3 * a for a in range(65) if a + 3 * a == 64),
    "word-023": lambda: sum(1 for n in range(1, 1001) if "7" in str(n)),
    "word-024": lambda: Fraction(60) / (Fraction(30, 15) + Fraction(30, 10)),
    "word-025": lambda: _fib_like(2, 5, 10),
    "word-026": lambda: next(n for n in range(3, 100) if Fraction(180 * (n - 2), n) == 156),
    "word-027": lambda: len(str(math.factorial(125))) - len(str(math.factorial(125)).rstrip("0")),
    "word-028": lambda: (7 + 3) * 12,
    "word-029": lambda: next(p for p in range(1, 1000) if Fraction(p * 70, 100) == 42),
    "word-030": lambda: next(n + 4 for n in range(-200, 200, 2) if n + (n + 2) + (n + 4) == 126),
    "word-031": lambda: math.comb(6, 2) + 6 * 4,
    "word-032": lambda: 1 / (Fraction(1, 12) - Fraction(1, 20)),
    "word-033": lambda: Fraction(
        sum(1 for d in _divisors(72) if math.isqrt(d) ** 2 == d), len(_divisors(72))
    ),
    "word-034": lambda: Fraction(3 * 10, 2),
    "word-035": lambda: sum(n for n in range(1, 101) if (n * n + 1) % 5 == 0),
    "word-036": lambda: Fraction(4 * math.isqrt(81), 3),
    "word-037": lambda: 2000 * Fraction(105, 100) ** 3 - 2000,
    "word-038": lambda: 5 * 18 - 4 * 16,
}


def test_word_problems_are_enough_unique_and_split():
    problems = word_problems()
    assert len(problems) >= 30
    assert len({p.id for p in problems}) == len(problems)
    assert len({p.question for p in problems}) == len(problems)
    assert {p.split for p in problems} == {"train", "test"}
    assert len(word_problems("train")) + len(word_problems("test")) == len(problems)
    assert all(p.difficulty in (1, 2, 3) and p.topic and p.source == "word" for p in problems)


@pytest.mark.parametrize("problem", word_problems(), ids=lambda p: p.id)
def test_word_problem_answer_matches_an_independent_solution(problem: MathProblem):
    expected = Fraction(WORD_SOLVERS[problem.id]())
    assert Fraction(problem.answer) == expected


def test_every_word_problem_has_a_solver():
    assert set(WORD_SOLVERS) == {p.id for p in word_problems()}


def test_word_problems_reject_unknown_split():
    with pytest.raises(ValueError, match="valid splits"):
        word_problems("validation")


# ---------------------------------------------------------------------------- generator


@functools.cache
def _count_arrangements(counts: tuple[int, ...]) -> int:
    """Distinct strings with these letter counts: choose the first letter, recurse."""
    if sum(counts) == 0:
        return 1
    total = 0
    for index, count in enumerate(counts):
        if count:
            rest = (*counts[:index], count - 1, *counts[index + 1 :])
            total += _count_arrangements(tuple(sorted(rest)))
    return total


def _independent_answer(params: dict) -> Fraction:
    """Re-solve a generated problem from its parameters, by other means than the generator."""
    kind = params["kind"]
    if kind == "order_of_operations":
        return Fraction(params["a"] + params["b"] * params["c"] - params["e"])
    if kind == "gcd":
        return Fraction(
            max(d for d in range(1, params["a"] + 1) if params["a"] % d == 0 and params["b"] % d == 0)
        )
    if kind == "lcm":
        return Fraction(next(m for m in itertools.count(params["a"], params["a"]) if m % params["b"] == 0))
    if kind == "remainder":
        return Fraction(params["n"] - params["m"] * (params["n"] // params["m"]))
    if kind == "digit_sum":
        n, total = params["n"], 0
        while n:
            n, digit = divmod(n, 10)
            total += digit
        return Fraction(total)
    if kind in ("linear_one_side", "linear_both_sides"):
        import sympy

        x = sympy.Symbol("x")
        a, b, e = params["a"], params["b"], params.get("e", params.get("c"))
        right = params["c"] * x + params["e"] if kind == "linear_both_sides" else e
        (root,) = sympy.solve(sympy.Eq(a * x + b, right), x)
        return Fraction(str(root))
    if kind == "percent":
        return Fraction(params["p"]) * params["n"] / 100
    if kind in ("fraction_sum",):
        return sum((Fraction(t) for t in params["terms"]), Fraction(0))
    if kind in ("system_two", "system_three"):
        import sympy

        names = "xyz"[: len(params["rows"])]
        symbols = sympy.symbols(" ".join(names))
        equations = [
            sympy.Eq(sum(c * s for c, s in zip(row, symbols, strict=True)), v)
            for row, v in zip(params["rows"], params["rhs"], strict=True)
        ]
        solution = sympy.solve(equations, symbols, dict=True)[0]
        value = sympy.sympify(
            params["target"].replace("xy", "x*y"), locals=dict(zip(names, symbols, strict=True))
        ).subs(solution)
        return Fraction(str(value))
    if kind == "divisor_count":
        return Fraction(len(_divisors(params["n"])))
    if kind == "divisor_sum":
        return Fraction(sum(_divisors(params["n"])))
    if kind == "power_mod":
        return Fraction(params["base"] ** params["exponent"] % params["modulus"])
    if kind == "committee":
        return Fraction(sum(1 for _ in itertools.combinations(range(params["n"]), params["k"])))
    if kind == "arithmetic_series":
        terms = [params["first"] + i * params["step"] for i in range(params["count"])]
        return Fraction(sum(terms))
    if kind == "quadratic":
        import sympy

        x = sympy.Symbol("x")
        roots = sorted(sympy.solve(params["lead"] * x**2 + params["b"] * x + params["c"], x))
        value = {
            "the larger root": roots[1],
            "the smaller root": roots[0],
            "the sum of the squares of its roots": roots[0] ** 2 + roots[1] ** 2,
            "the positive difference between its roots": roots[1] - roots[0],
        }[params["ask"]]
        return Fraction(str(value))
    if kind == "nested_fractions":
        p, q, r, t = (Fraction(params[k]) for k in "pqrt")
        return (p - q) * (1 / r) + t
    if kind == "totient":
        return Fraction(sum(1 for k in range(1, params["n"] + 1) if math.gcd(k, params["n"]) == 1))
    if kind == "inclusion_exclusion":
        return Fraction(
            sum(1 for k in range(1, params["n"] + 1) if k % params["a"] == 0 or k % params["b"] == 0)
        )
    if kind == "congruence":
        return Fraction(
            next(x for x in range(1, params["m"] + 1) if (params["a"] * x - params["b"]) % params["m"] == 0)
        )
    if kind == "arrangements":
        return Fraction(_count_arrangements(tuple(sorted(collections.Counter(params["word"]).values()))))
    raise AssertionError(f"no independent solver for kind {kind!r}")


@pytest.mark.parametrize("level", math_generator.LEVELS)
def test_generated_answers_match_independent_solutions(level):
    seen_kinds = set()
    for seed in [*range(40), *range(math_generator.TRAIN_SEED_START, math_generator.TRAIN_SEED_START + 60)]:
        problem = generated_problem(level, seed)
        seen_kinds.add(problem.params["kind"])
        assert Fraction(problem.answer) == _independent_answer(dict(problem.params)), problem
        assert problem.difficulty == level and problem.id == f"gen-L{level}-{seed}"
    assert seen_kinds == {name for name, _ in math_generator.KINDS[level]}


def test_generator_is_reproducible_and_pinned():
    assert math_generator.generate(2, 123) == math_generator.generate(2, 123)
    # Pinned values: a change here changes the fixed test split (bump the env version).
    assert generated_problem(1, 0).question == "What is the least common multiple of 22 and 36?"
    assert generated_problem(1, 0).answer == "396"
    assert generated_problem(3, 7).question.endswith("rearranging all the letters of AABBBBCCC?")
    assert generated_problem(3, 7).answer == "1260"


def test_generated_answers_are_exact_integers_or_reduced_fractions():
    for level in math_generator.LEVELS:
        for seed in range(200):
            answer = generated_problem(level, seed).answer
            value = Fraction(answer)
            assert answer == (
                str(value.numerator) if value.denominator == 1 else f"{value.numerator}/{value.denominator}"
            )


def test_generated_splits_are_disjoint():
    for level in math_generator.LEVELS:
        test_questions = math_generator.test_questions(level)
        assert len(test_questions) > 0.8 * math_generator.TEST_SEEDS
        rng = np.random.default_rng(level)
        for _ in range(300):
            seed = math_generator.sample_seed(
                level, "train", lambda lo, hi, rng=rng: int(rng.integers(lo, hi))
            )
            assert seed >= math_generator.TRAIN_SEED_START
            assert generated_problem(level, seed).question not in test_questions
        assert (
            0
            <= math_generator.sample_seed(level, "test", lambda lo, hi, rng=rng: int(rng.integers(lo, hi)))
            < 100
        )


def test_generator_rejects_bad_arguments():
    with pytest.raises(ValueError, match="valid levels"):
        math_generator.generate(7, 0)
    with pytest.raises(ValueError, match="seed"):
        math_generator.generate(1, -1)
    with pytest.raises(ValueError, match="valid splits"):
        math_generator.sample_seed(1, "dev", lambda lo, hi: lo)


# ---------------------------------------------------------------------------- problem sets


def test_builtin_mixes_word_and_generated_problems():
    problems = build_problem_set("builtin", "train")
    rng = np.random.default_rng(0)
    sources = [problems.sample(rng).source for _ in range(400)]
    share = sources.count("word") / len(sources)
    assert 0.15 < share < 0.35 and set(sources) == {"word", "generated"}
    assert problems.ids() is None  # training problems are unlimited
    test_ids = build_problem_set("builtin", "test").ids()
    assert len(test_ids) == 11 + 3 * math_generator.TEST_SEEDS


def test_problem_set_filters_and_lookups():
    words = build_problem_set("word", "test", difficulty=3)
    assert all(p.difficulty == 3 and p.split == "test" for p in words.fixed)
    generated = build_problem_set("generated", "train", difficulty=[1, 2])
    assert generated.levels == (1, 2) and not generated.fixed
    assert generated.get("gen-L2-5").question == generated_problem(2, 5).question
    with pytest.raises(KeyError, match="unknown problem id"):
        words.get("word-999")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"dataset": "nope"}, "unknown dataset 'nope'"),
        ({"split": "validation"}, "valid splits"),
        ({"difficulty": 9}, "valid: \\[1, 2, 3\\]"),
        ({"difficulty": "hard"}, "difficulty must be"),
        ({"dataset": str(FIXTURES / "gsm8k.jsonl"), "difficulty": 2}, "no problems left"),
        ({"dataset": str(FIXTURES / "missing.jsonl")}, "not found: .*missing.jsonl"),
        ({"dataset": str(FIXTURES / "gsm8k.jsonl"), "format": "mathx"}, "valid formats"),
    ],
)
def test_build_problem_set_errors_are_clear(kwargs, message):
    with pytest.raises((ValueError, KeyError), match=message):
        build_problem_set(**kwargs)


def test_problem_set_is_shared_by_copies_and_rejects_duplicates():
    import copy

    problems = build_problem_set("word")
    assert copy.deepcopy(problems) is problems
    duplicate = MathProblem("a", "q", "1", "custom")
    with pytest.raises(DatasetError, match="duplicate problem id 'a'"):
        ProblemSet([duplicate, duplicate])


# ---------------------------------------------------------------------------- public formats


def test_math_hendrycks_format():
    problems = load_math_records(FIXTURES / "math_hendrycks.jsonl")
    assert [p.answer for p in problems] == ["\\frac{5}{6}", "3", "2\\sqrt{3}", "\\{1,2,3\\}", "1024"]
    assert [p.difficulty for p in problems] == [1, 3, 2, None, 5]
    assert problems[0].topic == "Prealgebra" and problems[0].source == "MATH"
    assert problems[0].id == "MATH-0" and "\\boxed" in problems[0].solution


def test_math500_format_uses_its_answer_field():
    problems = load_math_records(str(FIXTURES / "math500.jsonl"))
    assert [(p.id, p.answer, p.difficulty, p.topic) for p in problems] == [
        ("test/prealgebra/1.json", "12", 1, "Prealgebra"),
        ("test/intermediate_algebra/7.json", "3", 2, "Intermediate Algebra"),
    ]


def test_gsm8k_format_strips_commas():
    problems = load_math_records(FIXTURES / "gsm8k.jsonl")
    assert [p.answer for p in problems] == ["10", "13500", "6"]
    assert problems[0].source == "GSM8K" and problems[0].difficulty is None
    assert problems[0].solution.endswith("12 - 2 = <<12-2=10>>10.")


def test_aime_formats_both_key_cases():
    upper = load_math_records(FIXTURES / "aime_capitalised.jsonl")
    assert [(p.id, p.answer, p.source) for p in upper] == [
        ("2024-I-1", "1", "AIME"),
        ("2024-I-2", "16", "AIME"),
    ]
    lower = load_math_records(FIXTURES / "aime_lowercase.json")
    assert [(p.id, p.answer, p.topic) for p in lower] == [
        ("60", "7", "AIME 2025"),
        ("61", "121", "AIME 2025"),
    ]


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("gsm8k_no_marker.jsonl", r"gsm8k_no_marker.jsonl: record 1 has no '#### <answer>'"),
        ("math_no_boxed.jsonl", r"math_no_boxed.jsonl: record 1 has no \\boxed\{\} answer"),
        ("broken.jsonl", r"broken.jsonl: line 2 is not valid JSON"),
    ],
)
def test_malformed_files_name_the_file_and_record(name, message):
    with pytest.raises(DatasetError, match=message):
        load_math_records(FIXTURES / name)


def test_malformed_records_name_the_record(tmp_path):
    path = tmp_path / "list.json"
    path.write_text(json.dumps([{"question": "q", "answer": "1"}, {"question": "q2"}]))
    with pytest.raises(DatasetError, match=r"list.json: record 1 has no 'answer' field"):
        load_math_records(path)
    path.write_text(json.dumps([{"question": "q", "answer": "1"}, 5]))
    with pytest.raises(DatasetError, match="record 1 is a int"):
        read_records(path)
    with pytest.raises(DatasetError, match="record 0 is a str"):
        problems_from_records(["not a record"])


def test_hf_to_json_output_is_read_as_json_lines(tmp_path):
    # datasets.Dataset.to_json("x.json") writes JSON lines despite the extension.
    path = tmp_path / "gsm8k.json"
    path.write_text((FIXTURES / "gsm8k.jsonl").read_text())
    assert [p.answer for p in load_math_records(path)] == ["10", "13500", "6"]


def test_gzip_files_load_as_published():
    plain = load_math_records(FIXTURES / "gsm8k.jsonl")
    assert load_math_records(FIXTURES / "gsm8k.jsonl.gz") == plain
    problem_set = build_problem_set(str(FIXTURES / "gsm8k.jsonl.gz"), split="test")
    assert [problem_set.get(p.id) for p in plain] == plain


def test_gzip_and_text_errors_are_clear(tmp_path):
    path = tmp_path / "data.jsonl.gz"
    path.write_bytes(b"plain text, not gzip")
    with pytest.raises(DatasetError, match=r"data.jsonl.gz: cannot read it as a gzip file"):
        read_records(path)
    packed = tmp_path / "packed.jsonl"  # gzip bytes under a plain name
    packed.write_bytes((FIXTURES / "gsm8k.jsonl.gz").read_bytes())
    with pytest.raises(DatasetError, match=r"packed.jsonl: not UTF-8 text \(compressed\? name it \*.gz\)"):
        read_records(packed)


def test_a_json_object_file_names_its_keys_and_one_line_is_still_one_record(tmp_path):
    with pytest.raises(
        DatasetError, match=r"one JSON object with the keys \['concepts', 'hints', 'problems'\]"
    ):
        read_records(FIXTURES / "champ_object.json")
    one_line = tmp_path / "one.json"
    one_line.write_text(json.dumps({"question": "1 + 1?", "answer": "2"}) + "\n")
    assert [p.answer for p in load_math_records(one_line)] == ["2"]


class FakeDataset:
    """What Math-v0 relies on in a datasets.Dataset: iteration over dict records (and .info)."""

    class info:
        dataset_name = "fake_gsm8k"

    def __init__(self, records):
        self._records = records

    def __iter__(self):
        return iter(self._records)

    def __len__(self):
        return len(self._records)


def test_datasets_objects_are_used_duck_typed():
    records = [json.loads(line) for line in (FIXTURES / "gsm8k.jsonl").read_text().splitlines()]
    assert [p.answer for p in load_math_records(FakeDataset(records))] == ["10", "13500", "6"]
    splits = {"train": FakeDataset(records[:2]), "test": FakeDataset(records[2:])}
    assert [p.answer for p in load_math_records(splits, split="test")] == ["6"]
    with pytest.raises(DatasetError, match=r"splits \['test', 'train'\]"):
        load_math_records(splits, split="validation")
    with pytest.raises(DatasetError, match=r"dataset 'fake_gsm8k': record 0 has no 'answer'"):
        load_math_records(FakeDataset([{"question": "q"}]), format="gsm8k")
    with pytest.raises(DatasetError, match="cannot read problems from a int"):
        load_math_records(5)


def test_parquet_without_pyarrow_names_the_package(tmp_path, monkeypatch):
    path = tmp_path / "data.parquet"
    path.write_bytes(b"PAR1")
    real_import = builtins.__import__

    def no_pyarrow(name, *args, **kwargs):
        if name.startswith("pyarrow"):
            raise ImportError("No module named 'pyarrow'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_pyarrow)
    with pytest.raises(DatasetError, match="needs the 'pyarrow' package: pip install pyarrow"):
        read_records(path)


def test_parquet_file_in_math_format(tmp_path):
    pyarrow = pytest.importorskip("pyarrow")
    import pyarrow.parquet as parquet

    records = [json.loads(line) for line in (FIXTURES / "math_hendrycks.jsonl").read_text().splitlines()]
    path = tmp_path / "math.parquet"
    parquet.write_table(pyarrow.Table.from_pylist(records), path)
    assert [p.answer for p in load_math_records(path)][:2] == ["\\frac{5}{6}", "3"]
    bad = tmp_path / "bad.parquet"
    bad.write_bytes(b"not parquet")
    with pytest.raises(DatasetError, match=r"bad\.parquet: not a readable parquet file"):
        read_records(bad)


def test_real_hugging_face_datasets_objects_and_files(tmp_path):
    datasets = pytest.importorskip("datasets")
    records = [json.loads(line) for line in (FIXTURES / "math_hendrycks.jsonl").read_text().splitlines()]
    dataset = datasets.Dataset.from_list(records)
    assert [p.answer for p in load_math_records(dataset)][:2] == ["\\frac{5}{6}", "3"]
    splits = datasets.DatasetDict({"train": dataset.select([0, 1]), "test": dataset.select([2])})
    assert [p.answer for p in load_math_records(splits, split="test")] == ["2\\sqrt{3}"]
    # Files as `datasets` writes them: to_json writes JSON lines, to_parquet a parquet file.
    dataset.to_json(tmp_path / "math.json")
    assert len(load_math_records(tmp_path / "math.json")) == len(records)
    dataset.to_parquet(tmp_path / "math.parquet")
    assert [p.difficulty for p in load_math_records(tmp_path / "math.parquet")] == [1, 3, 2, None, 5]
