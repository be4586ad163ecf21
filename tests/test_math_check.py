"""The math answer checker: verdicts, fast path, cache, timeouts, worker lifetime, threads, fork."""

from __future__ import annotations

import copy
import gc
import multiprocessing
import os
import pickle
import signal
import subprocess
import sys
import textwrap
import time
from concurrent.futures import ThreadPoolExecutor
from fractions import Fraction

import pytest

from llm_zoo.checkers import math_check
from llm_zoo.checkers.math_check import AnswerChecker, CheckResult, exact_value
from llm_zoo.checkers.math_normalize import inequality_as_interval, normalize_pair, spell_pi


def _gone(pid: int, wait_s: float = 5.0) -> bool:
    """The process no longer exists (or is a zombie of another parent)."""
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as handle:
                if handle.read().split(")")[-1].split()[0] == "Z":
                    return True
        except FileNotFoundError:
            return True
        time.sleep(0.05)
    return False


@pytest.fixture(scope="module")
def checker():
    with AnswerChecker(timeout_s=10.0) as shared:
        yield shared


# ---------------------------------------------------------------------------- verdicts


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("42", (Fraction(42), False)),
        (" -7 ", (Fraction(-7), False)),
        ("$3/4$", (Fraction(3, 4), False)),
        ("-6 / 8", (Fraction(-3, 4), False)),
        ("\\frac{6}{8}", (Fraction(3, 4), False)),
        ("-\\dfrac{1}{2}", (Fraction(-1, 2), False)),
        ("\\frac{-1}{2}", (Fraction(-1, 2), False)),
        ("-\\frac{-1}{2}", (Fraction(1, 2), False)),
        ("0.25", (Fraction(1, 4), True)),
        (".5", (Fraction(1, 2), True)),
        ("1/0", None),
        ("1,000", None),
        ("\\sqrt{2}", None),
        ("x", None),
        ("1" * 100, None),
    ],
)
def test_exact_value(text, value):
    assert exact_value(text) == value


@pytest.mark.parametrize(
    ("gold", "pred", "correct"),
    [
        ("42", "42", True),
        ("42", "42.0", True),
        ("3/4", "\\frac{3}{4}", True),
        ("-3/4", "-0.75", True),
        ("\\frac{6}{8}", "3/4", True),
        ("42", "43", False),
        ("1/2", "2/4", True),
        ("1/2", "1/3", False),
    ],
)
def test_plain_numbers_take_the_exact_path_without_a_worker(gold, pred, correct):
    fresh = AnswerChecker()
    assert fresh.check(gold, pred) == CheckResult(correct, "exact", fresh.check(gold, pred).detail)
    assert fresh.worker_pids() == []


@pytest.mark.parametrize(
    ("gold", "pred", "correct"),
    [
        ("\\sqrt{2}", "sqrt(2)", True),
        ("\\sqrt{2}", "1.414214", True),  # a gold that is no plain number: math-verify rounds
        ("x^2+1", "1+x^2", True),
        ("\\frac{\\pi}{2}", "\\pi/2", True),
        ("2\\sqrt{3}", "\\sqrt{12}", True),
        ("5", "x = 5", True),
        ("\\sqrt{2}", "2", False),
        ("\\sqrt{2}", "1.41", False),
        ("\\{1,2,3\\}", "\\{3,2,1\\}", True),
        ("10", "ten apples", False),
    ],
)
def test_math_verify_equivalence(checker, gold, pred, correct):
    result = checker.check(gold, pred)
    assert result.correct is correct, result
    assert result.method == "math_verify"


# Tricky pairs, both verdicts. The first rows are the misses found when the checker agreed with the
# expected verdict on 44 of 46 pairs (issue 18): spelled-out pi, and an interval against an
# inequality. Measured: without llm_zoo.checkers.math_normalize 31 of these 45 rows get the expected
# verdict, with it 44 (the one left is marked xfail).
TRICKY_PAIRS = [
    ("4\\pi", "4pi", True),
    ("4pi", "4\\pi", True),
    ("[2,5]", "2 \\le x \\le 5", True),
    ("2 \\le x \\le 5", "[2,5]", True),
    ("\\pi", "pi", True),
    ("3\\pi", "3pi", True),
    ("2\\pi/3", "2pi/3", True),
    ("\\frac{\\pi}{2}", "pi/2", True),
    ("pi/4", "\\frac{\\pi}{4}", True),
    ("\\pi r^2", "pi r^2", True),
    ("2\\pi", "2π", True),
    ("(2,5)", "2 < x < 5", True),
    ("[2,5)", "2 \\leq x < 5", True),
    ("(2,5]", "5 \\ge x > 2", True),
    ("(-\\infty, 1)", "x < 1", True),
    ("x \\ge 3", "[3, \\infty)", True),
    ("-2 \\le x \\le 5", "[-2,5]", True),
    ("[2,5]", "2 < x < 5", False),
    ("[2,5]", "2 \\le x \\le 6", False),
    ("2 \\le x \\le 5", "[2,6]", False),
    ("(-\\infty, 1)", "x > 1", False),
    ("4\\pi", "4", False),
    ("4pi", "4.0", False),
    ("\\pi", "3.14", False),
    ("pi", "3.14159", False),
    ("2pi", "6.283", False),
    ("\\frac{1}{3}", "0.333", False),
    ("\\sqrt{8}", "2\\sqrt{2}", True),
    ("2^{10}", "1024", True),
    ("10\\%", "10", True),
    ("\\$5", "5", True),
    ("3", "x = 3", True),
    ("(1,2)", "(2,1)", False),
    ("1,2,3", "3,2,1", True),
    ("\\text{Monday}", "Monday", True),
    ("5", "-5", False),
    ("1000", "1,000", True),
    ("x^2-1", "(x-1)(x+1)", True),
    ("\\frac{a}{b}", "a/b", True),
    ("90^\\circ", "90", True),
    ("7", "7.5", False),
    ("\\sin(\\pi/6)", "1/2", True),
    ("\\alpha", "alpha", True),
    ("epsilon", "\\epsilon", True),
    pytest.param(
        "e^{i\\pi}",
        "-1",
        True,
        marks=pytest.mark.xfail(strict=True, reason="math-verify 0.9 does not simplify it"),
    ),
]


@pytest.mark.parametrize(("gold", "pred", "correct"), TRICKY_PAIRS)
def test_tricky_pairs(checker, gold, pred, correct):
    result = checker.check(gold, pred)
    assert result.correct is correct, result


@pytest.mark.parametrize(
    ("answer", "interval"),
    [
        ("2 \\le x \\le 5", "[2, 5]"),
        ("$5 \\geq x > 2$", "(2, 5]"),
        ("x<1", "(-\\infty, 1)"),
        ("3 < y", "(3, \\infty)"),
        ("\\theta \\ge 0", "[0, \\infty)"),
        ("x = 3", None),
        ("2 < x > 5", None),  # not a chain in one direction
        ("\\left(1, 2\\right)", None),  # \left is not \le
        ("a < b", None),  # two variables: which one is the unknown?
    ],
)
def test_inequality_as_interval(answer, interval):
    assert inequality_as_interval(answer) == interval


def test_pi_is_spelled_as_the_command_only_where_it_stands_alone():
    assert spell_pi("4pi + pie + \\pi + spin + π + 2 pi r") == "4\\pi + pie + \\pi + spin + \\pi + 2 \\pi r"


def test_inequalities_become_intervals_only_against_an_interval():
    assert normalize_pair("(2,5)", "2 < x < 5") == ("(2,5)", "(2, 5)")
    assert normalize_pair("2 < x < 5", "(2,5)") == ("(2, 5)", "(2,5)")
    assert normalize_pair("2 < x < 5", "x > 2") == ("2 < x < 5", "x > 2")  # math-verify compares these


def test_empty_and_too_long_answers_are_wrong_without_a_worker():
    fresh = AnswerChecker(max_answer_chars=50)
    assert fresh.check("1", "  ") == CheckResult(False, "empty", "an answer is empty")
    assert fresh.check("", "1").method == "empty"
    assert fresh.check("1", "1" * 51).method == "too_long"
    assert fresh.check("1" * 51, "1").method == "too_long"
    assert fresh.worker_pids() == []


def test_constructor_rejects_bad_arguments():
    with pytest.raises(ValueError, match="timeout_s"):
        AnswerChecker(timeout_s=0)
    with pytest.raises(ValueError, match="max_workers"):
        AnswerChecker(max_workers=0)


# ---------------------------------------------------------------------------- pathological inputs


# Slow for math-verify (it expands a trinomial) but not refused by llm_zoo.checkers.math_strict: the
# timeouts below still need a worker that does not answer.
SLOW = "(x+y+1)^{3000}"


def test_slow_expansion_returns_within_the_timeout_and_the_checker_recovers(checker):
    start = time.monotonic()
    result = checker.check("1", SLOW)
    assert time.monotonic() - start < checker.timeout_s + 1
    assert result.correct is False and result.method == "timeout"
    assert checker.check("\\sqrt{8}", "2\\sqrt{2}").correct


def test_one_megabyte_answer_is_refused_quickly(checker):
    start = time.monotonic()
    result = checker.check("1", "1" * 1_000_000)
    assert time.monotonic() - start < 0.5
    assert result == CheckResult(False, "too_long", "answer longer than 1000 characters")


def test_hard_timeout_kills_and_replaces_the_worker():
    # 0.5 s is below math-verify's own (whole-second) timeouts, so the outer kill fires.
    with AnswerChecker(timeout_s=0.5) as fast:
        assert fast.check("\\sqrt{2}", "sqrt(2)").correct
        (first,) = fast.worker_pids()
        start = time.monotonic()
        result = fast.check("1", SLOW)
        assert time.monotonic() - start < 3
        assert result.method == "timeout" and not result.correct
        assert fast.worker_pids() == [] and _gone(first)
        # A megabyte sent through the pipe, with a cap that lets it through, also ends in time.
        fast.max_answer_chars = 2_000_000
        result = fast.check("1", "x+" * 500_000 + "x")  # not refused: no value is large
        assert not result.correct and result.method in ("timeout", "math_verify", "error")
        assert fast.check("\\sqrt{7}", "sqrt(7)").correct
        assert fast.worker_pids() and fast.worker_pids() != [first]


def test_a_worker_killed_while_idle_is_replaced():
    with AnswerChecker() as fresh:
        assert fresh.check("\\sqrt{2}", "sqrt(2)").correct
        (pid,) = fresh.worker_pids()
        os.kill(pid, signal.SIGKILL)
        assert _gone(pid)
        assert fresh.check("\\sqrt{3}", "sqrt(3)").correct
        assert fresh.worker_pids() != [pid]


@pytest.mark.parametrize("executable", ["/bin/false", "/nonexistent/python"])
def test_worker_that_cannot_start_gives_an_error_verdict(monkeypatch, executable):
    monkeypatch.setattr(sys, "executable", executable)
    fresh = AnswerChecker()
    result = fresh.check("\\sqrt{2}", "sqrt(2)")
    assert result.correct is False and result.method == "error" and "did not start" in result.detail
    assert fresh.worker_pids() == []


# ---------------------------------------------------------------------------- cache


def test_cache_answers_repeats_without_a_worker_and_evicts_oldest():
    with AnswerChecker(cache_size=2) as fresh:
        assert fresh.check("\\sqrt{2}", "sqrt(2)").correct
        fresh.shutdown_workers()
        assert fresh.check("\\sqrt{2}", "sqrt(2)").correct  # from the cache: no worker started
        assert fresh.worker_pids() == []
        fresh.check("1", "2")
        fresh.check("1", "3")  # evicts the sqrt entry
        assert fresh.check("\\sqrt{2}", "sqrt(2)").correct
        assert len(fresh.worker_pids()) == 1
        fresh.clear_cache()
        assert fresh._cache == {}


def test_a_timeout_is_cached_only_the_second_time():
    with AnswerChecker(timeout_s=0.5) as fast:
        slow = SLOW
        assert fast.check("1", slow).method == "timeout"
        assert ("1", slow) not in fast._cache  # a slow machine gets a second chance
        assert fast.check("1", slow).method == "timeout"
        fast.shutdown_workers()
        start = time.monotonic()
        assert fast.check("1", slow).method == "timeout"  # now from the cache
        assert time.monotonic() - start < 0.1 and fast.worker_pids() == []


# ---------------------------------------------------------------------------- threads, fork, lifetime


def test_concurrent_checks_from_threads_are_correct_and_bounded():
    pairs = [
        ("\\sqrt{2}", "sqrt(2)", True),
        ("\\sqrt{2}", "2", False),
        ("x^2", "x*x", True),
        ("\\sqrt{2}", "1.41", False),
    ]
    with AnswerChecker(max_workers=2, cache_size=0) as fresh:
        with ThreadPoolExecutor(max_workers=6) as pool:
            results = list(
                pool.map(lambda i: (fresh.check(*pairs[i % 4][:2]).correct, pairs[i % 4][2]), range(24))
            )
        assert all(got == want for got, want in results)
        assert 1 <= len(fresh.worker_pids()) <= 2


def _check_in_child(shared, queue):
    queue.put((os.getpid(), shared.check("\\sqrt{5}", "sqrt(5)").correct, shared.worker_pids()))


@pytest.mark.skipif(sys.platform != "linux", reason="fork start method")
def test_forked_child_gets_its_own_worker_and_leaves_the_parents_alone():
    with AnswerChecker(cache_size=0) as parent_checker:
        assert parent_checker.check("\\sqrt{2}", "sqrt(2)").correct
        (parent_worker,) = parent_checker.worker_pids()
        context = multiprocessing.get_context("fork")
        queue = context.Queue()
        child = context.Process(target=_check_in_child, args=(parent_checker, queue))
        child.start()
        _, correct, child_workers = queue.get(timeout=60)
        child.join(timeout=60)
        assert correct and child_workers and parent_worker not in child_workers
        assert all(_gone(pid) for pid in child_workers)  # the child cleaned up at exit
        assert parent_checker.worker_pids() == [parent_worker]
        assert parent_checker.check("\\sqrt{3}", "sqrt(3)").correct


def test_leases_stop_workers_when_the_last_one_is_released():
    fresh = AnswerChecker()
    first, second = fresh.lease(), fresh.lease()
    third = copy.deepcopy(first)  # a copied lease is a new claim
    assert third is not first and third.checker is fresh
    assert fresh.check("\\sqrt{2}", "sqrt(2)").correct
    (pid,) = fresh.worker_pids()
    first.release()
    first.release()  # idempotent
    second.release()
    assert fresh.worker_pids() == [pid]
    third.release()
    assert fresh.worker_pids() == [] and _gone(pid)
    assert fresh.check("\\sqrt{3}", "sqrt(3)").correct  # restarts on demand
    fresh.close()


def test_a_lease_dropped_without_release_is_given_back_by_the_gc():
    fresh = AnswerChecker()
    kept, dropped = fresh.lease(), fresh.lease()
    assert fresh.check("\\sqrt{2}", "sqrt(2)").correct
    (pid,) = fresh.worker_pids()
    del dropped
    gc.collect()
    kept.release()
    assert fresh.worker_pids() == [] and _gone(pid)


def test_checker_copies_share_and_pickles_rebuild():
    fresh = AnswerChecker(timeout_s=3.0, max_workers=2)
    assert copy.deepcopy(fresh) is fresh and copy.copy(fresh) is fresh
    clone = pickle.loads(pickle.dumps(fresh))
    assert clone is not fresh and (clone.timeout_s, clone.max_workers) == (3.0, 2)


def test_no_worker_outlives_the_interpreter():
    script = textwrap.dedent(
        """
        import threading
        from llm_zoo.checkers.math_check import AnswerChecker, check_answer
        checker = AnswerChecker(max_workers=2)
        assert check_answer("\\\\sqrt{2}", "sqrt(2)").correct
        threads = [threading.Thread(target=checker.check, args=("x^2", f"x*x+{i}-{i}")) for i in range(2)]
        for t in threads: t.start()
        for t in threads: t.join()
        from llm_zoo.checkers.math_check import default_checker
        print(*(default_checker().worker_pids() + checker.worker_pids()))
        """
    )
    output = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert output.returncode == 0, output.stderr
    pids = [int(p) for p in output.stdout.split()]
    assert len(pids) >= 2
    assert all(_gone(pid) for pid in pids)


def test_default_checker_is_a_shared_singleton():
    assert math_check.default_checker() is math_check.default_checker()
    assert math_check.check_answer("7", "7.0").correct
