"""The role instructions of Code-v0's prompts, for both problem kinds (see :mod:`llm_zoo.envs.code`)."""

from __future__ import annotations

from llm_zoo.data.code import CallSpec

__all__ = ["ROLE_INTRO", "task_text"]

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
