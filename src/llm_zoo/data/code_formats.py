"""Record converters for the stdin/stdout and LeetCode-style dataset formats of ``Code-v0``.

``llm_zoo`` (this project's own), APPS, CodeContests and LiveCodeBench; see
:mod:`llm_zoo.data.code` for the field lists. HumanEval and MBPP live in
:mod:`llm_zoo.data.code_call_formats`. Each converter takes one record and returns a
:class:`~llm_zoo.data.code_problem.CodeProblem`, or ``None`` for a record that is skipped.
"""

from __future__ import annotations

import base64
import binascii
import io
import json
import pickle
import zlib
from collections.abc import Mapping
from typing import Any

from llm_zoo.data.code_problem import (
    CHECK_TEST,
    CallSpec,
    CodeDatasetError,
    CodeProblem,
    TestCase,
    call_test,
    field_value,
    json_field,
    stdio_tests,
    stdio_text,
)

__all__ = [
    "CODE_CONTESTS_DIFFICULTY",
    "MAX_DECOMPRESSED_BYTES",
    "decode_livecodebench_tests",
    "from_apps",
    "from_code_contests",
    "from_livecodebench",
    "from_llm_zoo",
    "leetcode_class",
]

#: Largest decompressed LiveCodeBench test payload accepted (bytes).
MAX_DECOMPRESSED_BYTES = 256 << 20

#: CodeContests ``difficulty`` enum value -> easy / medium / hard (0 UNKNOWN and 6 EXTERNAL -> unknown).
#: 1 EASY, 2 MEDIUM, 3-5 HARD/HARDER/HARDEST; 7.. are Codeforces letters A, B, C, ...
CODE_CONTESTS_DIFFICULTY = {1: "easy", 2: "medium", 3: "hard", 4: "hard", 5: "hard", 7: "easy", 8: "easy"}
CODE_CONTESTS_DIFFICULTY.update({9: "medium", 10: "medium"})
CODE_CONTESTS_DIFFICULTY.update({letter: "hard" for letter in range(11, 29)})
_PYTHON3 = 3
_APPS_DIFFICULTY = {"introductory": "easy", "interview": "medium", "competition": "hard"}


def leetcode_class(starter_code: str) -> str | None:
    """``"Solution"`` when the starter code declares ``class Solution`` (LeetCode style), else ``None``."""
    return "Solution" if "class Solution" in (starter_code or "") else None


def _call_spec(record: Mapping[str, Any], key: str, name: Any, starter: Any, **options: Any) -> CallSpec:
    if not isinstance(name, str) or not name.isidentifier():
        raise CodeDatasetError(f"{key}: the function name should be a Python identifier, got {name!r}")
    starter = starter if isinstance(starter, str) else ""
    return CallSpec(name, leetcode_class(starter), starter.rstrip(), **options)


def from_llm_zoo(record: Mapping[str, Any]) -> CodeProblem:
    """A record in this project's own format (see :mod:`llm_zoo.data.code`)."""
    raw_tests = field_value(record, "tests", list)
    call = record.get("call")
    if call is not None:
        if not isinstance(call, Mapping) or not isinstance(call.get("name"), str):
            raise CodeDatasetError("field 'call' should be an object with a string 'name'")
        checker = call.get("checker")
        if checker is not None and not isinstance(checker, str):
            raise CodeDatasetError("field 'call': 'checker' should be test source (a string) or null")
        try:
            spec = CallSpec(
                str(call["name"]), call.get("class_name"), str(call.get("signature") or ""), checker=checker
            )
        except ValueError as err:
            raise CodeDatasetError(f"field 'call': {err}") from None
    tests = []
    for n, test in enumerate(raw_tests):
        if not isinstance(test, Mapping) or "input" not in test or "output" not in test:
            raise CodeDatasetError(f"test {n} should be an object with the fields 'input' and 'output'")
        if call is not None:
            if not isinstance(test["input"], list):
                raise CodeDatasetError(f"test {n}: 'input' should be the list of arguments")
            tests.append(call_test(test["input"], test["output"]))
        elif isinstance(test["input"], str) and isinstance(test["output"], str):
            tests.append(TestCase(test["input"], test["output"]))
        else:
            raise CodeDatasetError(f"test {n} should be an object with string fields 'input' and 'output'")
    if call is not None and spec.checker is not None:
        tests.append(CHECK_TEST)
    if not tests:
        raise CodeDatasetError("field 'tests' is empty")
    reference = record.get("reference")
    if reference is not None and not isinstance(reference, str):
        raise CodeDatasetError(f"field 'reference' should be a string, got {type(reference).__name__}")
    metadata = record.get("metadata") or {}
    if not isinstance(metadata, Mapping):
        raise CodeDatasetError("field 'metadata' should be an object")
    return CodeProblem(
        id=field_value(record, "id"),
        statement=field_value(record, "statement"),
        tests=tuple(tests),
        reference=reference or None,
        difficulty=str(record.get("difficulty") or "unknown"),
        source=str(record.get("source") or "llm_zoo"),
        title=str(record.get("title") or ""),
        split=record.get("split") or None,
        metadata=dict(metadata),
        call=spec if call is not None else None,
    )


def _int_keyed(value: Any) -> dict | None:
    try:
        return {int(key): item for key, item in value.items()}
    except (TypeError, ValueError):
        return None


def _apps_int_keys(args: list[Any], expected: Any) -> tuple[list[Any], Any]:
    """What APPS's harness does to a call-based test, since JSON keys are strings: a first
    argument that is a dict with integer-like keys becomes the only argument, int-keyed; an
    expected dict (or a list starting with one) with such keys becomes ``[that dict, int-keyed]``."""
    if args and isinstance(args[0], dict) and (keyed := _int_keyed(args[0])) is not None:
        args = [keyed]
    if isinstance(expected, dict) and (keyed := _int_keyed(expected)) is not None:
        expected = [keyed]
    first = expected[0] if isinstance(expected, list) and expected else None
    if isinstance(first, dict) and (keyed := _int_keyed(first)) is not None:
        expected = [keyed]
    return args, expected


def from_apps(record: Mapping[str, Any]) -> CodeProblem | None:
    """An APPS record, stdin/stdout or call-based (``fn_name``); ``None`` if it has no tests."""
    problem_id = field_value(record, "problem_id", (int, str))
    question = field_value(record, "question")
    io_spec = json_field(record, "input_output", {})
    if not isinstance(io_spec, Mapping):
        raise CodeDatasetError("field 'input_output' should hold a JSON object")
    inputs, outputs = io_spec.get("inputs", []), io_spec.get("outputs", [])
    call = None
    if io_spec.get("fn_name"):
        starter = record.get("starter_code") or ""
        call = _call_spec(record, "input_output", io_spec["fn_name"], starter, lenient_singleton=True)
        if not isinstance(inputs, list) or not isinstance(outputs, list) or len(inputs) != len(outputs):
            raise CodeDatasetError("input_output: 'inputs' and 'outputs' should be lists of equal length")
        for n, args in enumerate(inputs):
            if not isinstance(args, list):
                raise CodeDatasetError(f"input_output input {n} should be the list of arguments")
        tests = [
            call_test(*_apps_int_keys(args, expected)) for args, expected in zip(inputs, outputs, strict=True)
        ]
    else:
        tests = stdio_tests(inputs, outputs, "input_output")
    if not tests:
        return None
    solutions = json_field(record, "solutions", [])
    if not isinstance(solutions, list) or not all(isinstance(s, str) for s in solutions):
        raise CodeDatasetError("field 'solutions' should hold a JSON list of strings")
    raw_difficulty = str(record.get("difficulty") or "")
    return CodeProblem(
        id=f"apps/{problem_id}",
        statement=question,
        tests=tuple(tests),
        reference=solutions[0] if solutions else None,
        difficulty=_APPS_DIFFICULTY.get(raw_difficulty, "unknown"),
        source="apps",
        metadata={"url": record.get("url") or "", "raw_difficulty": raw_difficulty},
        call=call,
    )


def from_code_contests(record: Mapping[str, Any]) -> CodeProblem | None:
    """A CodeContests record; ``None`` for a file-I/O problem or one without tests."""
    name = field_value(record, "name")
    description = field_value(record, "description")
    if record.get("input_file") or record.get("output_file"):
        return None  # reads/writes named files, not stdin/stdout
    tests: list[TestCase] = []
    seen: set[TestCase] = set()
    for key in ("public_tests", "private_tests", "generated_tests"):
        group = record.get(key) or {}
        if not isinstance(group, Mapping):
            raise CodeDatasetError(f"field {key!r} should be an object with 'input' and 'output' lists")
        for test in stdio_tests(group.get("input") or [], group.get("output") or [], key):
            if test not in seen:
                seen.add(test)
                tests.append(test)
    if not tests:
        return None
    solutions = record.get("solutions") or {}
    if not isinstance(solutions, Mapping):
        raise CodeDatasetError("field 'solutions' should be an object with 'language' and 'solution' lists")
    languages, programs = solutions.get("language") or [], solutions.get("solution") or []
    reference = next(
        (p for lang, p in zip(languages, programs, strict=False) if lang == _PYTHON3 and isinstance(p, str)),
        None,
    )
    raw_difficulty = record.get("difficulty")
    difficulty = (
        CODE_CONTESTS_DIFFICULTY.get(raw_difficulty, "unknown")
        if isinstance(raw_difficulty, int)
        else "unknown"
    )
    return CodeProblem(
        id=f"code_contests/{name}",
        statement=description,
        tests=tuple(tests),
        reference=reference,
        difficulty=difficulty,
        source="code_contests",
        title=name,
        metadata={"raw_difficulty": raw_difficulty, "cf_rating": record.get("cf_rating")},
    )


def _functional_test(case: Mapping[str, Any], n: int) -> TestCase:
    """A LiveCodeBench ``functional`` test: one JSON value per line of ``input`` (the arguments
    in order) and the JSON of the return value in ``output``, as LiveCodeBench's harness reads them."""
    try:
        raw_input, raw_output = case["input"], case["output"]
        args = [json.loads(line) for line in raw_input.split("\n") if line.strip()]
        expected = json.loads(raw_output)
    except (AttributeError, TypeError, json.JSONDecodeError) as err:
        raise CodeDatasetError(
            f"functional test {n}: input lines and output should be JSON ({err})"
        ) from None
    return call_test(args, expected)


def from_livecodebench(record: Mapping[str, Any]) -> CodeProblem | None:
    """A LiveCodeBench ``code_generation_lite`` record, stdin or functional (LeetCode, called as
    ``Solution().<metadata.func_name>``); ``None`` if it has no tests of its kind."""
    question_id = field_value(record, "question_id", (str, int))
    content = field_value(record, "question_content")
    public = json_field(record, "public_test_cases", [])
    private = decode_livecodebench_tests(record.get("private_test_cases"))
    cases = [*public, *private]
    for n, case in enumerate(cases):
        if not isinstance(case, Mapping) or "input" not in case or "output" not in case:
            raise CodeDatasetError(f"test case {n} should be an object with 'input', 'output', 'testtype'")
    # A problem's tests share one kind; the first test's kind decides, others are left out.
    kind = cases[0].get("testtype", "stdin") if cases else "stdin"
    call = None
    if kind == "functional":
        metadata = json_field(record, "metadata", {})
        if not isinstance(metadata, Mapping) or not metadata.get("func_name"):
            raise CodeDatasetError("functional tests need 'func_name' in the field 'metadata'")
        call = _call_spec(record, "metadata", metadata["func_name"], record.get("starter_code"))
    tests = [
        _functional_test(case, n)
        if kind == "functional"
        else TestCase(
            stdio_text(case["input"], f"test {n} input"), stdio_text(case["output"], f"test {n} output")
        )
        for n, case in enumerate(cases)
        if case.get("testtype", "stdin") == kind
    ]
    if not tests:
        return None
    raw_difficulty = str(record.get("difficulty") or "").lower()
    return CodeProblem(
        id=f"livecodebench/{question_id}",
        statement=content,
        tests=tuple(tests),
        reference=None,
        difficulty=raw_difficulty if raw_difficulty in {"easy", "medium", "hard"} else "unknown",
        source="livecodebench",
        title=str(record.get("question_title") or ""),
        metadata={
            "platform": record.get("platform") or "",
            "contest_id": record.get("contest_id") or "",
            "contest_date": str(record.get("contest_date") or ""),
        },
        call=call,
    )


class _PlainValuesUnpickler(pickle.Unpickler):
    """Unpickles plain values only: every global (class, function) is refused."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"refusing to load {module}.{name}: only plain values are allowed")


def decode_livecodebench_tests(value: Any) -> list[Any]:
    """Decode LiveCodeBench ``private_test_cases``: JSON text, or base64(zlib(pickle(JSON text)))."""
    if value is None or value == "":
        return []
    if isinstance(value, list):
        return value
    if not isinstance(value, str):
        raise CodeDatasetError(f"field 'private_test_cases' should be a string, got {type(value).__name__}")
    try:
        decoded = json.loads(value)
    except json.JSONDecodeError:
        try:
            decoded = json.loads(_unpack_compressed(value))
        except json.JSONDecodeError as err:
            raise CodeDatasetError(f"field 'private_test_cases' holds invalid JSON ({err})") from None
    if not isinstance(decoded, list):
        raise CodeDatasetError("field 'private_test_cases' should decode to a list of test cases")
    return decoded


def _unpack_compressed(value: str) -> str:
    problem = "field 'private_test_cases' is neither JSON nor base64(zlib(pickle(JSON)))"
    try:
        packed = base64.b64decode(value.encode("ascii"), validate=True)
        inflater = zlib.decompressobj()
        raw = inflater.decompress(packed, MAX_DECOMPRESSED_BYTES)
        if inflater.unconsumed_tail:
            raise CodeDatasetError(f"{problem}: decompressed size exceeds {MAX_DECOMPRESSED_BYTES} bytes")
        text = _PlainValuesUnpickler(io.BytesIO(raw)).load()
    except CodeDatasetError:
        raise
    except (binascii.Error, UnicodeEncodeError, zlib.error) as err:
        raise CodeDatasetError(f"{problem} ({type(err).__name__}: {err})") from None
    except Exception as err:  # a malformed pickle can fail in many ways; none may crash the loader
        raise CodeDatasetError(f"{problem} (unpickling failed: {type(err).__name__}: {err})") from None
    if not isinstance(text, str):
        raise CodeDatasetError(f"{problem}: the pickle holds {type(text).__name__}, expected str")
    return text
