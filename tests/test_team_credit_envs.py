"""Team credit on every built-in env, with scripted teammates (tests/oracles.py style).

For each env, one group holds a candidate that enables team success through the teammate's next
action, and candidates that do not. The look-ahead must give the enabling candidate a strictly
higher credited global part, and ``alpha`` must then change that group's advantages. Each test runs
the env for real (programs in the sandbox, answers through the checker), with K = 3 and two turns
at most, so the suite stays quick.
"""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

import oracles
from llm_zoo.data.code import CodeProblem, TestCase
from llm_zoo_train.engines.base import SamplingParams
from llm_zoo_train.rollout.tree import tree_rollout
from llm_zoo_train.training.advantages import compute_advantages
from toy_envs_trainer import ScriptedEngine

SAMPLING = SamplingParams(max_tokens=64, temperature=1.0, seed=5)
K = 3


def credited_group(env_id, env_kwargs, adapters, script, group, *, alpha, lookahead=-1, seed=1):
    """The samples of ``group`` (a group key) in a tree rollout, advantages computed."""
    samples = tree_rollout(
        env_id,
        {**env_kwargs, "alpha": alpha},
        [seed],
        ScriptedEngine(script=script),
        adapters,
        K,
        SAMPLING,
        np.random.default_rng(0),
        team_credit_lookahead=lookahead,
    )
    compute_advantages(samples)
    members = sorted((s for s in samples if s.group_key == group), key=lambda s: s.branch)
    assert len(members) == K, sorted({s.group_key for s in samples})
    return members


def assert_team_credit(run, enabling_branch: int) -> None:
    """The enabling branch is credited strictly more than every other branch of its group (whose
    immediate globals are all equal), and alpha changes the group's advantages."""
    plain = run(alpha=0.0)
    mixed = run(alpha=2.0)
    credited = [s.credited_global for s in mixed]
    others = [c for b, c in enumerate(credited) if b != enabling_branch]
    assert credited[enabling_branch] > max(others), credited
    assert len({s.global_reward for s in mixed}) == 1, "the immediate global already told them apart"
    assert [s.role_reward for s in plain] == [s.role_reward for s in mixed]
    assert [s.credited_global for s in plain] == credited
    advantages_plain = [s.advantage for s in plain]
    advantages_mixed = [s.advantage for s in mixed]
    assert advantages_mixed != pytest.approx(advantages_plain, abs=1e-3), (advantages_plain, advantages_mixed)
    assert advantages_mixed[enabling_branch] > advantages_plain[enabling_branch]
    # With look-ahead 0 the same group gets the immediate global: alpha cannot tell it apart.
    immediate = run(alpha=2.0, lookahead=0)
    assert len({s.credited_global for s in immediate}) == 1
    assert [s.advantage for s in immediate] == pytest.approx(advantages_plain)


# ---------------------------------------------------------------------- Plan-Path and Sokoban

_TOOL_MOVES = re.compile(r"Moves read from its output \(\d+\): (\[.*?\])")


def grid_script(solver):
    """Tool branch 0 prints a solution, branch 1 a solution one move short, branch 2 no program.
    The plan agent (the teammate) plays the moves the tool agent's program printed."""

    def script(prompt, adapter, index):
        if adapter == "tool":
            moves = solver(oracles.board_from_prompt(prompt))
            if index == 2:
                return "I would rather not write a program."
            return oracles.tool_answer(oracles.printing_program(moves if index == 0 else moves[:-1]))
        found = _TOOL_MOVES.search(prompt)
        return oracles.plan_answer(json.loads(found.group(1)) if found else ["U"])

    return script


GRID_ADAPTERS = {"tool_agent": "tool", "plan_agent": "plan"}


@pytest.mark.parametrize(
    "env_id, solver", [("PlanPath-v0", oracles.solve_grid_path), ("Sokoban-v0", oracles.solve_sokoban)]
)
def test_grid_tool_agent_is_credited_for_the_plan_its_program_enables(env_id, solver):
    def run(alpha, lookahead=-1):
        return credited_group(
            env_id, {"max_turns": 1}, GRID_ADAPTERS, grid_script(solver), "e0/t0/tool_agent",
            alpha=alpha, lookahead=lookahead,
        )  # fmt: skip

    members = run(alpha=2.0)
    # The tool's moves only run on a copy: immediate global 0; the plan agent's replay solves it.
    assert [s.global_reward for s in members] == [0.0, 0.0, 0.0]
    assert [s.credited_global for s in members] == [1.0, 0.0, 0.0]
    assert members[0].extra["lookahead"][0]["agent"] == "plan_agent"
    assert_team_credit(run, enabling_branch=0)


# ---------------------------------------------------------------------- Code

ABS_PROGRAM = "n = int(input())\nprint(abs(n))\n"
BUGGY_PROGRAM = "n = int(input())\nprint(n)\n"
ABS_PROBLEM = CodeProblem(
    id="test/abs",
    statement="Read an integer n and print its absolute value.",
    tests=(TestCase("3\n", "3\n"), TestCase("-4\n", "4\n"), TestCase("0\n", "0\n")),
    reference=ABS_PROGRAM,
)


def code_script(prompt, adapter, index):
    """The coder (teammate) writes the buggy program until a test disagrees with it, then fixes it.
    Tester branch 0 writes the test that exposes the bug, branch 1 one the bug passes, branch 2 no
    JSON."""
    if adapter == "coder":
        return f"```python\n{ABS_PROGRAM if '### Disagreement' in prompt else BUGGY_PROGRAM}```"
    tests = [[{"input": "-4\n", "output": "4\n"}], [{"input": "3\n", "output": "3\n"}]]
    return "I have no tests." if index == 2 else "```json\n" + json.dumps(tests[index]) + "\n```"


def test_code_unit_tester_is_credited_for_the_fix_its_tests_lead_to():
    def run(alpha, lookahead=-1):
        return credited_group(
            "Code-v0", {"dataset": [ABS_PROBLEM], "max_turns": 2}, {"coder": "coder", "unit_tester": "tester"},
            code_script, "e0/t0/unit_tester", alpha=alpha, lookahead=lookahead,
        )  # fmt: skip

    members = run(alpha=2.0)
    # Immediate global: the change of the hidden pass rate a tester's action makes, always 0.
    assert [s.global_reward for s in members] == [0.0, 0.0, 0.0]
    # The exposing test makes the coder fix its program (pass rate 2/3 -> 1); the passing test
    # ends the episode at once (program passes every valid test); no tests change nothing.
    assert [s.credited_global for s in members] == pytest.approx([1 / 3, 0.0, 0.0])
    assert [s.lookahead_steps for s in members] == [1, 0, 1]
    assert_team_credit(run, enabling_branch=0)


# ---------------------------------------------------------------------- Math

MATH_PROBLEM = [{"question": "What is 6 times 7?", "answer": "42"}]


def math_script(prompt, adapter, index):
    """The reasoner (teammate) answers 41, and adopts the tool agent's answer once it sees one.
    Tool branch 0 prints 42 (right), branch 1 prints 40, branch 2 writes no program."""
    if adapter == "reasoner":
        found = re.search(r"Its answer: (\S+)", prompt)
        return f"The answer is \\boxed{{{found.group(1) if found else 41}}}."
    if index == 2:
        return "No program today."
    return f"```python\nprint({42 if index == 0 else 40})\n```"


def test_math_tool_agent_is_credited_for_the_answer_the_reasoner_adopts():
    def run(alpha, lookahead=-1):
        return credited_group(
            "Math-v0", {"dataset": MATH_PROBLEM, "max_turns": 2}, {"reasoner": "reasoner", "tool_agent": "tool"},
            math_script, "e0/t0/tool_agent", alpha=alpha, lookahead=lookahead,
        )  # fmt: skip

    members = run(alpha=2.0)
    # Immediate global: the reasoner's 41 is wrong for every tool candidate.
    assert [s.global_reward for s in members] == [0.0, 0.0, 0.0]
    assert [s.credited_global for s in members] == [1.0, 0.0, 0.0]
    assert [step["completion"] for step in members[0].extra["lookahead"]] == ["The answer is \\boxed{42}."]
    assert_team_credit(run, enabling_branch=0)
