"""MathRelay-v0: the team solves, and neither role alone can beat chance (by what it observes)."""

from __future__ import annotations

import re
from collections import Counter

import pytest

import llm_zoo
from llm_zoo.checkers.math_check import AnswerChecker
from llm_zoo.data.math import UnknownProblemError
from llm_zoo.envs.math_relay import MathRelayEnv, oracle_action, relay_answer
from llm_zoo.testing import check_env

KEYS = [str(k) for k in range(1, 10)]


def program(printed: str) -> str:
    return f"```python\nprint({printed!r})\n```"


@pytest.fixture(scope="module")
def checker():
    made = AnswerChecker()
    yield made
    made.close()


def test_check_env_passes():
    check_env(
        "MathRelay-v0",
        sample_actions=[program("12"), "127", "\\boxed{127}", "I am not sure.", "```python\nprint(1/0)\n```"],
    )


@pytest.mark.parametrize("agents", [["tool_agent"], ["reasoner"]])
def test_check_env_passes_for_one_agent_alone(agents):
    check_env("MathRelay-v0", env_kwargs={"agents": agents, "key_digits": 2}, num_cycles=10, fuzz_count=40)


def test_relay_answer():
    assert relay_answer("42", "7") == "427"
    assert relay_answer(" -16 ", "07") == "-1607"
    assert relay_answer("0", "3") == "03"
    assert relay_answer("3/4", "7") is None and relay_answer("4.0", "7") is None


def reasoner_reading_its_prompt(prompt: str) -> str:
    """A reasoner that knows only its prompt: the printed number followed by its key (nothing
    when nothing was printed)."""
    printed = re.search(r"printed: (\S+)", prompt)
    key = re.search(r"Your key: (\d+)", prompt)
    assert key
    return f"{printed[1]}{key[1]}" if printed else ""


def test_a_team_that_uses_only_its_observations_solves_every_test_problem(checker):
    env = MathRelayEnv(split="test", checker=checker)
    ids = env.problem_set.distinct_ids()
    assert ids is not None and len(ids) == 98  # 100 level-1 test problems, 2 with a fraction answer
    for index, problem_id in enumerate(ids):
        env.reset(seed=index, options={"problem_id": problem_id})
        tool = oracle_action(env, "tool_agent")  # a program printing the problem's answer
        env.step(tool)
        assert env.infos["tool_agent"]["correct"] and env.rewards["tool_agent"] == 1.0
        env.step(reasoner_reading_its_prompt(env.observe("reasoner")["prompt"]))
        assert env.infos["reasoner"]["success"] and env.terminations["reasoner"]
        assert env.rewards["reasoner"] == 2.0  # role 1 + alpha * global 1
    env.close()


def test_the_tool_agent_sees_no_key_so_alone_it_cannot_beat_one_in_nine(checker):
    env = MathRelayEnv(split="test", agents=("tool_agent",), checker=checker)
    ids = env.problem_set.ids()
    assert ids is not None
    for problem_id in ids[:20]:
        prompts = set()
        for key in KEYS:
            env.reset(seed=0, options={"problem_id": problem_id, "key": key})
            prompts.add(env.observe("tool_agent")["prompt"])
        assert len(prompts) == 1  # the same observation whatever the key: its answer cannot depend on it
    # Its best policies: the problem's answer with a fixed digit after it. Each is right for one key in nine.
    for problem_id in ids[:2]:
        for guess in KEYS:
            solved = 0
            for key in KEYS:
                env.reset(seed=0, options={"problem_id": problem_id, "key": key})
                env.step(program(relay_answer(env.problem.answer, guess)))
                solved += bool(env.infos["tool_agent"]["success"])
            assert solved == 1
    # Printing the problem's answer itself (what Math-v0 pays) never solves.
    env.reset(seed=0, options={"problem_id": ids[0], "key": "7"})
    env.step(program(env.problem.answer))
    assert not env.infos["tool_agent"]["success"] and env.rewards["tool_agent"] == 0.0
    env.close()


def test_the_reasoner_sees_no_problem_so_alone_it_cannot_beat_the_commonest_answer(checker):
    env = MathRelayEnv(split="test", agents=("reasoner",), checker=checker)
    ids = env.problem_set.distinct_ids()
    assert ids is not None
    prompts = set()
    for index, problem_id in enumerate(ids):
        env.reset(seed=index, options={"problem_id": problem_id, "key": "7"})
        prompts.add(env.observe("reasoner")["prompt"])
    assert len(prompts) == 1 and "Your key: 7" in next(iter(prompts))
    # So its best policy is one answer per key: the commonest intermediate with the key, right on
    # 4 of the 98 test problems (about 4%).
    answers = Counter(env.problem_set.get(i).answer for i in ids)
    best, count = answers.most_common(1)[0]
    assert count == 4
    solved = 0
    for problem_id in ids:
        env.reset(seed=0, options={"problem_id": problem_id, "key": "7"})
        env.step(f"{best}7")
        solved += bool(env.infos["reasoner"]["success"])
    assert solved == count
    env.close()


def test_each_role_earns_most_when_the_team_solves(checker):
    env = MathRelayEnv(split="test", checker=checker, alpha=0.5)
    problem_id = env.problem_set.ids()[0]
    returns = {}
    for name, tool, reasoner in [
        ("solved", "intermediate", "relays"),
        ("tool prints the team answer", "team", "relays"),
        ("reasoner copies the printed number", "intermediate", "copies"),
        ("no program", "none", "relays"),
    ]:
        env.reset(seed=0, options={"problem_id": problem_id, "key": "3"})
        gold = env.problem.answer
        env.step({"intermediate": program(gold), "team": program(f"{gold}3"), "none": "no code"}[tool])
        tool_return = env.rewards[
            "tool_agent"
        ]  # then the reasoner's action pays it alpha x the team's change
        prompt = env.observe("reasoner")["prompt"]
        copied = re.search(r"printed: (\S+)", prompt)
        env.step(
            reasoner_reading_its_prompt(prompt) if reasoner == "relays" else (copied[1] if copied else "")
        )
        returns[name] = (tool_return + env.rewards["tool_agent"], env.rewards["reasoner"], env.success)
    assert returns["solved"] == (1.5, 1.5, True)  # the team's outcome reaches the tool agent too
    # The tool agent that guesses the team answer is wrong for its role, and the team fails.
    assert returns["tool prints the team answer"] == (0.0, 0.0, False)
    assert returns["reasoner copies the printed number"] == (1.0, 0.0, False)
    # Nothing to relay: the reasoner's reply has no number.
    assert returns["no program"] == (-0.5, -0.5, False)
    env.close()


def test_the_reasoner_sees_the_printed_result_and_its_key():
    env = llm_zoo.make("MathRelay-v0")
    env.reset(seed=0, options={"key": "5"})
    assert "has not run yet" in env.observe("reasoner")["prompt"]
    env.step(program("1" * 5000))
    prompt = env.observe("reasoner")["prompt"]
    assert "Your key: 5" in prompt and "characters cut" in prompt and len(prompt) < 1000
    assert "5" not in env.observe("tool_agent")["prompt"].split("answer to:")[0]
    env.close()


def test_bad_arguments_and_options_are_refused_with_a_message():
    with pytest.raises(ValueError, match="key_digits"):
        llm_zoo.make("MathRelay-v0", key_digits=0)
    with pytest.raises(TypeError, match=r"unknown argument.*prompt_style"):  # its prompts are its own
        llm_zoo.make("MathRelay-v0", prompt_style="full")
    env = llm_zoo.make("MathRelay-v0", key_digits=2)
    with pytest.raises(ValueError, match="2 digit"):
        env.reset(seed=0, options={"key": "7"})
    with pytest.raises(ValueError, match="the first not 0"):
        env.reset(seed=0, options={"key": "07"})
    with pytest.raises(UnknownProblemError, match="not an integer"):
        env.reset(seed=0, options={"problem_id": "gen-L1-5"})  # answer 91/2
    env.close()
    with pytest.raises(ValueError, match="integer answer"):
        MathRelayEnv(dataset=[{"question": "Half of 1?", "answer": "1/2"}], difficulty=None)


def test_keys_are_drawn_from_the_seed():
    env = llm_zoo.make("MathRelay-v0", key_digits=2)
    keys = []
    for seed in range(30):
        env.reset(seed=seed)
        keys.append(env.key)
    assert all(len(k) == 2 and k[0] != "0" for k in keys) and len(set(keys)) > 10
    env.reset(seed=3)
    assert env.key == keys[3]
    env.close()
