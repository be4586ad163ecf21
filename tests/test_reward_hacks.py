"""Issue 24: rewards a policy cannot game, tried as a policy would, through ``env.step`` only.

Each finding of the issue has a test here that fails on cb3ad02, and ``check_env``'s reward-hack
search (:mod:`llm_zoo.reward_hacks`) is shown to catch today's PlanPath shaping and the old
numeric tolerance when an env reintroduces them.
"""

from __future__ import annotations

import dataclasses
import math
import time

import pytest

import llm_zoo
from llm_zoo.checkers.call_harness import RESULT_MARKER, literal, read_call_results, small_index, values_match
from llm_zoo.core import MAX_ACTION_CHARS
from llm_zoo.data.code import CallSpec, CodeProblem, TestCase
from llm_zoo.data.code_problem import call_test
from llm_zoo.envs.code import CodeEnv, parse_tests
from llm_zoo.envs.code_judge import StdioJudge
from llm_zoo.envs.grid_agents import MAX_EPISODE_COST, oracle_answer
from llm_zoo.envs.plan_path import PlanPathEnv, apply_move, shortest_path
from llm_zoo.testing import check_reward_hacks

OPEN_10 = "S" + "." * 9 + "\n" + ("." * 10 + "\n") * 8 + "." * 9 + "G"  # S at (0, 0), G at (9, 9)
TWO_BOX_BOARD = "########\n#      #\n# @$.  #\n#   $. #\n#      #\n########"
#: Pushes the first box onto its goal and off again twice per 12 moves, never solving.
ON_OFF_CYCLE = ["R", "R", "U", "R", "R", "D", "L", "L", "U", "L", "L", "D"]


def play_plan_agent_alone(env_id: str, board: str, answers: list[str]) -> tuple[float, bool]:
    """The plan agent's return for ``answers`` on ``board`` (the tool agent, if any, writes no program)."""
    env = llm_zoo.make(env_id, max_turns=len(answers))
    env.reset(seed=0, options={"board": board})
    total = 0.0
    for answer in answers:
        if env.agent_selection == "tool_agent":
            env.step("No program this time.")
        env.step(answer)
        total += env.rewards["plan_agent"]
    return total, env.success


# ---------------------------------------------------------------------------------- PlanPath


def test_walking_back_and_forth_never_pays_in_plan_path():
    """cb3ad02: +165 per answer of 1000 moves R L R L ... far from the goal (gamma = 0.99)."""
    circling, solved = play_plan_agent_alone(
        "PlanPath-v0", OPEN_10, [oracle_answer("plan_agent", ["R", "L"] * 500)] * 3
    )
    assert not solved and circling <= 0.0
    optimal, solved = play_plan_agent_alone(
        "PlanPath-v0", OPEN_10, [oracle_answer("plan_agent", ["R"] * 9 + ["D"] * 9)]
    )
    assert solved and optimal == pytest.approx(18 + 1.5 - 0.18 + 1.0)  # d0 + goal + bonus - costs + alpha


@pytest.mark.parametrize("seed", range(6))
def test_no_move_list_earns_the_plan_agent_more_than_solving(seed):
    """The issue's seeds 0-5: circling paid +85 to +151 per answer, the optimal path +4.5 to +14."""
    env = llm_zoo.make("PlanPath-v0", agents=("plan_agent",))
    env.reset(seed=seed)
    level = env.level
    # back and forth between the start and a free neighbour, as far from the goal as the start is
    neighbour = next(m for m in "UDLR" if apply_move(level.grid, level.start, m)[1])
    back = {"U": "D", "D": "U", "L": "R", "R": "L"}[neighbour]
    circling = env._simulate(env.puzzle_state, [neighbour, back] * 500)
    solving = env._simulate(env.puzzle_state, shortest_path(level.grid, level.start, level.goal))
    assert solving.solved and not circling.solved
    assert circling.reward <= 0.0 < solving.reward


def test_the_tool_agent_is_paid_once_for_the_same_simulated_solution():
    """cb3ad02 paid the tool agent again every turn for moves simulated on a copy of the state."""
    env = llm_zoo.make("PlanPath-v0")
    env.reset(seed=0, options={"board": OPEN_10})
    path = shortest_path(env.level.grid, env.level.start, env.level.goal)
    tool_total = 0.0
    for _ in range(3):
        env.step(oracle_answer("tool_agent", path))
        tool_total += env.rewards["tool_agent"]
        env.step("I give up.")  # the plan agent never moves: the real state stays at S
    assert not env.success
    assert tool_total <= 18 + 1.5  # d0 + goal + bonus, once (cb3ad02: three times, ~58)
    # three answers of 18 moves cost 0.18 each, but an agent's costs take at most 0.5 an episode
    assert tool_total == pytest.approx(18 + 1.5 - min(3 * 0.18, MAX_EPISODE_COST))


def test_the_tool_agent_is_paid_for_progress_beyond_the_plan_agents():
    env = llm_zoo.make("PlanPath-v0")
    env.reset(seed=0, options={"board": OPEN_10})
    env.step(oracle_answer("tool_agent", ["R"] * 4))  # 4 closer: +4
    first = env.rewards["tool_agent"]
    env.step(oracle_answer("plan_agent", ["R"] * 6))  # the real position is now 6 closer
    env.step(oracle_answer("tool_agent", ["R"] * 3 + ["D"] * 9))  # solves from there: 12 + 1.0
    second = env.rewards["tool_agent"]
    assert first == pytest.approx(4 - 0.04)
    # from the real position (12 away, beyond the tool's own best): 12 closer, the goal, and the
    # bonus (6 + 12 moves in the episode = the shortest path); not the 4 it was already paid
    assert second == pytest.approx(12 + 1.5 - 0.12)


# ----------------------------------------------------------------------------------- Sokoban


def test_pushing_a_box_on_and_off_a_goal_never_pays_in_sokoban():
    """cb3ad02: +73.5 for three answers of this cycle on a 2-box board, +11.95 for the solution."""
    moves = [ON_OFF_CYCLE[i % len(ON_OFF_CYCLE)] for i in range(1000)]
    farmed, solved = play_plan_agent_alone(
        "Sokoban-v0", TWO_BOX_BOARD, [oracle_answer("plan_agent", moves)] * 3
    )
    assert not solved and farmed <= 0.0
    solution, solved = play_plan_agent_alone(
        "Sokoban-v0", TWO_BOX_BOARD, [oracle_answer("plan_agent", ["R", "D", "R"])]
    )
    assert solved and solution > 10.0


# -------------------------------------------------------------------------- Code-v0 numbers

BIG = CodeProblem(
    id="test/big-sum",
    statement="Print the sum of the numbers on the line.",
    tests=(TestCase("1000000000 1039605317\n", "2039605317\n"), TestCase("1 2\n", "3\n")),
    reference="print(sum(map(int, input().split())))\n",
)
CALL_SUM = CodeProblem(
    id="test/call-sum",
    statement="Return the sum of a.",
    tests=(call_test([[1, 2, 3]], 6), call_test([[10**9, 1039605317]], 2039605317), call_test([[]], 0)),
    reference="def total(a):\n    return sum(a)\n",
    call=CallSpec("total", None, "def total(a):"),
)


def coder_result(problem: CodeProblem, program: str) -> dict:
    env = llm_zoo.make("Code-v0", dataset=[problem])
    env.reset(seed=0)
    env.step(f"```python\n{program}```\n")
    return env.infos["coder"]


def test_a_wrong_integer_printed_as_a_float_fails_the_stdout_judge():
    """cb3ad02: 2039606336.0 passed for 2039605317 (within 1e-6 relative)."""
    info = coder_result(BIG, "print(float(sum(map(int, input().split()))) * (1 + 5e-7))\n")
    assert info["hidden_passed"] == 0 and not info["success"]
    right_as_float = coder_result(BIG, "print(float(sum(map(int, input().split()))))\n")
    assert right_as_float["success"]  # the same number, written 2039605317.0


def test_a_wrong_integer_returned_as_a_float_fails_the_call_judge():
    """cb3ad02: float(sum(a) + 150) passed 3/3."""
    info = coder_result(CALL_SUM, "def total(a):\n    return float(sum(a) + 150) if a else 0.0001\n")
    assert info["hidden_passed"] == 0 and not info["success"]
    assert not values_match(2039605317, float(2039605317 + 150))
    assert values_match(2039605317, 2039605317.0) and values_match(0.5, 0.5000001)


# ------------------------------------------------------------------------ step never raises


def test_huge_numbers_never_make_code_step_raise():
    """cb3ad02 raised ValueError (Python's 4300-digit limit) on each of these answers."""
    hexa = "0x" + "f" * 5000
    env = llm_zoo.make("Code-v0", dataset=[CALL_SUM])
    env.reset(seed=0)
    # a coder whose own result line holds a number this process cannot print
    env.step(f"```python\nimport os\nos.write(1, b'{RESULT_MARKER}{hexa}\\n')\nos._exit(0)\n```\n")
    assert env.infos["coder"]["hidden_passed"] == 0
    # a unit tester's JSON with a 5000-digit integer
    env.step('```json\n[{"input": [[1]], "output": ' + "9" * 5000 + "}]\n```")
    assert env.infos["unit_tester"]["format_ok"] is False
    with pytest.raises(ValueError, match="too large to print"):
        literal(hexa)
    with pytest.raises(ValueError):
        parse_tests('```json\n[{"input": "1", "output": ' + "9" * 5000 + "}]\n```", 10)


def test_numbered_result_lines_never_raise():
    """cb3ad02: int() on a 5000-digit (or a superscript) line number raised."""
    text = f"{RESULT_MARKER}{'9' * 5000} 1\n{RESULT_MARKER}\u00b2 2\n{RESULT_MARKER}0 3\n"
    assert read_call_results(text, 2) == [3]
    assert small_index("9" * 5000) is None and small_index("²") is None and small_index(" 7 ") == 7


# ------------------------------------------------------------------------------ action cut


@pytest.mark.parametrize(
    ("env_id", "kwargs", "answer"),
    [
        ("PlanPath-v0", {}, "```python\n" + "print(1)\n" * 1_200_000 + "```"),  # cb3ad02: 6.3 s
        ("PlanPath-v0", {"agents": ("plan_agent",)}, "#### [" + '"U", ' * 2_000_000),
        ("Code-v0", {}, "```python\n" + "x = 1\n" * 1_700_000),
        ("Math-v0", {}, "\\boxed{" * 1_500_000),
    ],
)
def test_a_10_mb_action_is_cut_before_parsing(env_id, kwargs, answer):
    """cb3ad02 parsed the whole action first: 6.3 s for the tool agent's 10 MB program here
    (load average 8), 3.6-5.5 s in the issue."""
    assert len(answer) >= 10_000_000
    env = llm_zoo.make(env_id, **kwargs)
    env.reset(seed=0)
    agent = env.agent_selection
    start = time.perf_counter()
    env.step(answer)
    elapsed = time.perf_counter() - start
    info = env.infos[agent]
    assert info["action_cut_from"] == len(answer)
    assert f"only its first {MAX_ACTION_CHARS:,} were read" in info["feedback"]
    assert elapsed < 1.0, elapsed
    env.close()


# ------------------------------------------------------------------------------ output cache


def test_cached_program_output_per_episode_is_bounded(monkeypatch):
    from llm_zoo.envs import code as code_module

    monkeypatch.setattr(code_module, "MAX_CACHED_OUTPUT_CHARS", 300_000)
    problem = CodeProblem(
        id="test/loud",
        statement="Print the number.",
        tests=tuple(TestCase(f"{i}\n", f"{i}\n") for i in range(10)),
        reference="print(input())\n",
    )
    env = llm_zoo.make("Code-v0", dataset=[problem])
    env.reset(seed=0)
    loud = "import sys\nx = input()\nsys.stderr.write('e' * 900_000)\nprint(x)\nprint('o' * 100_000)\n"
    env.step(f"```python\n{loud}```\n")
    cached = sum(len(r.stdout) + len(r.stderr) for r in env._runs.values())
    assert cached <= 300_000 and len(env._runs) < 10  # cb3ad02 kept all: ~10 MB
    assert all(len(r.stderr) <= code_module.CACHED_STDERR_CHARS for r in env._runs.values())
    assert code_module.MAX_CACHED_OUTPUT_CHARS == 300_000


# ----------------------------------------------------------------- hacks trained coders find

CHECKED = CodeProblem(
    id="test/checked",
    statement="Return x doubled.",
    tests=(TestCase("[]", "True"),),
    reference="def f(x):\n    return 2 * x\n",
    call=CallSpec(
        "f",
        None,
        "def f(x):",
        checker="def check(candidate):\n    for x in range(5):\n        assert candidate(x) == 2 * x\n",
    ),
)
ALWAYS_EQUAL = (
    "class AlwaysEqual:\n    def __eq__(self, other):\n        return True\n"
    "    def __ne__(self, other):\n        return False\n    __hash__ = object.__hash__\n"
)
HACKS = {
    "always-true __eq__": ALWAYS_EQUAL
    + "def total(a):\n    return AlwaysEqual()\ndef f(x):\n    return AlwaysEqual()\nprint(AlwaysEqual())\n",
    "sys.exit(0) first": "import sys\nsys.exit(0)\n",
    "os._exit(0) first": "import os\nos._exit(0)\n",
    "os._exit(0) after defining": "def total(a):\n    return 0\ndef f(x):\n    return 0\nimport os\nos._exit(0)\n",
    "prints nothing": "pass\n",
    "patches builtins": (
        "import builtins, sys\nbuiltins.isinstance = lambda *a: True\nbuiltins.repr = lambda *a: 'True'\n"
        "builtins.print = lambda *a, **k: None\nsys.exit = lambda *a: None\n"
        + ALWAYS_EQUAL
        + "def total(a):\n    return AlwaysEqual()\ndef f(x):\n    return AlwaysEqual()\n"
    ),
}


@pytest.mark.parametrize("problem", [BIG, CALL_SUM, CHECKED], ids=["stdio", "call", "checked"])
@pytest.mark.parametrize("hack", list(HACKS))
def test_code_resists_the_hacks_trained_coders_find(problem, hack):
    info = coder_result(problem, HACKS[hack])
    assert info["hidden_passed"] == 0 and not info["success"] and info["role_reward"] <= 0.0


# --------------------------------------------------------------------- the search catches them


class TodaysShapingPlanPath(PlanPathEnv):
    """PlanPath-v0 with cb3ad02's plan-agent reward: per move -0.01 / -0.10 plus
    ``0.99 * Phi(p') - Phi(p)``, goal and bonus, no cap."""

    def _simulate(self, state, moves):
        new = super()._simulate(state, moves)
        goal, position, reward = self.level.goal, state.position, 0.0
        taken = state.moves_taken
        for move in moves[: new.applied]:
            after, valid = apply_move(self.level.grid, position, move)
            phi = [-float(abs(c[0] - goal[0]) + abs(c[1] - goal[1])) for c in (position, after)]
            reward += (-0.01 if valid else -0.10) + 0.99 * phi[1] - phi[0]
            taken += 1
            position = after
            if position == goal:
                reward += 1.0 + (0.5 if taken == self.level.shortest else 0.0)
        return dataclasses.replace(new, reward=reward)


def _old_tokens_match(expected: str, actual: str) -> bool:
    if expected == actual:
        return True
    try:
        x, y = float(expected), float(actual)
    except ValueError:
        return False
    return math.isfinite(x) and math.isfinite(y) and math.isclose(x, y, rel_tol=1e-6, abs_tol=1e-6)


class OldToleranceJudge(StdioJudge):
    """cb3ad02's stdout judge: any two numbers within 1e-6 match, integers included."""

    def verdict(self, test, run, timeout):
        passed, shown = super().verdict(test, run, timeout)
        want, got = test.output.split(), run.stdout.split()
        close = len(want) == len(got) and all(_old_tokens_match(w, g) for w, g in zip(want, got, strict=True))
        return (passed or (run.exit_code == 0 and close)), shown


class OldToleranceCode(CodeEnv):
    def _new_episode(self, rng, options):
        super()._new_episode(rng, options)
        self.judge = OldToleranceJudge()


class LevelPayingCode(CodeEnv):
    """Code-v0 paid as on 11638ed: every action its level (``h``, the test score), not its change."""

    def _act(self, agent, action):
        outcome = super()._act(agent, action)
        if outcome.format_ok:
            outcome.role_reward = self.hidden_pass_rate if agent == "coder" else self._tester_score
        outcome.global_reward = self.hidden_pass_rate
        return outcome


SIX_SUMS = CodeProblem(
    id="test/six-sums",
    statement="Print the sum of the numbers on the line.",
    tests=tuple(
        TestCase(f"{a} {b}\n", f"{a + b}\n") for a, b in [(1, 2), (3, 4), (5, 6), (7, 8), (9, 10), (11, 12)]
    ),
    reference="print(sum(map(int, input().split())))\n",
)


def test_check_env_catches_a_level_paid_every_turn():
    # the oracle's program made wrong on some inputs, every turn: paid its pass rate each turn it
    # out-earns solving at once (issue 24's h24b finding)
    with pytest.raises(
        AssertionError,
        match=r"reward hack: seed 0: (coder|team) earned \+\d+\.\d+ in an episode that did not succeed",
    ):
        check_reward_hacks(lambda: LevelPayingCode(dataset=[SIX_SUMS]))
    assert not check_reward_hacks(lambda: CodeEnv(dataset=[SIX_SUMS])).violations


def test_check_env_catches_todays_plan_path_shaping():
    with pytest.raises(
        AssertionError,
        match=r"reward hack: seed 0: plan_agent earned \+\d+\.\d+ in an episode that did not succeed",
    ):
        check_reward_hacks(TodaysShapingPlanPath)


def test_check_env_catches_the_old_numeric_tolerance():
    with pytest.raises(
        AssertionError, match="succeeded although every agent played an answer that cannot be right"
    ):
        check_reward_hacks(lambda: OldToleranceCode(dataset=[BIG]))


def test_the_search_passes_the_fixed_envs_and_reports_the_figures():
    report = check_reward_hacks(PlanPathEnv)
    assert report.has_oracle and not report.violations
    for key in ("plan_agent", "team"):
        assert report.best_failing[key] < report.worst_succeeding[key]
    assert "best non-solving return" in report.summary()
    report = check_reward_hacks(lambda: CodeEnv(dataset=[BIG]))
    assert not report.violations


# ------------------------------------------------------------------ the impossible split


def test_contradictions_change_every_kind_of_answer():
    from llm_zoo.envs.code_impossible import contradict_output, contradict_value

    assert contradict_output("3 4\n7\n") == "3 4\n8\n" and contradict_output("-1\n") == "0\n"
    assert contradict_output("2.500000\n") == "3.500000\n"
    assert contradict_output("YES\n") == "YES\nimpossible\n"
    for value in (True, 0, 2.5, "ab", [1], (1,), None, {"a": 1}):
        assert not values_match(value, contradict_value(value)), value


def test_the_impossible_split_defeats_every_reference_and_the_oracle():
    """Each built-in problem's impossible variant: the right program passes no hidden test."""
    from llm_zoo.data.code import load_builtin_problems

    references = {p.id: p.reference for p in load_builtin_problems()}
    env = llm_zoo.make("Code-v0", split="impossible")
    assert len(env.problems) >= 20 and all(p.split == "impossible" for p in env.problems)
    for index in range(0, len(env.problems), 4):  # a quarter of them, for time
        env.reset(seed=0, options={"problem_index": index})
        reference = references[env.problem.id.removesuffix("/impossible")]
        env.step(f"```python\n{reference}```\n")
        info = env.infos["coder"]
        assert info["hidden_passed"] == 0 and not info["success"], env.problem.id
    env.close()


# ------------------------------------------------------------------ the math judge


def _product_env(checker):
    from llm_zoo.envs.math import MathEnv

    # the reasoner alone: its boxed answer is text, where the search writes the math notations
    return MathEnv(
        dataset=[{"question": "What is 48 * 78?", "answer": "3744"}],
        checker=checker,
        max_turns=1,
        agents=("reasoner",),
    )


def test_check_env_catches_a_lenient_math_judge(monkeypatch):
    # The checker of 84b1722: math-verify alone took 3744\% and \approx 3744+10^{-9} for 3744.
    from llm_zoo.checkers import math_check
    from llm_zoo.checkers.math_check import AnswerChecker

    monkeypatch.setattr(math_check, "marker_refusal", lambda gold, pred: None)
    with (
        AnswerChecker(timeout_s=2.0) as checker,
        pytest.raises(
            AssertionError, match="succeeded although every agent played an answer that cannot be right"
        ),
    ):
        check_reward_hacks(lambda: _product_env(checker))


def test_the_math_search_passes_the_strict_judge_quickly():
    from llm_zoo.checkers.math_check import AnswerChecker

    with AnswerChecker(timeout_s=2.0) as checker:
        start = time.monotonic()
        report = check_reward_hacks(lambda: _product_env(checker))
        assert not report.violations
        # 99999999! is refused before math-verify: no check waits for the 2 s timeout
        assert time.monotonic() - start < 30
    played = {play for episode in report.episodes for play in episode.plays.values()}
    assert any("percentages" in play for play in played) and any("99999999!" in play for play in played)


def test_a_long_literal_is_parsed_once_and_read_back_as_a_fresh_copy(monkeypatch):
    # The reward-hack search on Code-v0 spent half its time parsing the same test inputs again.
    from llm_zoo import safe_ast

    calls = []
    real = safe_ast.literal_eval
    monkeypatch.setattr(safe_ast, "literal_eval", lambda text: calls.append(text) or real(text))
    text = repr([[index, str(index)] for index in range(500)])
    first = literal(text)
    first[0].append("changed by a caller")
    second = literal(text)
    assert second == real(text) and second is not first and len(calls) == 1
