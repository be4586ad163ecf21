"""Code-v0: judging, parsing, rewards, termination, the sandbox path and the PettingZoo contract."""

from __future__ import annotations

import dataclasses
import json

import pytest

import llm_zoo
from llm_zoo import sandbox
from llm_zoo.data.code import CodeProblem, TestCase, load_builtin_problems
from llm_zoo.envs import code as code_env
from llm_zoo.envs.code import (
    FORMAT_PENALTY,
    INVALID_TEST_SCORE,
    oracle_action,
    oracle_policy,
    outputs_match,
    parse_tests,
)
from llm_zoo.envs.code_judge import StdioJudge, judge_for
from llm_zoo.envs.code_judge import run_program_on_inputs as _run_program_on_inputs
from llm_zoo.parsing import ParseError
from llm_zoo.testing import check_env, play_episode

SUM_PROGRAM = "a, b = map(int, input().split())\nprint(a + b)\n"
SUM_PROBLEM = CodeProblem(
    id="test/sum",
    statement="Print a + b.",
    tests=(
        TestCase("1 2\n", "3\n"),
        TestCase("-4 4\n", "0\n"),
        TestCase("10 5\n", "15\n"),
        TestCase("7 7\n", "14\n"),
    ),
    reference=SUM_PROGRAM,
)
#: Right when a >= b, else prints 2a: passes hidden tests (10, 5) and (7, 7), fails (1, 2) and (-4, 4).
ALMOST_SUM = "a, b = map(int, input().split())\nprint(a + b if a >= b else 2 * a)\n"


def py(code: str) -> str:
    return f"Here is my program:\n```python\n{code}```\n"


def json_tests(pairs) -> str:
    return "```json\n" + json.dumps([{"input": i, "output": o} for i, o in pairs]) + "\n```"


def sum_env(**kwargs) -> code_env.CodeEnv:
    env = llm_zoo.make("Code-v0", dataset=[SUM_PROBLEM], **kwargs)
    env.reset(seed=0)
    return env


# ---------------------------------------------------------------------------------------- judge


@pytest.mark.parametrize(
    ("expected", "actual", "match"),
    [
        ("3\n", "3", True),
        ("1 2 3\n", "1 2 3   \n\n\n", True),  # trailing whitespace and empty lines
        ("1 2\n3\n", "1 2 3\n", False),  # line structure matters
        ("a  b\n", " a b\n", True),  # whitespace inside a line does not
        ("0.333333333\n", "0.3333333\n", True),  # float tolerance 1e-6
        ("0.5\n", "0.51\n", False),
        ("1e9\n", "1000000000.0001\n", True),  # relative tolerance
        ("75\n", "75.0\n", True),  # the same number
        ("0.5 7\n", "0.5000001 7\n", True),
        ("1000000007\n", "1000000008\n", False),  # integers are exact
        ("12345678901234567890123\n", "12345678901234567890124\n", False),
        ("-0\n", "0\n", True),
        ("007\n", "7\n", True),
        ("YES\n", "yes\n", False),  # words are case-sensitive
        ("nan\n", "nan\n", True),
        ("inf\n", "1e999\n", False),
        ("\n", "", True),
        ("1\n", "", False),
        ("1\n\n2\n", "1\n2\n", False),  # empty lines inside the output count
    ],
)
def test_outputs_match_like_a_judge(expected, actual, match):
    assert outputs_match(expected, actual) is match
    assert outputs_match(actual, expected) is match  # symmetric


@pytest.mark.parametrize(
    ("expected", "actual", "match"),
    [
        ("2039605317\n", "2039606336.0\n", False),  # within 1e-6 relative, but wrong (issue 24)
        ("0\n", "0.0000001\n", False),  # an expected integer: exactly its value, no tolerance
        ("7\n", "7.000\n", True),
        ("7\n", "7e0\n", True),
        ("75.0\n", "75\n", True),  # tolerance where the expected value is not an integer
        ("2039605317.0\n", "2039606336\n", True),
    ],
)
def test_an_expected_integer_accepts_only_its_exact_value(expected, actual, match):
    assert outputs_match(expected, actual) is match


# ---------------------------------------------------------------------------------------- parsing


def test_parse_tests_reads_a_json_block_and_caps_the_count():
    tests, note = parse_tests(json_tests([("1 2\n", "3\n")]), max_tests=10)
    assert tests == [TestCase("1 2\n", "3\n")] and note == ""
    many = json_tests([(f"{i} 0\n", f"{i}\n") for i in range(12)])
    tests, note = parse_tests(many, max_tests=10)
    assert len(tests) == 10 and "first 10" in note
    extra_keys = '```json\n[{"input": "1 1", "output": "2", "explanation": "1 + 1"}]\n```'
    assert parse_tests(extra_keys, max_tests=10)[0] == [TestCase("1 1", "2")]


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("no block at all", "no complete ```json block"),
        ("```json\n[{]\n```", "not valid JSON"),
        ('```json\n{"input": "1", "output": "1"}\n```', "must be a list"),
        ("```json\n[]\n```", "empty"),
        ('```json\n[{"input": "1"}]\n```', 'keys "input" and "output"'),
        ('```json\n[{"input": 1, "output": "1"}]\n```', '"input" must be a string'),
        ('```json\n[["1", "1"]]\n```', 'keys "input" and "output"'),
        ("```json\n" + "[" * 30_000 + "\n```", "not valid JSON"),  # nesting deeper than json allows
        ("```json\n" + " " * 70_000 + "[]\n```", "longer than 65536 characters"),
        ("```python\nprint(1)\n```", "no complete ```json block"),  # a program is not a test list
    ],
)
def test_parse_tests_rejects_malformed_answers_with_a_reason(text, reason):
    with pytest.raises(ParseError, match=reason):
        parse_tests(text, max_tests=10)


# ---------------------------------------------------------------------------------------- rewards


def test_oracle_gets_success_and_maximum_role_rewards():
    env = sum_env(alpha=0.5)
    env.step(oracle_action(env, "coder"))
    coder = env.infos["coder"]
    assert coder["role_reward"] == 1.0 and coder["global_reward"] == 1.0 and coder["success"]
    assert env.rewards["coder"] == pytest.approx(1.5)
    env.step(oracle_action(env, "unit_tester"))
    tester = env.infos["unit_tester"]
    assert tester["role_reward"] == 1.0 and tester["tests_valid"] == 4 and tester["tests_passed"] == 4
    assert all(env.terminations.values()) and env.success


def test_tester_reward_formula_on_a_wrong_program():
    env = sum_env()
    env.step(py(ALMOST_SUM))
    assert env.infos["coder"]["role_reward"] == pytest.approx(0.5)
    env.step(
        json_tests(
            [
                ("2 5\n", "7\n"),  # valid (the program prints 4)
                ("5 2\n", "7\n"),  # valid
                ("3 3\n", "7\n"),  # invalid -> -0.5
            ]
        )
    )
    info = env.infos["unit_tester"]
    # half the validity, half the share of known-wrong mutants of the reference caught
    validity = (1.0 + 1.0 + INVALID_TEST_SCORE) / 3
    assert info["mutants_total"] > 0
    share = info["mutants_caught"] / info["mutants_total"]
    assert info["role_reward"] == pytest.approx(0.5 * validity + 0.5 * share)
    assert (info["tests_valid"], info["tests_invalid"], info["tests_unknown"]) == (2, 1, 0)
    # the tester's actions never change the program's pass rate: no global change to pay
    assert info["global_reward"] == 0.0 and not info["success"]
    assert not any(env.terminations.values())


def test_wrong_program_and_invalid_tests_get_low_rewards():
    env = sum_env()
    env.step(py("print(42)\n"))
    assert env.infos["coder"]["role_reward"] == 0.0 and env.rewards["coder"] == 0.0
    env.step(json_tests([("1 1\n", "42\n"), ("2 2\n", "5\n")]))  # both expected outputs are wrong
    # invalid tests catch nothing: half the validity score alone
    assert env.infos["unit_tester"]["role_reward"] == 0.5 * INVALID_TEST_SCORE
    assert env.infos["unit_tester"]["tests_invalid"] == 2 and env.infos["unit_tester"]["mutants_caught"] == 0
    # the program agrees with the first (invalid) test and that is no reason to stop
    assert not any(env.terminations.values())


def test_termination_when_the_program_passes_all_generated_tests_and_one_is_valid():
    env = sum_env()
    env.step(py(ALMOST_SUM))
    env.step(json_tests([("2 5\n", "7\n")]))  # valid and caught: no termination
    assert not any(env.terminations.values())
    assert "Disagreement on test 1" in env.observe("coder")["prompt"]
    assert "program output:\n```\n4\n```" in env.observe("coder")["prompt"]
    env.step(py(SUM_PROGRAM))  # fixed: passes the generated test -> done after the coder's action
    assert all(env.terminations.values()) and env.success
    assert env.infos["coder"]["tests_passed"] == 1


def test_truncation_after_max_turns_without_agreement():
    env = llm_zoo.make("Code-v0", dataset=[SUM_PROBLEM], max_turns=2)
    trace = play_episode(env, lambda agent, prompt: "I refuse.", seed=1)
    assert [agent for agent, *_ in trace] == ["coder", "unit_tester"] * 2
    # the penalty is part of each agent's level: the first malformed answer costs it, the next
    # malformed one nothing more
    assert [step[3] for step in trace] == [FORMAT_PENALTY] * 2 + [0.0] * 2
    assert all(env.truncations.values()) and not env.success


def test_malformed_answers_are_penalized_explained_and_keep_the_previous_state():
    env = sum_env()
    env.step(py(SUM_PROGRAM))
    env.step("```json\n[{]\n```")
    tester = env.infos["unit_tester"]
    assert tester["format_ok"] is False and tester["role_reward"] == FORMAT_PENALTY
    assert tester["global_reward"] == 0.0  # the team level (the current program's) did not change
    env.step("```python\nprint(")  # unclosed fence
    coder = env.infos["coder"]
    # solved (success is sticky): the coder's level stays 1, nothing to lose
    assert coder["format_ok"] is False and env.rewards["coder"] == 0.0
    assert env.program == SUM_PROGRAM  # previous program kept
    assert env.observe("unit_tester")["prompt"].startswith(
        "Your previous answer could not be used: the ```json block is not valid JSON"
    )
    assert "previous program (if any) is still" in env.observe("coder")["prompt"]


# ---------------------------------------------------------------------------------------- no reference


def test_without_a_reference_validity_comes_from_hidden_inputs_then_from_a_passing_program():
    problem = CodeProblem(id="test/noref", statement="Print a + b.", tests=SUM_PROBLEM.tests, reference=None)
    env = llm_zoo.make("Code-v0", dataset=[problem])
    env.reset(seed=0)
    env.step(py(ALMOST_SUM))
    env.step(json_tests([("-4 4  ", "0"), ("1 2\n", "4\n"), ("100 1\n", "101\n")]))
    info = env.infos["unit_tester"]
    # a hidden input (up to trailing whitespace) with the right output: valid (and the program fails
    # it: 1); with a wrong output: invalid; an unseen input with no reference and no passing program
    # yet: unknown (scores 0)
    assert (info["tests_valid"], info["tests_invalid"], info["tests_unknown"]) == (1, 1, 1)
    # no reference and no passing program yet: no known-wrong mutant, so validity alone (halved)
    assert info["mutants_total"] == 0
    assert info["role_reward"] == pytest.approx(0.5 * (1.0 + INVALID_TEST_SCORE + 0.0) / 3)
    env.step(py(SUM_PROGRAM))  # passes every hidden test: becomes the proxy reference
    assert env.proxy_reference == SUM_PROGRAM
    assert (env.infos["coder"]["tests_valid"], env.infos["coder"]["tests_unknown"]) == (2, 0)


def test_oracle_coder_needs_a_reference():
    env = llm_zoo.make("Code-v0", dataset=[CodeProblem(id="x", statement="s", tests=SUM_PROBLEM.tests)])
    env.reset(seed=0)
    with pytest.raises(ValueError, match="no reference"):
        oracle_action(env, "coder")


# ---------------------------------------------------------------------------------------- sandbox


def test_runaway_programs_fail_and_later_tests_are_skipped():
    env = sum_env(timeout=0.5)
    env.step(py("while True:\n    pass\n"))
    info = env.infos["coder"]
    assert info["role_reward"] == 0.0 and info["format_ok"]
    runs = env._run("while True:\n    pass\n", [t.input for t in SUM_PROBLEM.tests])
    assert sum(run.timed_out for run in runs) <= code_env._CHUNK  # at most one chunk actually ran
    env.step(json_tests([("1 1\n", "2\n")]))
    assert "time limit exceeded" in env.observe("coder")["prompt"]


def test_crashes_show_the_error_to_the_agents():
    env = sum_env()
    env.step(py("raise SystemExit('boom')\n"))
    env.step(json_tests([("1 1\n", "2\n")]))
    prompt = env.observe("coder")["prompt"]
    assert "runtime error, exit code 1" in prompt and "boom" in prompt


def test_the_batch_api_of_the_sandbox_is_used_when_present(monkeypatch):
    calls = []

    def run_tests(code, stdins, *, timeout, memory_mb):
        calls.append(len(stdins))
        return [sandbox.RunResult(str(sum(map(int, s.split()))) + "\n", "", 0, False, 0.0) for s in stdins]

    monkeypatch.setattr(sandbox, "run_tests", run_tests, raising=False)
    monkeypatch.setattr(sandbox, "run_python", lambda *a, **k: pytest.fail("run_python called"))
    env = sum_env()
    env.step(py("any program"))
    assert env.infos["coder"]["role_reward"] == 1.0 and sum(calls) == len(SUM_PROBLEM.tests)


@pytest.mark.parametrize("batch_api", [True, False], ids=["run_tests", "run_python_fallback"])
def test_one_program_runs_on_many_inputs_in_the_sandbox(batch_api, monkeypatch):
    if not batch_api:
        monkeypatch.delattr(sandbox, "run_tests", raising=False)
    runs = _run_program_on_inputs(
        "print(int(input()) * 2)", ["1\n", "2\n", "x\n"], timeout=5.0, memory_mb=256
    )
    assert [r.stdout for r in runs[:2]] == ["2\n", "4\n"] and runs[2].exit_code == 1
    assert "ValueError" in runs[2].stderr


# ---------------------------------------------------------------------------------------- contract


def test_check_env_passes():
    valid_actions = [py("print(sum(map(int, input().split())))\n"), json_tests([("1 2\n", "3\n")]), "garbage"]
    check_env("Code-v0", sample_actions=valid_actions)


def test_reset_picks_problems_with_the_env_rng_or_by_option():
    env = llm_zoo.make("Code-v0")
    ids = []
    for seed in range(6):
        env.reset(seed=seed)
        ids.append(env.task_id)
    again = llm_zoo.make("Code-v0")
    assert ids == [(again.reset(seed=seed), again.task_id)[1] for seed in range(6)]
    assert len(set(ids)) > 1
    target = env.problems[3].id
    env.reset(seed=0, options={"problem_id": target})
    assert env.task_id == target and env.infos["coder"]["task_id"] == target
    env.reset(options={"problem_index": 0})
    assert env.problem is env.problems[0]
    with pytest.raises(ValueError, match=r"unknown problem_id.*close matches"):
        env.reset(options={"problem_id": target + "x"})
    with pytest.raises(ValueError, match="problem_index"):
        env.reset(options={"problem_index": 10_000})


def test_problem_lists_are_filtered_by_split_and_hidden_tests_can_be_capped():
    train = CodeProblem(id="a", statement="s", tests=SUM_PROBLEM.tests, reference=SUM_PROGRAM, split="train")
    test = CodeProblem(id="b", statement="s", tests=SUM_PROBLEM.tests, reference=SUM_PROGRAM, split="test")
    anywhere = CodeProblem(id="c", statement="s", tests=SUM_PROBLEM.tests, reference=SUM_PROGRAM)
    problems = [train, test, anywhere]
    assert [p.id for p in llm_zoo.make("Code-v0", dataset=problems, split="test").problems] == ["b", "c"]
    assert len(llm_zoo.make("Code-v0", dataset=problems, split="all").problems) == 3
    with pytest.raises(ValueError, match="no code problems for split 'test'"):
        llm_zoo.make("Code-v0", dataset=[train], split="test")
    env = llm_zoo.make("Code-v0", dataset=[train], max_hidden_tests=2)
    env.reset(seed=0)
    env.step(py(SUM_PROGRAM))
    assert env.infos["coder"]["hidden_total"] == 2


def test_clone_shares_problems_but_not_state():
    env = sum_env()
    twin = env.clone()
    assert twin.problems is env.problems and twin.problem is env.problem
    twin.step(py(SUM_PROGRAM))
    assert env.program is None and twin.program == SUM_PROGRAM


def test_render_summarizes_the_state():
    env = sum_env(render_mode="ansi")
    env.step(py(SUM_PROGRAM))
    text = env.render()
    assert "test/sum" in text and "hidden tests passed 4/4" in text


# ---------------------------------------------------------------------------------------- built-in set

ALL_PROBLEMS = load_builtin_problems()
# Every problem runs in the default test run: about 7 s for both tests below with the fork-server
# sandbox on a loaded 2-core machine.
PROBLEM_PARAMS = [pytest.param(p, id=p.id.split("/")[1]) for p in ALL_PROBLEMS]


@pytest.mark.parametrize("problem", PROBLEM_PARAMS)
def test_reference_passes_its_own_hidden_tests_in_the_sandbox(problem):
    judge = judge_for(problem)  # stdin/stdout: the program itself; call-based: the call harness
    runs = _run_program_on_inputs(
        judge.program(problem.reference),
        [judge.stdin(t.input) for t in problem.tests],
        timeout=10.0,
        memory_mb=512,
    )
    for number, (test, run) in enumerate(zip(problem.tests, runs, strict=True)):
        assert run.ok, f"test {number}: {run.stderr[-500:]}"
        assert judge.verdict(test, run, 10.0)[0], f"test {number}"


@pytest.mark.parametrize("problem", PROBLEM_PARAMS)
def test_oracle_solves_every_builtin_problem_with_maximum_rewards(problem):
    env = llm_zoo.make("Code-v0", split="all")
    env.reset(seed=0, options={"problem_id": problem.id})
    policy = oracle_policy(env)
    for agent in env.agent_iter():
        observation, _, termination, truncation, _ = env.last()
        if termination or truncation:
            env.step(None)
            continue
        env.step(policy(agent, observation["prompt"]))
        info = env.infos[agent]
        if agent == "coder":
            assert info["role_reward"] == 1.0, info
        else:  # all valid; the mutants it catches decide the rest (a few need tests too big to copy)
            assert info["tests_valid"] == info["tests_total"], info
            share = info["mutants_caught"] / info["mutants_total"] if info["mutants_total"] else 0.0
            assert info["role_reward"] == pytest.approx(0.5 + 0.5 * share), info
    assert env.success and env.turn == 1  # solved and agreed in the first turn


def test_a_run_that_left_memory_behind_fails_its_test_whatever_it_printed():
    """Such a run is hostile to the runs after it (its server retired): never a pass."""
    test = TestCase("1", "2")
    printed_right = sandbox.RunResult("2\n", "", 0, False, 0.01)
    assert StdioJudge().verdict(test, printed_right, 1.0) == (True, "2\n")
    left = dataclasses.replace(
        printed_right, left_behind="the run left 24.0 MiB charged to its memory cgroup"
    )
    passed, shown = StdioJudge().verdict(test, left, 1.0)
    assert not passed and "left something behind" in shown and "24.0 MiB" in shown
