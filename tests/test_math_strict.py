"""The strict answer rules (llm_zoo.checkers.math_strict) as AnswerChecker applies them (issue 24: a red
team found that math-verify took a percent and an approximation of the gold as the gold, and that
``99999999!`` cost a hard timeout per check)."""

from __future__ import annotations

import time

import pytest

from llm_zoo.checkers.math_check import AnswerChecker
from llm_zoo.checkers.math_strict import marker_refusal, size_refusal


@pytest.fixture(scope="module")
def checker():
    with AnswerChecker(timeout_s=10.0) as shared:
        yield shared


# Each of these was correct on 84b1722.
LENIENT_FORMS = [
    ("3744", "3744\\%"),
    ("3744", "3744 \\text{ percent}"),
    ("3744", "\\approx 3744+10^{-9}"),
    ("3744", "3744 \\approx 3744+10^{-9}"),
    ("3744", "= 3744+10^{-9}"),
    ("3744", "\\doteq 3744+10^{-9}"),
    ("3744", "\\to 3744+10^{-9}"),
    ("0.5", "50\\%"),
    ("\\frac{1}{2}", "0.5000001"),
]


@pytest.mark.parametrize(("gold", "pred"), LENIENT_FORMS)
def test_percent_approximation_and_near_values_are_wrong(checker, gold, pred):
    result = checker.check(gold, pred)
    assert result.correct is False, result


@pytest.mark.parametrize(
    ("gold", "pred"),
    [
        ("3744", "3744"),
        ("3744", "3744.0"),
        ("3744", "\\sqrt{3744^2}"),
        ("3744", "x = 3744"),
        ("1/2", "0.5"),
        ("\\frac{1}{2}", "0.50"),
        ("0.5", "\\frac{2}{4}"),
        ("1/3", "0.333333"),
        ("\\frac{1}{3}", "0.3333333333333333"),  # Python's print(1/3)
        ("\\frac{2}{3}", "0.6666666666666666"),  # print(2/3): 1 unit of the last digit below
        ("50\\%", "50\\%"),
        ("\\approx 3.14", "\\approx 3.14"),
        ("\\sqrt{2}", "1.414214"),
        ("(n-1)!", "(n-1)!"),
        ("720", "6!"),
        ("1024", "2^{10}"),
        ("e^{x^2}", "e^{x^{2}}"),
    ],
)
def test_right_answers_stay_right(checker, gold, pred):
    assert checker.check(gold, pred).correct


@pytest.mark.parametrize(
    ("gold", "pred", "why"),
    [
        ("3744", "3744.000000001", "written exactly"),
        ("1/2", "0.5000001", "written exactly"),
        ("1/3", "0.33", "fewer than 6 significant digits"),
        ("1/3", "0.333336", "different numbers"),
    ],
)
def test_plain_decimals_must_equal_the_gold_exactly(gold, pred, why):
    fresh = AnswerChecker()
    result = fresh.check(gold, pred)
    assert not result.correct and result.method == "exact" and why in result.detail, result
    assert fresh.worker_pids() == []


@pytest.mark.parametrize(
    ("pred", "why"),
    [
        ("99999999!", "factorial"),
        ("1001!", "factorial"),
        ("(10^{9})!", "factorial"),
        ("3!!!!", "factorial"),
        ("9^{9^{9^{9}}}", "digits"),
        ("10^{99999999}", "digits"),
        ("x^{10^{10}}", "digits"),
        ("\\binom{10^{9}}{5}", "digits"),
        ("\\frac{1}{10^{-99999999}}", "digits"),
        ("(" * 60 + "1" + ")" * 60, "nested"),
    ],
)
def test_values_too_large_are_refused_in_milliseconds_without_a_worker(pred, why):
    fresh = AnswerChecker(timeout_s=2.0)
    start = time.perf_counter()
    result = fresh.check("3744", pred)
    assert time.perf_counter() - start < 0.05
    assert not result.correct and result.method == "refused" and why in result.detail, result
    assert "write the value itself" in result.detail
    assert fresh.worker_pids() == []


@pytest.mark.parametrize(
    "pred", ["1000!", "(n-1)!", "2^{10}", "10^{-9}", "e^{x^2}", "\\binom{100}{50}", "2^{2^{10}}", "[2, 5)"]
)
def test_ordinary_values_are_not_refused(pred):
    assert size_refusal(pred) is None


def test_a_marker_in_the_gold_allows_the_same_marker():
    assert marker_refusal("50\\%", "50 \\%") is None
    assert marker_refusal("\\sim 5", "\\approx 5") is None
    assert "percent" in marker_refusal("0.5", "50\\%")
    assert "approximation" in marker_refusal("5", "about 5")
    assert marker_refusal("3744", "3~744") is None  # a LaTeX space inside, not a marker


@pytest.mark.parametrize("pred", [".", "..", "1.2.3", "3.", "²", "- " * 3000 + "1", "+" * 100_000 + "1"])
def test_odd_numbers_and_endless_signs_never_raise(pred):
    """Found by the stop-34 red team: a tool program printing "." made ``float('.')`` raise out of
    ``env.step``; thousands of signs in a row overflowed the reader's recursion."""
    refusal = size_refusal(pred)  # returns, never raises
    assert refusal is None or "not evaluated" in refusal


def test_a_program_printing_a_dot_is_judged_not_raised():
    import llm_zoo

    env = llm_zoo.make("Math-v0", agents=("tool_agent",))
    env.reset(seed=0)
    env.step("```python\nprint('.')\n```")
    assert env.rewards["tool_agent"] <= 0


def test_a_huge_reasoner_answer_compared_with_the_tools_costs_no_checker_time_out():
    """Math-v0 compares the two agents' answers with the reasoner's in the gold's place; the stop-34
    red team found a reasoner's ``10^{10^{10^{10}}}`` then cost the checker's 2 s time-out each step."""
    checker = AnswerChecker()
    try:
        start = time.perf_counter()
        result = checker.check("10^{10^{10^{10}}}", "42")
        assert not result.correct and result.method == "refused"
        assert time.perf_counter() - start < 0.5
    finally:
        checker.close()
