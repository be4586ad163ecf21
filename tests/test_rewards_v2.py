"""Issue 48: rewards v2, tried as a PettingZoo user and a policy would, through ``env.step`` only.

Returns are summed as a PettingZoo user sums them: the reward ``env.last()`` gives for every agent
the iterator yields. Each finding of the issue has a test here that fails on 27545b9.
"""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest

import llm_zoo
from llm_zoo.checkers.call_harness import literal, values_match
from llm_zoo.core import MAX_TURNS, TextAECEnv
from llm_zoo.envs import code as code_env
from llm_zoo.envs import math as math_env
from llm_zoo.envs.code_judge import outputs_match, run_program_on_inputs
from llm_zoo.envs.code_mutants import known_wrong_mutants, mutant_sources
from llm_zoo.envs.grid_agents import oracle_answer
from llm_zoo.envs.plan_path import PlanPathEnv
from llm_zoo.reward_hacks import adversaries, search_reward_hacks
from llm_zoo.testing import check_reward_hacks

OPEN_10 = "S" + "." * 9 + "\n" + ("." * 10 + "\n") * 8 + "." * 9 + "G"  # S at (0, 0), G at (9, 9)
TWO_BOX_BOARD = "########\n#      #\n# @$.  #\n#   $. #\n#      #\n########"
HUGE_EXPONENT = "1e" + "9" * 30

Answer = Callable[[str, TextAECEnv, int], str]  # (agent, env, how many answers it gave before) -> text


def pettingzoo_returns(
    env: TextAECEnv, answer: Answer, parts: dict[str, float] | None = None
) -> tuple[dict[str, float], bool]:
    """Every agent's return as a PettingZoo user sums it, and whether the episode succeeded;
    ``parts`` (if given) receives each agent's summed role rewards and the team's (``"team"``)
    summed global rewards."""
    returns = dict.fromkeys(env.possible_agents, 0.0)
    answered = dict.fromkeys(env.possible_agents, 0)
    for agent in env.agent_iter():
        _, reward, terminated, truncated, _ = env.last(observe=False)
        returns[agent] += reward
        if terminated or truncated:
            env.step(None)
            continue
        env.step(answer(agent, env, answered[agent]))
        answered[agent] += 1
        if parts is not None:
            parts[agent] = parts.get(agent, 0.0) + env.infos[agent]["role_reward"]
            parts["team"] = parts.get("team", 0.0) + env.infos[agent]["global_reward"]
    return returns, bool(env.success)


def scripted(**scripts: Callable[[TextAECEnv, int], str]) -> Answer:
    return lambda agent, env, index: scripts[agent](env, index)


def fixed(text: str) -> Callable[[TextAECEnv, int], str]:
    return lambda env, index: text


# ------------------------------------------------------------ the team's outcome reaches everyone


def test_the_math_tool_agent_earns_more_when_the_reasoner_then_solves():
    """27545b9: the tool agent printing the right answer earned +1.000 either way."""
    env = llm_zoo.make("Math-v0", max_turns=2)
    env.reset(seed=3)
    right_program = math_env.oracle_action(env, "tool_agent")
    right_answer = math_env.oracle_action(env, "reasoner")
    wrong_answer = "\\boxed{" + ("0" if "\\boxed{0}" not in right_answer else "1") + "}"

    def reasoner(solves: bool) -> Callable[[TextAECEnv, int], str]:
        return lambda env, index: right_answer if solves and index == 1 else wrong_answer

    outcomes = {}
    for solves in (True, False):
        env.reset(seed=3)
        outcomes[solves] = pettingzoo_returns(
            env, scripted(reasoner=reasoner(solves), tool_agent=fixed(right_program))
        )
    (solved, success), (failed, failure) = outcomes[True], outcomes[False]
    assert success and not failure
    assert solved["tool_agent"] == pytest.approx(1.0 + env.alpha) and failed["tool_agent"] == pytest.approx(
        1.0
    )
    assert solved["tool_agent"] > failed["tool_agent"]


def test_the_plan_path_tool_agent_earns_more_when_the_plan_agent_then_solves():
    """27545b9: the tool agent earned +5.460 either way (one turn: its own answer is the same)."""
    env = llm_zoo.make("PlanPath-v0", max_turns=1)
    env.reset(seed=0, options={"board": OPEN_10})
    program = llm_zoo.envs.plan_path.oracle_action(env, "tool_agent")
    solving = llm_zoo.envs.plan_path.oracle_action(env, "plan_agent")
    returns = {}
    for plan in (solving, "I give up."):
        env.reset(seed=0, options={"board": OPEN_10})
        returns[plan] = pettingzoo_returns(env, scripted(tool_agent=fixed(program), plan_agent=fixed(plan)))
    assert returns[solving][1] and not returns["I give up."][1]
    assert returns[solving][0]["tool_agent"] > returns["I give up."][0]["tool_agent"]


def test_the_unit_tester_earns_more_when_the_coder_then_solves():
    """27545b9: the unit tester earned +1.000 either way."""
    env = llm_zoo.make("Code-v0", max_turns=2)
    env.reset(seed=0, options={"problem_id": "builtin/even-sum"})
    tests = code_env.oracle_action(env, "unit_tester")
    right = code_env.oracle_action(env, "coder")
    wrong = "```python\nprint(0)\n```"
    returns, passed = {}, {}
    for final in (right, wrong):
        env.reset(seed=0, options={"problem_id": "builtin/even-sum"})
        coder = lambda env, index, final=final: wrong if index == 0 else final  # noqa: E731
        returns[final] = pettingzoo_returns(env, scripted(coder=coder, unit_tester=fixed(tests)))
        env.reset(seed=0, options={"problem_id": "builtin/even-sum"})
        env.step(final)
        passed[final] = env.infos["coder"]["hidden_passed"] / env.infos["coder"]["hidden_total"]
    assert returns[right][1] and not returns[wrong][1] and passed[wrong] < 1
    assert returns[right][0]["unit_tester"] > returns[wrong][0]["unit_tester"]
    # the same tests score the same: the difference is the team's part, alpha x (1 - h_final)
    difference = returns[right][0]["unit_tester"] - returns[wrong][0]["unit_tester"]
    assert difference == pytest.approx(env.alpha * (1 - passed[wrong]))


def test_every_agents_return_is_its_role_rewards_plus_alpha_times_the_team_level():
    """The reward algebra of llm_zoo.core, on a whole episode: the first mover included."""
    env = llm_zoo.make("Math-v0", max_turns=3, alpha=0.5)
    env.reset(seed=5)
    policy = math_env.oracle_policy(env)
    parts: dict[str, float] = {}
    returns, success = pettingzoo_returns(
        env, lambda agent, env, _: policy(agent, env.observe(agent)["prompt"]), parts
    )
    assert success and parts["team"] == 1.0
    for agent in env.possible_agents:
        assert returns[agent] == pytest.approx(parts[agent] + 0.5 * parts["team"])


# ----------------------------------------------------------------- testers paid for catching bugs


@pytest.mark.parametrize("problem_id", ["builtin/even-sum", "builtin/ping-pong", "builtin/count-vowels"])
def test_a_copied_sample_earns_the_tester_less_than_the_hidden_tests(problem_id):
    """27545b9: one test copied from the statement's sample earned 1.000, as the hidden tests."""
    env = llm_zoo.make("Code-v0", split="all")
    env.reset(seed=0, options={"problem_id": problem_id})
    sample = env.problem.tests[0]
    assert " ".join(sample.input.split()) in " ".join(env.problem.statement.split())
    copied = "```json\n" + json.dumps([{"input": sample.input, "output": sample.output}]) + "\n```"
    hidden = code_env.oracle_action(env, "unit_tester")
    right = code_env.oracle_action(env, "coder")
    wrong = next(
        f"```python\n{m}\n```"
        for m in mutant_sources(env.problem.reference)
        if not all(passed for passed, _ in env._judge(m, env.hidden_tests))
    )

    def tester_reward(coder: str, tests: str) -> float:
        env.reset(seed=0, options={"problem_id": problem_id})
        env.step(coder)
        env.step(tests)
        return env.infos["unit_tester"]["role_reward"]

    for coder in (right, wrong):
        assert tester_reward(coder, copied) < tester_reward(coder, hidden)
    assert tester_reward(right, copied) == pytest.approx(0.5)  # valid, but catches nothing new


@pytest.mark.slow
def test_on_every_built_in_problem_the_hidden_tests_beat_a_copied_sample():
    env = llm_zoo.make("Code-v0", split="all")
    for problem in env.problems:
        env.reset(seed=0, options={"problem_id": problem.id})
        sample = problem.tests[0]
        if problem.call is None:
            item = {"input": sample.input, "output": sample.output}
        else:
            item = {"input": literal(sample.input), "output": literal(sample.output)}
        copied = "```json\n" + json.dumps([item]) + "\n```"
        hidden = code_env.oracle_action(env, "unit_tester")
        env.step(code_env.oracle_action(env, "coder"))
        env.step(copied)
        copied_score = env.infos["unit_tester"]["role_reward"]
        env.reset(seed=0, options={"problem_id": problem.id})
        env.step(code_env.oracle_action(env, "coder"))
        env.step(hidden)
        assert copied_score < env.infos["unit_tester"]["role_reward"], problem.id


def test_an_invalid_test_never_raises_the_testers_score():
    env = llm_zoo.make("Code-v0", split="all")
    env.reset(seed=0, options={"problem_id": "builtin/even-sum"})
    hidden = json.loads(code_env.oracle_action(env, "unit_tester").split("```json\n")[1].split("\n```")[0])
    bad = {"input": "2\n2 4\n", "output": "7\n"}  # the sum of the even numbers is 6
    scores = []
    for tests in (hidden, [*hidden, bad]):
        env.reset(seed=0, options={"problem_id": "builtin/even-sum"})
        env.step("```json\n" + json.dumps(tests) + "\n```")  # the coder's turn: malformed
        env.step("```json\n" + json.dumps(tests) + "\n```")
        scores.append(env.infos["unit_tester"]["role_reward"])
        assert env.infos["unit_tester"]["tests_invalid"] == (tests is not hidden)
    assert scores[1] < scores[0]


def test_mutants_are_deterministic_distinct_and_known_wrong():
    reference = "n = int(input())\nprint(sum(x for x in range(1, n + 1) if x % 2 == 0))\n"
    sources = mutant_sources(reference)
    assert sources == mutant_sources(reference) and len(set(sources)) == len(sources) > 4
    assert all(source != reference for source in sources)
    assert mutant_sources("def broken(:\n") == []

    inputs = [f"{n}\n" for n in range(1, 7)]
    expected = [f"{sum(x for x in range(1, n + 1) if x % 2 == 0)}\n" for n in range(1, 7)]

    def passes(source: str) -> list[bool]:  # run in the sandbox on n = 1..6
        runs = run_program_on_inputs(source, inputs, 3.0, 256)
        return [
            outputs_match(want, run.stdout) and run.exit_code == 0
            for want, run in zip(expected, runs, strict=True)
        ]

    kept = known_wrong_mutants(reference, passes, 3, key="test-mutants")
    assert 0 < len(kept) <= 3
    assert all(not all(passes(m)) for m in kept)
    ranked = sorted(kept, key=lambda m: -sum(passes(m)))
    assert [sum(passes(m)) for m in ranked] == [sum(passes(m)) for m in kept]  # hardest to catch first
    assert known_wrong_mutants(reference, passes, 0, key="test-mutants") == ()


# ------------------------------------------------------------------------- late solving pays


def _late_and_short(env_id: str, board: str, solution: list[str], short: list[str], turns: int, team: bool):
    """Returns of (flounder, then solve at the last turn) and of the failing scripts closest to it."""
    agents = ("tool_agent", "plan_agent") if team else ("plan_agent",)
    kwargs = {"max_turns": turns}
    if env_id == "PlanPath-v0":
        kwargs["agents"] = agents
    env = llm_zoo.make(env_id, **kwargs)

    def run(plan: Callable[[TextAECEnv, int], str]) -> tuple[dict[str, float], bool]:
        env.reset(seed=0, options={"board": board})
        return pettingzoo_returns(env, scripted(tool_agent=fixed("No program."), plan_agent=plan))

    last = turns - 1
    floundered = run(lambda env, i: oracle_answer("plan_agent", solution) if i == last else "I give up.")
    failing = [
        run(lambda env, i: oracle_answer("plan_agent", short) if i == last else "I give up."),
        run(lambda env, i: oracle_answer("plan_agent", short) if i == 0 else "I give up."),
        run(lambda env, i: oracle_answer("plan_agent", short) if i == 0 else '#### ["U"]'),  # a wall
    ]
    return floundered, failing


@pytest.mark.parametrize("turns", [1, 2, 5, 14, 100, MAX_TURNS])
@pytest.mark.parametrize(
    ("env_id", "board", "solution", "short", "team"),
    [
        ("PlanPath-v0", OPEN_10, ["R"] * 9 + ["D"] * 9, ["R"] * 9 + ["D"] * 8, False),
        ("PlanPath-v0", OPEN_10, ["R"] * 9 + ["D"] * 9, ["R"] * 9 + ["D"] * 8, True),
        ("Sokoban-v0", TWO_BOX_BOARD, ["R", "D", "R"], ["R", "D"], True),  # no plan-alone option
    ],
)
def test_solving_at_the_last_turn_beats_stopping_short(env_id, board, solution, short, turns, team):
    """27545b9: Plan-Path at 5 turns paid +1.47 for solving last, +1.90 for one cell short;
    Sokoban with 2 boxes at 14 turns -0.05 against +0.73."""
    (solved_returns, solved), failing = _late_and_short(env_id, board, solution, short, turns, team)
    assert solved
    for returns, success in failing:
        assert not success
        for agent, value in returns.items():
            assert solved_returns[agent] > value, (agent, solved_returns, returns)


# ----------------------------------------------------------------------- judges never raise

NUMBER_FORMS = [HUGE_EXPONENT, "-" + HUGE_EXPONENT, "1e-" + "9" * 30, "nan", "NaN", "inf", "-inf",
                "9" * 5000, "9" * 5000 + ".5", "0x" + "f" * 100, "1e400", "1E+99999", "."]  # fmt: skip


@pytest.mark.parametrize("form", NUMBER_FORMS)
def test_the_stdio_judge_never_raises(form):
    for expected, actual in [
        ("5", form),
        (form, "5"),
        ("2.5", form),
        (form, form),
        (f"1 {form}", f"1 {form}0"),
    ]:
        assert outputs_match(expected, actual) in (True, False)
    assert not outputs_match("5", form)


@pytest.mark.parametrize(
    "pair",
    [
        (0.5, 10**400),
        (10**400, 0.5),
        ([0.5], [10**400]),
        (float("nan"), 10**400),
        ({"a": 0.5}, {"a": 10**400}),
    ],
)
def test_the_call_comparer_never_raises(pair):
    expected, actual = pair
    assert values_match(expected, actual) is False


def test_a_huge_exponent_never_makes_code_step_raise():
    """27545b9: decimal.InvalidOperation in env.step when the coder printed 1e and 30 nines, or the
    unit tester claimed that output for the statement's sample."""
    env = llm_zoo.make("Code-v0", split="all")
    env.reset(seed=0, options={"problem_id": "builtin/even-sum"})
    env.step(f'```python\nprint("{HUGE_EXPONENT}")\n```')
    assert env.infos["coder"]["hidden_passed"] == 0
    sample = env.problem.tests[0]
    env.step("```json\n" + json.dumps([{"input": sample.input, "output": HUGE_EXPONENT}]) + "\n```")
    assert env.infos["unit_tester"]["tests_invalid"] == 1


# -------------------------------------------------------------------- the search grows


def test_the_search_has_a_huge_exponent_form():
    assert any("1e999" in adversary.name for adversary in adversaries())


def test_the_search_catches_a_team_reward_paid_to_the_actor_only():
    """27545b9's core paid the team's outcome to the acting agent alone: the search now holds an
    agent's own answers fixed and compares its return as a PettingZoo user sums it."""

    class ActorOnlyTeamReward(math_env.MathEnv):
        metadata = {**math_env.MathEnv.metadata, "name": "actor_only_v0"}

        def step(self, action):
            self._actor = self.agent_selection
            super().step(action)

        def _accumulate_rewards(self):
            for agent in self.rewards:
                if agent != getattr(self, "_actor", agent):
                    self.rewards[agent] = 0.0
            super()._accumulate_rewards()

    report = search_reward_hacks(ActorOnlyTeamReward)
    fixed_answers = [v for _, v in report.violations if "tool_agent: its own oracle-episode answers" in v]
    assert fixed_answers, report.violations
    assert not search_reward_hacks(math_env.MathEnv).violations


def test_the_search_counts_ties():
    """With alpha 0 the team's outcome reaches nobody: the tool agent's fixed right program earns
    1 whether the reasoner solves or not, a tie the search reports."""
    with pytest.raises(AssertionError, match="as much as"):
        check_reward_hacks(lambda: llm_zoo.make("Math-v0", alpha=0.0))


def test_the_search_catches_a_format_penalty_never_paid_back():
    """Before v2 every unusable grid answer cost 1 for good: at 6 turns, floundering and solving
    at the last turn paid less than stopping short. The search's late play finds it."""

    class NeverPaidBack(PlanPathEnv):
        metadata = {**PlanPathEnv.metadata, "name": "never_paid_back_v0"}

        def _format_failure(self, agent, *args):
            self._penalty[agent] = 0.0
            outcome = super()._format_failure(agent, *args)
            self._penalty[agent] = 0.0
            return outcome

    env_fn = lambda: NeverPaidBack(max_turns=6, rows=4, cols=4)  # noqa: E731
    with pytest.raises(AssertionError, match="until the last turn"):
        check_reward_hacks(env_fn)
    assert not check_reward_hacks(lambda: PlanPathEnv(max_turns=6, rows=4, cols=4)).violations
