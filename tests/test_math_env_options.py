"""Math-v0 options for small models: agent orders, compact prompts, lenient readers; defaults unchanged."""

from __future__ import annotations

import pytest

import llm_zoo
from llm_zoo.envs.math import FORMAT_PENALTY, MathEnv
from llm_zoo.envs.math_options import (
    compact_reasoner_prompt,
    compact_tool_prompt,
    last_number,
    plain_question,
    read_reasoner_answer,
    read_tool_program,
)
from llm_zoo.parsing import ParseError
from llm_zoo.testing import check_env

SMALL_MODEL = {
    "agents": ("tool_agent", "reasoner"),
    "prompt_style": "compact",
    "answer_parser": "lenient",
    "code_parser": "lenient",
}
SOLO = {"agents": ("reasoner",), "prompt_style": "compact", "answer_parser": "lenient"}


def make(**options) -> MathEnv:
    return llm_zoo.make("Math-v0", dataset="generated", difficulty=1, max_turns=1, **options)


# ---------------------------------------------------------------- plain functions


@pytest.mark.parametrize(
    ("text", "number"),
    [
        ("The answer is 480.", "480"),
        ("It is 1,234 in total", "1234"),
        ("x = -2", "-2"),
        ("3/4 of them", "3/4"),
        ("about 2.5 now", "2.5"),
        ("first 3 then 7", "7"),
        ("no digits here", None),
        ("version x2", None),
    ],
)
def test_last_number(text, number):
    assert last_number(text) == number


def test_reasoner_answer_strict_needs_a_box():
    assert read_reasoner_answer("so \\boxed{12}") == "12"
    with pytest.raises(ParseError):
        read_reasoner_answer("The answer is 12.")


def test_reasoner_answer_lenient_prefers_the_box_then_the_last_number():
    assert read_reasoner_answer("7 apples, \\boxed{12}, then 9", "lenient") == "12"
    assert read_reasoner_answer("The answer is 12.", "lenient") == "12"
    with pytest.raises(ParseError, match="no number"):
        read_reasoner_answer("I do not know.", "lenient")
    with pytest.raises(ParseError):  # a broken box is not rescued by a number
        read_reasoner_answer("\\boxed{12 and 5", "lenient")


def test_tool_program_strict_needs_a_fenced_block():
    assert read_tool_program("```python\nprint(1)\n```") == "print(1)\n"
    with pytest.raises(ParseError):
        read_tool_program("print(1)")


def test_tool_program_lenient_reads_statement_lines():
    assert read_tool_program("Sure:\nprint(2 * 3)\nDone.", "lenient") == "print(2 * 3)\n"
    assert (
        read_tool_program("import math\nprint(math.gcd(4, 6))", "lenient")
        == "import math\nprint(math.gcd(4, 6))\n"
    )
    assert read_tool_program("```python\nx = 1\nprint(x)\n```\nprint(5)", "lenient") == "x = 1\nprint(x)\n"
    with pytest.raises(ParseError, match="no code"):
        read_tool_program("The answer is 6, printed by print.", "lenient")


def test_tool_program_lenient_runs_a_block_cut_off_by_the_token_limit():
    assert read_tool_program("Here:\n```python\nx = 4\nprint(x * 2)", "lenient") == "x = 4\nprint(x * 2)\n"
    with pytest.raises(ParseError):
        read_tool_program("Here:\n```python\nx = 4\nprint(x * 2)", "strict")


def test_plain_question():
    assert plain_question("Compute $ 44 + 8 \\times 2 - 32 $.") == "Compute 44 + 8 * 2 - 32 ."
    assert plain_question("What is 5% of 80?") == "What is 5% of 80?"


@pytest.mark.parametrize(
    ("function", "kwargs", "message"),
    [
        (read_reasoner_answer, {"parser": "loose"}, "answer_parser must be one of 'strict', 'lenient'"),
        (read_tool_program, {"parser": "loose"}, "code_parser must be one of 'strict', 'lenient'"),
    ],
)
def test_bad_parser_names(function, kwargs, message):
    with pytest.raises(ValueError, match=message):
        function("x", **kwargs)


def test_compact_prompts_show_what_each_agent_needs():
    tool = compact_tool_prompt("Compute $ 7 + 2 \\times 11 $.")
    assert tool == "Write a short Python program that prints the answer to: Compute 7 + 2 * 11 ."
    later = compact_tool_prompt("Q?", reasoner_answer="5", previous_program="print(4)\n", previous_result="4")
    assert "Your teammate's answer: 5" in later and "print(4)" in later and "Result: 4" in later
    assert "printed: 41" in compact_reasoner_prompt("Q?", tool_result="41")
    assert "gave no result" in compact_reasoner_prompt("Q?", tool_ran=True)
    alone = compact_reasoner_prompt("Q?")
    assert "printed" not in alone and "no result" not in alone
    for prompt in (tool, later, alone):  # prompts never say whether an answer is right
        assert "correct" not in prompt.lower()


# ---------------------------------------------------------------- the env with the options


@pytest.mark.parametrize("options", [SMALL_MODEL, SOLO], ids=["tool-first-compact-lenient", "solo"])
def test_check_env_over_the_variants(options):
    check_env(
        "Math-v0",
        env_kwargs={"dataset": "generated", "difficulty": 1, **options},
        sample_actions=["print(2 + 3)", "The answer is 5.", "no idea", "```python\nprint(7)\n```"],
        num_cycles=6,
        fuzz_count=20,
    )


def test_defaults_are_unchanged():
    env = llm_zoo.make("Math-v0")
    assert env.possible_agents == ["reasoner", "tool_agent"]
    assert (env.prompt_style, env.answer_parser, env.code_parser) == ("full", "strict", "strict")
    env.reset(seed=0)
    assert env.observe("reasoner")["prompt"].startswith("You are the reasoner in a team of two")
    env.step("The answer is 12.")  # a number without \boxed{}: a format error by default
    assert env.infos["reasoner"]["format_ok"] is False
    assert env.infos["reasoner"]["role_reward"] == FORMAT_PENALTY
    env.step("print(12)")  # a bare line without a fenced block: no code by default
    assert env.infos["tool_agent"]["tool_status"] == "no_code"
    env.close()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"agents": ("tool_agent", "tool_agent")}, "agents must be one of"),
        ({"agents": "reasoner"}, "agents must be one of"),
        ({"prompt_style": "tiny"}, "prompt_style must be one of 'full', 'compact'"),
        ({"answer_parser": "loose"}, "answer_parser must be one of"),
        ({"code_parser": "loose"}, "code_parser must be one of"),
    ],
)
def test_bad_options_raise_clear_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        make(**kwargs)


def test_tool_first_the_reasoner_sees_the_printed_result_and_rewards_keep_their_meaning():
    env = make(**SMALL_MODEL)
    env.reset(seed=3)
    gold = env.problem.answer
    assert env.agent_selection == "tool_agent"
    env.step(f"Sure.\nprint({gold!r})")
    tool = env.infos["tool_agent"]
    assert (tool["tool_status"], tool["correct"], tool["role_reward"]) == ("ok", True, 1.0)
    assert f"printed: {gold}" in env.observe("reasoner")["prompt"]
    env.step(f"The answer is {gold}.")
    reasoner = env.infos["reasoner"]
    assert (reasoner["correct"], reasoner["role_reward"], reasoner["global_reward"]) == (True, 1.0, 1.0)
    assert env.success and all(env.terminations.values())
    env.close()


def test_lenient_readers_still_penalise_replies_without_an_answer():
    env = make(**SMALL_MODEL)
    env.reset(seed=4)
    env.step("I would use Python for this.")
    assert env.infos["tool_agent"]["role_reward"] == FORMAT_PENALTY
    assert "gave no result" in env.observe("reasoner")["prompt"]
    env.step("I am not sure.")
    assert env.infos["reasoner"]["role_reward"] == FORMAT_PENALTY
    assert env.infos["reasoner"]["format_ok"] is False and not env.success
    env.close()


def test_a_wrong_number_is_wrong_under_the_lenient_reader():
    env = make(**SMALL_MODEL)
    env.reset(seed=5)
    wrong = str(int(env.problem.answer.split("/")[0]) + 1)
    env.step(f"print({wrong})")
    assert env.infos["tool_agent"]["role_reward"] == 0.0
    env.step(f"It is {wrong}.")
    assert env.infos["reasoner"]["role_reward"] == 0.0 and not env.success
    env.close()


def test_the_reasoner_alone_answers_once_per_turn():
    env = make(**SOLO)
    env.reset(seed=6)
    assert env.possible_agents == ["reasoner"]
    prompt = env.observe("reasoner")["prompt"]
    assert "printed" not in prompt and "teammate" not in prompt
    env.step(f"{env.problem.answer}")
    assert env.success and all(env.truncations.values())
    env.close()


TOOL_ALONE = {"agents": ("tool_agent",), "prompt_style": "compact", "code_parser": "lenient"}


def test_the_tool_agent_alone_is_scored_by_its_program_printed_answer():
    env = make(**TOOL_ALONE)
    env.reset(seed=6)
    assert env.possible_agents == ["tool_agent"]
    team = make(**SMALL_MODEL)
    team.reset(seed=6)
    # the same prompt as the team's tool agent on its first turn: only the teammate is missing
    assert env.observe("tool_agent")["prompt"] == team.observe("tool_agent")["prompt"]
    env.step(f"print({env.problem.answer!r})")
    info = env.infos["tool_agent"]
    assert (info["correct"], info["role_reward"], info["global_reward"]) == (True, 1.0, 1.0)
    assert env.success and all(env.truncations.values())
    env.reset(seed=6)
    env.step("print(-123456789)")
    assert env.infos["tool_agent"]["global_reward"] == 0.0 and not env.success
    env.close()
    team.close()


def test_the_tool_agent_alone_with_full_prompts_is_not_told_of_a_teammate():
    env = llm_zoo.make("Math-v0", dataset="generated", difficulty=1, max_turns=2, agents=("tool_agent",))
    env.reset(seed=1)
    assert "teammate" not in env.observe("tool_agent")["prompt"]
    env.step("no code")
    assert env.infos["tool_agent"]["role_reward"] == FORMAT_PENALTY and not env.success
    env.step(f"```python\nprint({env.problem.answer!r})\n```")
    assert env.success and all(env.truncations.values())
    env.close()


@pytest.mark.slow
def test_learning_benchmark_quick_run(tmp_path, monkeypatch):
    """``benchmarks/learning_math.py --quick`` trains the team variants and the tool agent alone with
    two seeds on distinct problems, evaluates the role swap, and compares them paired."""
    import importlib
    import json
    import sys
    from pathlib import Path

    pytest.importorskip("llm_zoo_train.trainer", reason="the trainer is not installed")
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parent.parent / "benchmarks"))
    monkeypatch.delitem(sys.modules, "learning_math", raising=False)
    benchmark = importlib.import_module("learning_math")
    argv = ["--quick", "--output-dir", str(tmp_path), "--variants", "per_agent,tool_alone", "--seeds", "0,1"]
    benchmark.main(argv)
    result = json.loads((tmp_path / "learning_math.json").read_text())
    assert (tmp_path / "learning_math.png").stat().st_size > 0
    # tool_alone brings its majority@K row: the single agent at the team's sample count.
    assert set(result["variants"]) == {"per_agent", "tool_alone", "tool_alone_majority", "role_swap"}
    assert [run["seed"] for run in result["variants"]["per_agent"]] == [0, 1]
    assert [run["seed"] for run in result["variants"]["tool_alone_majority"]] == [0, 1]
    swap = result["variants"]["role_swap"][0]
    assert swap["agent_adapters"] == {"tool_agent": "reasoner", "reasoner": "tool_agent"}
    team_before = result["befores"]["team"]
    assert team_before["num_episodes"] == team_before["distinct_problems"] == 4  # drawn without replacement
    assert set(result["befores"]) == {"team", "tool_alone"}
    paired = result["summary"]["comparisons"]["per_agent vs tool_alone"]
    assert paired["pairs"] == 8 and 0 <= paired["p_value"] <= 1
    assert set(result["summary"]["verdict"]) >= {"met"} and result["partial"] is False
