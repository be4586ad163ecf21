"""Judging Code-v0 programs: stdout comparison, call-based return values, sandbox runs.

:func:`outputs_match` is the stdin/stdout judge. :class:`StdioJudge` and :class:`CallJudge`
turn a candidate's code and a :class:`~llm_zoo.data.code.TestCase` into what runs in the sandbox
(a program and its standard input) and a verdict on the run (:meth:`Judge.evaluate`);
:func:`judge_for` picks one for a problem. A call-based problem's check (test source rather than
fixed calls) is run by :meth:`CallJudge.run_check`, see :mod:`llm_zoo.checkers.call_checker`. :func:`run_program_on_inputs` runs one program on many standard inputs. See the
:mod:`llm_zoo.envs.code` docstring for the rules and :mod:`llm_zoo.checkers.call_harness` for calls.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from decimal import Decimal
from typing import Any

from llm_zoo import sandbox
from llm_zoo.checkers.call_checker import (
    CHECK_INPUT,
    CHECK_TIME_FACTOR,
    MAX_CHECK_CALLS,
    MAX_CHECK_ROUNDS,
    checker_program,
    checker_stdin,
    read_checker_report,
)
from llm_zoo.checkers.call_harness import (
    TOLERANCE,
    batch_stdin,
    call_stdin,
    call_text,
    canonical_literal,
    harness_program,
    literal,
    read_call_result,
    read_call_results,
    values_match,
)
from llm_zoo.data.code import CallSpec, CodeProblem, TestCase
from llm_zoo.sandbox import RunResult

__all__ = [
    "MAX_TIMEOUTS",
    "TOLERANCE",
    "CallJudge",
    "Judge",
    "Runner",
    "StdioJudge",
    "judge_for",
    "normalized_output",
    "output_or_error",
    "outputs_match",
    "run_program_on_inputs",
]

#: Once a program has timed out this often in one evaluation, its remaining batches fail unrun.
MAX_TIMEOUTS = 2

_PARALLEL_RUNS = 2  # worker threads for the per-test fallback when the sandbox has no batch API

_NUMBER = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?")  # no overlapping quantifiers: linear
_INTEGER = re.compile(r"[+-]?\d+")


def _significant_lines(text: str) -> list[str]:
    lines = [line.rstrip() for line in text.splitlines()]
    while lines and not lines[-1]:
        lines.pop()
    return lines


def _canonical_int(token: str) -> str:
    sign = "-" if token.startswith("-") else ""
    digits = token.lstrip("+-").lstrip("0") or "0"
    return ("" if digits == "0" else sign) + digits


def _tokens_match(expected: str, actual: str, tolerance: float) -> bool:
    if expected == actual:
        return True
    if not (_NUMBER.fullmatch(expected) and _NUMBER.fullmatch(actual)):
        return False
    if _INTEGER.fullmatch(expected):
        # an integer answer is exact: "2039606336.0" for 2039605317 is within 1e-6 but wrong;
        # "75.0" for 75 is the same number (Decimal compares exactly, however long)
        if _INTEGER.fullmatch(actual):
            return _canonical_int(expected) == _canonical_int(actual)
        try:
            return Decimal(expected) == Decimal(actual)
        except ArithmeticError:  # an exponent beyond Decimal's range ("1e" + 30 nines): not the integer
            return False
    x, y = float(expected), float(actual)
    return math.isfinite(x) and math.isfinite(y) and math.isclose(x, y, rel_tol=tolerance, abs_tol=tolerance)


def outputs_match(expected: str, actual: str, *, tolerance: float = TOLERANCE) -> bool:
    """Whether ``actual`` program output is accepted for ``expected``, as a judge would.

    Line by line after stripping trailing whitespace, trailing empty lines ignored. Lines that
    differ are split into whitespace-separated tokens: the token counts must agree and each pair be
    equal, or both integers of equal value, or, where the expected token is a number that is not
    an integer, both numbers within ``tolerance`` (absolute or relative). An expected integer
    accepts only a number of exactly its value: ``"1.0"`` matches ``"1"``, ``"1.0000001"`` does
    not, nor does ``"1000000007"`` match ``"1000000008"``; ``"1.0000001"`` matches ``"1.0"``.
    """
    expected_lines, actual_lines = _significant_lines(expected), _significant_lines(actual)
    if len(expected_lines) != len(actual_lines):
        return False
    for want, got in zip(expected_lines, actual_lines, strict=True):
        if want == got:
            continue
        want_tokens, got_tokens = want.split(), got.split()
        if len(want_tokens) != len(got_tokens):
            return False
        if not all(_tokens_match(w, g, tolerance) for w, g in zip(want_tokens, got_tokens, strict=True)):
            return False
    return True


def normalized_output(text: str) -> str:
    """``text`` without trailing whitespace on each line and without trailing empty lines."""
    return "\n".join(_significant_lines(text))


def run_program_on_inputs(code: str, inputs: list[str], timeout: float, memory_mb: int) -> list[RunResult]:
    """Run one program on many stdins through the sandbox; one :class:`RunResult` per input.

    Uses the sandbox's batch API (``run_tests``) when it has one, else one ``run_python`` per
    input on a few threads (each run is its own process, so threads only wait).
    """
    batch = getattr(sandbox, "run_tests", None)
    if callable(batch):
        return list(batch(code, list(inputs), timeout=timeout, memory_mb=memory_mb))

    def run_one(stdin: str) -> RunResult:
        return sandbox.run_python(code, stdin=stdin, timeout=timeout, memory_mb=memory_mb)

    if len(inputs) <= 1:
        return [run_one(stdin) for stdin in inputs]
    with ThreadPoolExecutor(max_workers=_PARALLEL_RUNS) as pool:
        return list(pool.map(run_one, inputs))


def output_or_error(run: RunResult, timeout: float) -> str | None:
    """What to show for a failed run (time-out, sandbox failure, a run that left memory behind for
    the runs after it, crash), ``None`` if it ran fine."""
    if run.timed_out:
        return f"(time limit exceeded: {timeout:g} s)"
    if getattr(run, "error", None):
        return f"(not run: sandbox failure: {run.error})"
    if getattr(run, "left_behind", None):  # hostile to the runs after it: fails whatever it printed
        return f"(the program left something behind: {run.left_behind})"
    if run.exit_code is None:
        return f"(not run: {run.stderr.strip()})"
    if run.exit_code != 0:
        tail = "\n".join(run.stderr.strip().splitlines()[-4:])
        return f"(runtime error, exit code {run.exit_code})\n{tail}".rstrip()
    return None


#: Runs one program on several standard inputs: ``run(program, stdins) -> results`` (the env's
#: cached :meth:`~llm_zoo.envs.code.CodeEnv._run`, or :func:`run_program_on_inputs`).
Runner = Callable[[str, list[str]], list[RunResult]]


class Judge:
    """What both kinds share: :meth:`evaluate` runs a program on tests and judges each run."""

    def program(self, code: str) -> str:
        raise NotImplementedError

    def stdin(self, test_input: str) -> str:
        raise NotImplementedError

    def verdict(self, test: TestCase, run: RunResult, timeout: float) -> tuple[bool, str]:
        raise NotImplementedError

    def evaluate(
        self, code: str, tests: Sequence[TestCase], run: Runner, timeout: float
    ) -> list[tuple[bool, str]]:
        """``(passed, shown output)`` of ``code`` on each test, in order."""
        runs = run(self.program(code), [self.stdin(t.input) for t in tests])
        return [self.verdict(test, result, timeout) for test, result in zip(tests, runs, strict=True)]


class StdioJudge(Judge):
    """Stdin/stdout problems: the program itself runs, fed the test input; stdout is judged."""

    kind = "stdio"

    def program(self, code: str) -> str:
        return code

    def stdin(self, test_input: str) -> str:
        """Test inputs lacking a final newline get one."""
        return test_input if not test_input or test_input.endswith("\n") else test_input + "\n"

    def verdict(self, test: TestCase, run: RunResult, timeout: float) -> tuple[bool, str]:
        """``(passed, what the program printed or why it failed)``."""
        failure = output_or_error(run, timeout)
        if failure is not None:
            return False, failure
        return outputs_match(test.output, run.stdout), run.stdout

    def input_key(self, test_input: str) -> str:
        """Equal for inputs that are the same test (up to trailing whitespace)."""
        return normalized_output(test_input)

    def expected_agrees(self, known: str, claimed: str) -> bool:
        """Whether a claimed expected output is right, given the known one."""
        return outputs_match(known, claimed)


class CallJudge(Judge):
    """Call-based problems: a harness calls the named function with the test's arguments (its
    standard input); the printed return value is compared in the host (:func:`values_match`).
    The hidden test :data:`~llm_zoo.data.code_problem.CHECK_TEST` runs the problem's check
    instead (:meth:`run_check`)."""

    kind = "call"

    def __init__(self, call: CallSpec, tolerance: float = TOLERANCE):
        self.call = call
        self.tolerance = tolerance
        self._answered: dict[str, list[tuple[str, Any]]] = {}

    def evaluate(
        self, code: str, tests: Sequence[TestCase], run: Runner, timeout: float
    ) -> list[tuple[bool, str]]:
        fixed = [test for test in tests if test.input != CHECK_INPUT]
        if len(fixed) == len(tests):
            return super().evaluate(code, tests, run, timeout)
        judged = iter(super().evaluate(code, fixed, run, timeout) if fixed else [])
        checked = self.run_check(code, run, timeout)
        return [checked if test.input == CHECK_INPUT else next(judged) for test in tests]

    def run_check(self, code: str, run: Runner, timeout: float) -> tuple[bool, str]:
        """``(passed, why)`` of the problem's check on ``code``: the checker and the candidate in
        separate sandbox runs, relayed in rounds (see :mod:`llm_zoo.checkers.call_checker`)."""
        if self.call.checker is None:
            return False, "(no check: the problem has no test source)"
        checker = checker_program(self.call.checker, self.call.name)
        harness = self.program(code)
        answers: list[tuple[str, bool, Any]] = []
        deadline = time.monotonic() + CHECK_TIME_FACTOR * timeout
        for _ in range(MAX_CHECK_ROUNDS):
            if time.monotonic() > deadline:
                return False, f"(check failed: no verdict within {CHECK_TIME_FACTOR * timeout:g} s)"
            checker_run = run(checker, [checker_stdin(answers)])[0]
            report = read_checker_report(checker_run.stdout)
            if report.outcome == "limit":
                return False, f"(check failed: more than {MAX_CHECK_CALLS} calls)"
            if report.unknown_from is None:
                if report.outcome == "pass":
                    self._answered[code] = [(args, value) for args, ok, value in answers if ok]
                    return True, f"(check passed: {len(report.calls)} calls)"
                why = report.message or output_or_error(checker_run, timeout) or "no verdict"
                return False, f"(check failed: {why})"
            pending = list(report.calls[report.unknown_from :])
            answers = answers[: report.unknown_from]
            try:
                stdin = batch_stdin(pending)
            except ValueError as err:
                return False, f"(check failed: it called the candidate with unreadable arguments: {err})"
            candidate_run = run(harness, [stdin])[0]
            values = read_call_results(candidate_run.stdout, len(pending))
            answers += [(args, True, value) for args, value in zip(pending, values, strict=False)]
            if len(values) < len(pending):
                failed = pending[len(values)]
                why = output_or_error(candidate_run, timeout) or "(no return value)"
                answers.append((failed, False, f"{call_text(self.call.target, failed)} failed: {why}"))
        return False, f"(check failed: no verdict after {MAX_CHECK_ROUNDS} checker runs)"

    def answered_calls(self, code: str, run: Runner, timeout: float) -> list[tuple[str, Any]]:
        """The calls (arguments as stored, return value) of the check's last passing run on
        ``code``, running the check if needed; empty if it fails or the problem has no check."""
        if code not in self._answered and self.call.checker is not None:
            self.run_check(code, run, timeout)
        return list(self._answered.get(code, []))

    def program(self, code: str) -> str:
        return harness_program(code, self.call.name, self.call.class_name)

    def stdin(self, test_input: str) -> str:
        """The arguments in the harness's input format; an unreadable list sends nothing (the
        harness then fails the test with a message)."""
        try:
            return call_stdin(test_input)
        except ValueError:
            return ""

    def matches(self, expected: Any, actual: Any) -> bool:
        if values_match(expected, actual, tolerance=self.tolerance):
            return True
        return bool(
            self.call.lenient_singleton
            and isinstance(expected, list)
            and expected
            and values_match(expected[0], actual, tolerance=self.tolerance)
        )

    def verdict(self, test: TestCase, run: RunResult, timeout: float) -> tuple[bool, str]:
        """``(passed, the returned value's repr or why there is none)``."""
        failure = output_or_error(run, timeout)
        if failure is not None:
            return False, failure
        try:
            actual = read_call_result(run.stdout)
        except ValueError as err:
            return False, f"(no return value: {err})"
        try:
            return self.matches(literal(test.output), actual), repr(actual)
        except ValueError:
            return False, repr(actual)

    def input_key(self, test_input: str) -> str:
        return canonical_literal(test_input)

    def expected_agrees(self, known: str, claimed: str) -> bool:
        try:
            return self.matches(literal(known), literal(claimed))
        except ValueError:
            return False


def judge_for(problem: CodeProblem) -> StdioJudge | CallJudge:
    """The judge for ``problem``'s kind."""
    return StdioJudge() if problem.call is None else CallJudge(problem.call)
