"""Code-v0's checked call-based problems: a dataset's ``check(candidate)`` run in a sandbox
process apart from the candidate's, with calls relayed by the host (:mod:`llm_zoo.checkers.call_checker`);
also infinite return values and APPS's int-keyed dicts."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

import llm_zoo
from llm_zoo import sandbox
from llm_zoo.checkers.call_checker import (
    CHECK_TIME_FACTOR,
    MAX_CHECK_CALLS,
    REPORT_MARKER,
    read_checker_report,
)
from llm_zoo.checkers.call_harness import (
    args_text,
    call_stdin,
    harness_program,
    literal,
    read_call_result,
    values_match,
)
from llm_zoo.data.code import CallSpec, CodeDatasetError, CodeProblem, TestCase, load_code_problems
from llm_zoo.data.code_problem import CHECK_TEST, call_test
from llm_zoo.envs.code import oracle_action
from llm_zoo.envs.code_judge import CallJudge, run_program_on_inputs
from llm_zoo.testing import check_env

DOUBLE = "def f(x):\n    return 2 * x\n"
RANDOM_CHECK = """
import random


def check(candidate):
    for _ in range(20):
        x = random.randint(-100, 100)
        assert candidate(x) == 2 * x
"""


def checked(checker: str, tests: tuple[TestCase, ...] = ()) -> CodeProblem:
    return CodeProblem(
        id="test/double", statement="Return twice x.", tests=(*tests, CHECK_TEST), reference=DOUBLE,
        call=CallSpec("f", None, "def f(x):", checker=checker),
    )  # fmt: skip


def judged(checker: str, code: str, log: list[str] | None = None, timeout: float = 5.0) -> tuple[bool, str]:
    """The check's verdict on ``code``; ``log`` records which program each sandbox run was."""

    def run(program: str, stdins: list[str]):
        if log is not None:
            log.append("checker" if REPORT_MARKER in program else "candidate")
        return run_program_on_inputs(program, stdins, timeout, 256)

    return CallJudge(checked(checker).call).run_check(code, run, timeout)


def py(code: str) -> str:
    return f"```python\n{code}```"


def test_a_check_with_random_inputs_takes_two_checker_runs_and_one_candidate_run():
    log: list[str] = []
    assert judged(RANDOM_CHECK, DOUBLE, log) == (True, "(check passed: 20 calls)")
    assert log == ["checker", "candidate", "checker"]
    passed, why = judged(RANDOM_CHECK, "def f(x):\n    return 2 * x if x > 0 else x\n")
    assert not passed and why.startswith("(check failed: AssertionError")


def test_calls_whose_arguments_depend_on_return_values_take_more_rounds():
    check = "def check(candidate):\n    x = candidate(1)\n    assert candidate(x) == 4\n    assert candidate(candidate(3)) == 12\n"
    log: list[str] = []
    assert judged(check, DOUBLE, log) == (True, "(check passed: 4 calls)")
    assert log.count("checker") > 2
    assert not judged(check, "def f(x):\n    return x + 1\n")[0]


def test_the_candidate_cannot_find_the_test_source_or_its_values():
    """The candidate searches its frames, every object in its memory, its files and /proc for the
    check's secret; the check passes only if it was not found and the search found a control
    string planted in the candidate's own process."""
    secret = "zq" + "-3f9c1e77b0"
    check = f"SECRET = {secret!r}\n\n\ndef check(candidate):\n    found = candidate(0)\n"
    check += "    assert 'zq-control' in found, found\n    assert SECRET not in found, found\n"
    search = """
import gc, os, re, sys

PREFIX = "zq" + "-"
CONTROL = PREFIX + "control"
PATTERN = re.compile(re.escape(PREFIX) + "[0-9a-z]+")


def f(x):
    found = set()
    frame = sys._getframe()
    while frame is not None:
        found.update(PATTERN.findall(repr(frame.f_locals) + repr(list(frame.f_globals))))
        frame = frame.f_back
    for obj in gc.get_objects():
        for value in (obj.values() if isinstance(obj, dict) else [obj]):
            if isinstance(value, str) and PREFIX in value and len(value) < 10**6:
                found.update(PATTERN.findall(value))
    paths = [os.path.join(folder, name) for root in (os.getcwd(), "/tmp", "/dev/shm")
             for folder, _, files in os.walk(root) for name in files]
    for pid in filter(str.isdigit, os.listdir("/proc")):
        paths += [f"/proc/{pid}/cmdline", f"/proc/{pid}/environ"]
        try:
            paths += [f"/proc/{pid}/fd/{fd}" for fd in os.listdir(f"/proc/{pid}/fd")]
        except OSError:
            pass
    for path in paths:
        try:
            with open(path, "rb") as handle:
                found.update(PATTERN.findall(handle.read(1 << 20).decode("latin-1")))
        except OSError:
            pass
    return sorted(found)
"""
    passed, why = judged(check, search)
    assert passed, why


def test_failed_calls_fail_the_check_with_a_clear_message_even_when_the_check_catches_errors():
    check = "def check(candidate):\n    try:\n        candidate(1)\n    except Exception:\n        pass\n"
    passed, why = judged(check, "def f(x):\n    return object()\n")
    assert (
        not passed and "f(1) failed" in why and "returned a value of type object, not a plain value" in why
    ), why
    passed, why = judged(check, "def f(x):\n    raise ValueError('no')\n")
    assert not passed and "ValueError: no" in why, why
    assert judged(check, DOUBLE)[0]


def test_the_number_of_calls_is_bounded():
    check = f"def check(candidate):\n    for i in range({MAX_CHECK_CALLS + 1}):\n        candidate(i)\n"
    assert judged(check, DOUBLE) == (False, f"(check failed: more than {MAX_CHECK_CALLS} calls)")


def test_the_time_of_a_verdict_is_bounded():
    chain = "def check(candidate):\n    x = 0\n    for _ in range(11):\n        x = candidate(x)\n    assert x == 11\n"
    increment = "def f(x):\n    return x + 1\n"
    assert judged(chain, increment) == (True, "(check passed: 11 calls)")  # 12 checker runs
    slow = "import time\n\n\ndef f(x):\n    time.sleep(0.4)\n    return x + 1\n"  # >= 4.4 s in all
    assert judged(chain, slow, timeout=1.0) == (
        False,
        f"(check failed: no verdict within {CHECK_TIME_FACTOR:g} s)",
    )


def test_a_check_that_raises_on_its_own_fails():
    passed, why = judged("def check(candidate):\n    raise KeyError('setup')\n", DOUBLE)
    assert not passed and "KeyError" in why
    passed, why = judged("def helper():\n    pass\n", DOUBLE)
    assert not passed and "defines no check(candidate)" in why


def test_reports_are_read_from_marked_lines_only():
    text = "\n".join(
        ["noise", f"{REPORT_MARKER}call [1]", f"{REPORT_MARKER}unknown 0", f"{REPORT_MARKER}call [2]",
         f"{REPORT_MARKER}stopped "]
    )  # fmt: skip
    report = read_checker_report(text)
    assert (report.calls, report.unknown_from, report.outcome) == (("[1]", "[2]"), 0, "stopped")
    failed = read_checker_report(f"{REPORT_MARKER}fail 'AssertionError: x'\n")
    assert (failed.outcome, failed.message, failed.unknown_from) == ("fail", "AssertionError: x", None)
    assert read_checker_report("").outcome is None


def test_oracle_episodes_and_check_env_on_a_checked_problem():
    problem = checked(RANDOM_CHECK, tests=(call_test([3], 6),))
    env = llm_zoo.make("Code-v0", dataset=[problem], split="all")
    env.reset(seed=0)
    env.step(oracle_action(env, "coder"))
    assert env.infos["coder"]["role_reward"] == 1.0 and env.infos["coder"]["hidden_total"] == 2
    tester_answer = oracle_action(env, "unit_tester")  # the fixed test and the check's answered calls
    assert len(json.loads(tester_answer.split("```json\n")[1].split("\n```")[0])) == 10
    env.step(tester_answer)
    assert env.infos["unit_tester"]["role_reward"] == 1.0 and env.success and all(env.terminations.values())
    env.reset(seed=0)
    env.step(py("def f(x):\n    return 6 if x == 3 else x\n"))  # passes the fixed test only
    assert env.infos["coder"]["role_reward"] == 0.5
    actions = [py(DOUBLE), '```json\n[{"input": [1], "output": 2}]\n```', "garbage"]
    check_env("Code-v0", env_kwargs={"dataset": [problem], "split": "all"}, sample_actions=actions)


def test_mbpp_order_free_asserts_run_as_a_check():
    with pytest.warns(UserWarning, match="mbpp/9003"):
        problems = load_code_problems(Path(__file__).parent / "fixtures" / "code" / "mbpp.jsonl")
    env = llm_zoo.make("Code-v0", dataset=problems, split="all")
    env.reset(seed=0, options={"problem_id": "mbpp/9002"})
    env.step(oracle_action(env, "coder"))
    assert env.infos["coder"]["role_reward"] == 1.0
    env.reset(seed=0, options={"problem_id": "mbpp/9002"})
    env.step(py("def distinct_sorted(xs):\n    return tuple(sorted(set(xs))) if xs != [2, 2] else (3,)\n"))
    assert env.infos["coder"]["role_reward"] == pytest.approx(2 / 3)  # the fixed calls pass, the check fails


def test_llm_zoo_records_carry_a_checker():
    record = {"id": "x/2", "statement": "s", "tests": [], "call": {"name": "f", "checker": RANDOM_CHECK}}
    (problem,) = load_code_problems([record])
    assert problem.tests == (CHECK_TEST,) and problem.call.checker == RANDOM_CHECK
    record["call"] = {"name": "f", "checker": 3}
    with pytest.raises(CodeDatasetError, match="'checker' should be test source"):
        load_code_problems([record])
    with pytest.raises(ValueError, match="needs a call with a checker"):
        CodeProblem(id="x/3", statement="s", tests=(CHECK_TEST,), call=CallSpec("f"))


# ---------------------------------------------------------------------------------------- values


def test_infinite_return_values_round_trip_and_nan_is_refused_clearly():
    def run(source):
        program = harness_program(source, "f")
        return sandbox.run_python(program, stdin=call_stdin(args_text([])), timeout=5)

    inf = run("def f():\n    return [float('inf'), (-float('inf'), 1.5), {'k': {2.0}}]\n")
    assert inf.ok and read_call_result(inf.stdout) == [math.inf, (-math.inf, 1.5), {"k": {2.0}}]
    assert values_match(literal(call_test([], math.inf).output), math.inf)
    assert not values_match(math.inf, -math.inf) and not values_match(math.inf, 1e308)
    nan = run("def f():\n    return float('nan')\n")
    assert not nan.ok and "NaN" in nan.stderr


def test_apps_int_keyed_dicts_as_apps_harness_restores_them():
    spec = {
        "fn_name": "f",
        "inputs": [[{"1": "a", "2": "b"}, 7], [{"x": 1}]],
        "outputs": [{"3": 4}, [{"5": 6}, 0]],
    }
    record = {"problem_id": 1, "question": "q", "input_output": json.dumps(spec), "solutions": "[]"}
    (problem,) = load_code_problems([record])
    assert problem.tests == (
        TestCase("[{1: 'a', 2: 'b'}]", "[{3: 4}]"),  # the first argument alone, as APPS's harness calls it
        TestCase("[{'x': 1}]", "[{5: 6}]"),  # keys that are not integers stay
    )
