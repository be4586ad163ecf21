"""Code-v0's answer formats: the role instructions of its prompts, the state they show (the current
program, tests and disagreements) and the parser of the unit tester's answers, for both problem
kinds (see :mod:`llm_zoo.envs.code`)."""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from typing import Any

from llm_zoo.checkers.call_harness import call_text, literal
from llm_zoo.core import MAX_ACTION_CHARS
from llm_zoo.data.code import CallSpec, CodeDatasetError, TestCase
from llm_zoo.data.code_problem import call_test
from llm_zoo.parsing import ParseError, extract_code_block

__all__ = [
    "MAX_TESTS_JSON_CHARS",
    "ROLE_INTRO",
    "call_test_json",
    "parse_tests",
    "state_text",
    "task_text",
    "test_json",
]

#: Tester answers (the JSON block) longer than this are refused (the declared action size).
MAX_TESTS_JSON_CHARS = MAX_ACTION_CHARS

ROLE_INTRO = {
    "coder": "You are the CODER in a team of two: you write a program that solves the problem below, "
    "and a unit tester writes test cases for it.",
    "unit_tester": "You are the UNIT TESTER in a team of two: a coder writes a program for the problem "
    "below, and you write test cases that check whether it is correct.",
}

_STDIO_TASK = {
    "coder": (
        "# Your task\nWrite a complete Python 3 program that reads the input from standard input and "
        "prints the answer to standard output. It is judged on hidden tests (time limit {timeout:g} s per "
        "test): output is compared line by line, ignoring trailing whitespace; numbers are compared with a "
        "tolerance of 1e-6. Reply with the whole program in one ```python code block; text outside the "
        "block is ignored. If the unit tester's tests disagree with your program, decide whether your "
        "program or the test is wrong."
    ),
    "unit_tester": (
        "# Your task\nWrite up to {max_tests} test cases: each an input that follows the problem's input "
        "format and constraints, with the exact output a correct program prints for it. Correct tests "
        "that the coder's current program fails are worth the most; a test with a wrong expected output "
        "is penalized. Reply with a JSON list in one ```json code block (write line breaks as \\n); it "
        'replaces your previous tests:\n```json\n[{{"input": "3\\n1 2 3\\n", "output": "6\\n"}}]\n```'
    ),
}

_CALL_TASK = {
    "coder": (
        "# Your task\nWrite Python 3 code that defines {what}, with the signature shown above. It is "
        "judged on hidden tests (time limit {timeout:g} s per test): each test calls {target}(...) with "
        "its arguments and compares the return value with the expected one (lists and tuples alike; "
        "numbers with a tolerance of 1e-6). Return the answer; do not read input or print it. Reply with "
        "the whole code (imports, helper functions and {what}) in one ```python code block; text outside "
        "the block is ignored. If the unit tester's tests disagree with your code, decide whether your "
        "code or the test is wrong."
    ),
    "unit_tester": (
        "# Your task\nWrite up to {max_tests} test cases for {target}: each the list of arguments of one "
        "call, in the signature's order and within the problem's constraints, with the exact value a "
        "correct solution returns. Correct tests that the coder's current code fails are worth the most; "
        "a test with a wrong expected value is penalized. Reply with a JSON list in one ```json code "
        "block; it replaces your previous tests. For a call {target}([1, 2], 3) that returns 6:\n```json\n"
        '[{{"input": [[1, 2], 3], "output": 6}}]\n```'
    ),
}


def task_text(agent: str, call: CallSpec | None, *, max_tests: int, timeout: float) -> str:
    """The ``# Your task`` section for ``agent`` on a stdin/stdout (``call is None``) or call-based problem."""
    if call is None:
        return _STDIO_TASK[agent].format(max_tests=max_tests, timeout=timeout)
    what = (
        f"class {call.class_name} with the method {call.name}"
        if call.class_name
        else f"the function {call.name}"
    )
    return _CALL_TASK[agent].format(max_tests=max_tests, timeout=timeout, what=what, target=call.target)


@functools.lru_cache(maxsize=256)  # prompts list the same tests at every step
def call_test_json(args_literal: str, expected_literal: str) -> str:
    """A stored call-based test as the tester writes it, ``{"input": [...], "output": ...}``."""
    return test_json({"input": literal(args_literal), "output": literal(expected_literal)})


def test_json(item: Any) -> str:
    """A test object as JSON for prompts (sets as sorted lists, other odd values by ``repr``)."""
    return json.dumps(
        item, default=lambda o: sorted(o, key=repr) if isinstance(o, (set, frozenset)) else repr(o)
    )


def parse_tests(text: str, max_tests: int, *, call: bool = False) -> tuple[list[TestCase], str]:
    """Parse the unit tester's answer: a ```` ```json ```` block holding a list of test objects,
    ``{"input": str, "output": str}`` for stdin/stdout, ``{"input": [arguments...], "output":
    value}`` when ``call``. Returns the tests (at most ``max_tests``) and a note (non-empty
    when the list was cut). Raises :class:`ParseError` with a message for the model."""
    try:
        block = extract_code_block(text, languages=("json",))
    except ParseError:
        raise ParseError(
            "no complete ```json block found: put the test list in one block that opens with ```json on "
            "its own line and closes with ``` on its own line"
        ) from None
    if len(block) > MAX_TESTS_JSON_CHARS:
        raise ParseError(f"the JSON block is longer than {MAX_TESTS_JSON_CHARS} characters")
    try:
        data = json.loads(block)
    except (ValueError, RecursionError) as err:  # ValueError: JSONDecodeError, or an int over 4300 digits
        raise ParseError(f"the ```json block is not valid JSON ({str(err)[:200]})") from None
    example = '[{"input": [[1, 2], 3], "output": 6}]' if call else '[{"input": "1 2\\n", "output": "3\\n"}]'
    if not isinstance(data, list):
        raise ParseError(f"the JSON must be a list of test objects, like {example}")
    if not data:
        raise ParseError("the list of tests is empty: write at least one test")
    tests = []
    for position, item in enumerate(data[:max_tests], start=1):
        if not isinstance(item, dict) or "input" not in item or "output" not in item:
            raise ParseError(
                f'test {position} must be an object with the keys "input" and "output", like {example}'
            )
        if call:
            if not isinstance(item["input"], list):
                raise ParseError(
                    f'test {position}: "input" must be the list of arguments, got {type(item["input"]).__name__}'
                )
            try:
                tests.append(call_test(item["input"], item["output"]))
            except (CodeDatasetError, RecursionError) as err:
                raise ParseError(f"test {position}: {err}") from None
            continue
        for key in ("input", "output"):
            if not isinstance(item.get(key), str):
                raise ParseError(
                    f'test {position}: "{key}" must be a string (write line breaks as \\n), got '
                    f"{type(item.get(key)).__name__}"
                )
        tests.append(TestCase(item["input"], item["output"]))
    note = f"Only your first {max_tests} tests were kept." if len(data) > max_tests else ""
    return tests, note


# ------------------------------------------------------------------------------------ the state

_SHOWN_CHARS = 400  # per input / output in prompts
_SHOWN_DISAGREEMENTS = 5


def _clip(text: str, limit: int = _SHOWN_CHARS) -> str:
    return text if len(text) <= limit else text[:limit] + f"... [{len(text) - limit} more characters]"


def _shown(label: str, text: str) -> str:
    """A labelled block of program text for a prompt: fenced, clipped, ``(empty)`` when empty."""
    body = _clip(text).rstrip("\n")
    return f"{label}:\n```\n{body}\n```" if body.strip() else f"{label}: (empty)"


def state_text(
    agent: str,
    program: str | None,
    tests: Sequence[TestCase],
    results: Sequence[tuple[bool, str]],
    call: CallSpec | None,
) -> str:
    """The part of ``agent``'s prompt that changes during an episode: the current ``program``, the
    unit tester's current ``tests`` (listed to the tester only) and the program's ``results`` on
    them, with its first disagreements shown."""
    whose = "Your" if agent == "coder" else "The coder's"
    lines = []
    if program is None:
        lines.append(f"## {whose} current program\n(none yet)")
    else:
        lines.append(f"## {whose} current program\n```python\n{program.rstrip()}\n```")
    whose_tests = "Your" if agent == "unit_tester" else "The unit tester's"
    if not tests:
        lines.append(f"## {whose_tests} current tests\n(none yet)")
        return "\n\n".join(lines)
    if agent == "unit_tester":
        listing = ",\n".join(_shown_test(t, call) for t in tests)
        lines.append(f"## Your current tests\n```json\n[\n{_clip(listing, 4000)}\n]\n```")
    if program is None:
        return "\n\n".join(lines)
    failing = [i for i, (passed, _) in enumerate(results) if not passed]
    header = f"## {whose_tests} tests: the program passes {len(tests) - len(failing)} of {len(tests)}"
    lines.append(header if failing else header + " (no disagreements)")
    for index in failing[:_SHOWN_DISAGREEMENTS]:
        test, (_, got) = tests[index], results[index]
        lines.append(f"### Disagreement on test {index + 1}\n{_disagreement(test, got, call)}")
    if len(failing) > _SHOWN_DISAGREEMENTS:
        lines.append(f"({len(failing) - _SHOWN_DISAGREEMENTS} more disagreements not shown)")
    return "\n\n".join(lines)


def _shown_test(test: TestCase, call: CallSpec | None) -> str:
    if call is None:
        return test_json({"input": test.input, "output": test.output})
    return call_test_json(test.input, test.output)


def _disagreement(test: TestCase, got: str, call: CallSpec | None) -> str:
    if call is None:
        return f"{_shown('input', test.input)}\n{_shown('expected output', test.output)}\n{_shown('program output', got)}"
    return (
        f"{_shown('call', call_text(call.target, test.input))}\n"
        f"{_shown('expected return value', test.output)}\n{_shown('returned', got)}"
    )
