"""Code-v0 and Math-v0 pay the change of a level, so almost solving for many turns never pays more
than solving at once (issue 24: "every env pays most for solving")."""

from __future__ import annotations

import json

import pytest

import llm_zoo
from llm_zoo.data.code import CodeProblem, TestCase
from llm_zoo.envs.code import oracle_action as code_oracle
from llm_zoo.envs.math import MathEnv
from llm_zoo.envs.math import oracle_action as math_oracle
from llm_zoo.testing import play_episode

TWO = [{"question": "What is 1 + 1?", "answer": "2"}]
SUM_PROGRAM = "a, b = map(int, input().split())\nprint(a + b)\n"
FIVE_SUMS = CodeProblem(
    id="test/sum5",
    statement="Print a + b.",
    tests=tuple(TestCase(f"{a} {b}\n", f"{a + b}\n") for a, b in [(1, 2), (-4, 4), (10, 5), (7, 7), (3, 9)]),
    reference=SUM_PROGRAM,
)
#: Wrong only when a == 1: passes 4 of the 5 hidden tests (80%).
EIGHTY = "a, b = map(int, input().split())\nprint(0 if a == 1 else a + b)\n"
#: Valid tests that EIGHTY fails: the tester catches the bug every turn, so nothing settles.
CATCHING = "```json\n" + json.dumps([{"input": "1 5\n", "output": "6\n"}]) + "\n```"


def returns(env, policy) -> tuple[dict[str, float], float, int]:
    """Each agent's return (sum of its rewards), the team's (sum of global rewards), the actions."""
    trace = play_episode(env, lambda agent, prompt: policy(env, agent), seed=0)
    own = dict.fromkeys(env.possible_agents, 0.0)
    for agent, _, _, reward, _ in trace:
        own[agent] += reward
    return own, sum(step[4]["global_reward"] for step in trace), len(trace)


@pytest.mark.parametrize("alpha", [1.0, 0.5])
def test_code_coder_at_80_percent_for_every_turn_earns_less_than_solving_at_once(alpha):
    env = llm_zoo.make("Code-v0", dataset=[FIVE_SUMS], max_turns=3, alpha=alpha)
    solved, solved_team, solved_actions = returns(env, code_oracle)
    assert env.success and solved_actions == 2
    almost, almost_team, almost_actions = returns(
        env, lambda env, agent: f"```python\n{EIGHTY}```" if agent == "coder" else CATCHING
    )
    assert not env.success and almost_actions == 6 and sum(env.hidden_passed) == 4
    # the returns telescope to the final level: 0.8 for 3 turns pays what 0.8 once pays
    assert solved["coder"] == pytest.approx(1 + alpha) and solved_team == pytest.approx(1.0)
    assert almost["coder"] == pytest.approx(0.8 * (1 + alpha)) and almost["coder"] < solved["coder"]
    assert almost_team == pytest.approx(0.8) and almost_team < solved_team
    # the tester caught a real bug every turn: 1 in all, as much as with the solved program, not 3
    assert almost["unit_tester"] == pytest.approx(1.0) == solved["unit_tester"]


def test_code_coder_that_solves_then_breaks_its_program_keeps_the_solved_level():
    env = llm_zoo.make("Code-v0", dataset=[FIVE_SUMS], max_turns=3)
    wrong_tests = "```json\n" + json.dumps([{"input": "1 5\n", "output": "7\n"}]) + "\n```"  # never settles
    coder_turns = []

    def policy(env, agent):
        if agent == "unit_tester":
            return wrong_tests
        coder_turns.append(agent)
        return code_oracle(env, agent) if len(coder_turns) == 1 else f"```python\n{EIGHTY}```"

    own, team, _ = returns(env, policy)
    assert env.success and sum(env.hidden_passed) == 4
    assert own["coder"] == pytest.approx(2.0) and team == pytest.approx(1.0)


def test_math_agents_repeating_an_answer_earn_what_they_earn_once():
    env = MathEnv(dataset=TWO, max_turns=3)
    at_once, at_once_team, at_once_actions = returns(env, math_oracle)
    assert env.success and at_once_actions == 2
    # the reasoner is right every turn, the tool agent never agrees: still a success, 6 actions
    disagree = {"reasoner": "So \\boxed{2}.", "tool_agent": "```python\nprint(7)\n```"}
    slow, slow_team, slow_actions = returns(env, lambda env, agent: disagree[agent])
    assert env.success and slow_actions == 6
    assert at_once["reasoner"] == pytest.approx(2.0) and at_once_team == pytest.approx(1.0)
    assert slow["reasoner"] == pytest.approx(2.0) and slow_team == pytest.approx(1.0)
    # a wrong tool agent earns less than a right one, however long its team plays on
    assert slow["tool_agent"] == pytest.approx(0.0) and at_once["tool_agent"] == pytest.approx(1.0)
    # right tool agent, wrong reasoner for 3 turns: no success, and no agent earns more than solving
    wrong = {"reasoner": "So \\boxed{3}.", "tool_agent": "```python\nprint(2)\n```"}
    failed, failed_team, _ = returns(env, lambda env, agent: wrong[agent])
    assert not env.success and failed_team == pytest.approx(0.0)
    assert failed["reasoner"] == pytest.approx(0.0) and failed["tool_agent"] == pytest.approx(1.0)
    env.close()


def test_math_reasoner_right_then_wrong_ends_without_success_and_without_its_reward():
    env = MathEnv(dataset=TWO, max_turns=2)
    answers = iter(["\\boxed{2}", "\\boxed{5}"])
    own, team, _ = returns(
        env,
        lambda env, agent: next(answers) if agent == "reasoner" else "```python\nprint(7)\n```",
    )
    assert not env.success and own["reasoner"] == pytest.approx(0.0) and team == pytest.approx(0.0)
    env.close()


def test_a_malformed_answer_costs_the_penalty_once_and_the_next_good_answer_pays_it_back():
    env = llm_zoo.make("Code-v0", dataset=[FIVE_SUMS], max_turns=3)
    env.reset(seed=0)
    paid = []
    for coder_answer in ["no code", "no code either", f"```python\n{EIGHTY}```"]:
        env.step(coder_answer)
        paid.append(env.rewards["coder"])
        env.step(CATCHING)
    assert paid == pytest.approx([-1.0, 0.0, 1.0 + 2 * 0.8])
    assert sum(paid) == pytest.approx(2 * 0.8)  # where it ends, whatever came before


def test_a_failing_code_episode_never_beats_a_succeeding_one_with_a_malformed_first_answer():
    env = llm_zoo.make("Code-v0", dataset=[FIVE_SUMS], max_turns=3)
    late, late_team, _ = returns(
        env, lambda env, agent: "no code" if agent == "coder" and env.turn == 0 else code_oracle(env, agent)
    )
    assert env.success and late["coder"] == pytest.approx(2.0) and late_team == pytest.approx(1.0)
