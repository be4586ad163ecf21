"""Math-v0: the PettingZoo contract, rewards, termination, oracle play, pathological answers."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import llm_zoo
from llm_zoo.checkers.math_check import AnswerChecker
from llm_zoo.data import math_generator
from llm_zoo.data.math import word_problems
from llm_zoo.envs.math import FORMAT_PENALTY, MathEnv, answer_from_output, oracle_action
from llm_zoo.testing import check_env, play_episode

FIXTURES = Path(__file__).parent / "fixtures" / "math"


def boxed(answer: str) -> str:
    return f"Let me think.\n\nSo the answer is \\boxed{{{answer}}}."


def program(printed: str) -> str:
    return f"Here is my program.\n```python\nprint({printed!r})\n```"


def step_both(env: MathEnv, reasoner: str, tool: str) -> None:
    env.step(reasoner)
    env.step(tool)


@pytest.fixture
def env():
    made = llm_zoo.make("Math-v0", dataset="word", split="train", render_mode="ansi")
    yield made
    made.close()


def test_check_env_passes():
    check_env(
        "Math-v0",
        sample_actions=[
            boxed("12"),
            program("12"),
            "I am not sure.",
            "```python\nprint(1/0)\n```",
            boxed("\\frac{24}{2}"),
            "```python\nfrom fractions import Fraction\nprint(Fraction(7, 3))\n```",
        ],
    )


def test_check_env_passes_on_a_public_format_file():
    check_env(
        "Math-v0",
        env_kwargs={"dataset": str(FIXTURES / "gsm8k.jsonl")},
        sample_actions=[boxed("10"), program("10"), "no idea", program("9")],
        num_cycles=10,
        fuzz_count=40,
    )


# ---------------------------------------------------------------------------- oracle play


def _assert_oracle_episode(env: MathEnv, trace: list[tuple]) -> None:
    assert [step[0] for step in trace] == ["reasoner", "tool_agent"], "oracle answers should agree at once"
    for agent, _, _, reward, info in trace:
        paid_global = 1.0 if agent == "reasoner" else 0.0  # only the reasoner's answer moves c_r
        assert info["role_reward"] == 1.0 and info["global_reward"] == paid_global, (agent, info)
        assert reward == pytest.approx(1.0 + env.alpha * paid_global), (agent, info)
        assert info["format_ok"] and info["correct"]
    assert trace[-1][4]["agree"] and trace[-1][4]["success"]
    assert env.success and env.agents == []


@pytest.mark.parametrize("split", ["train", "test"])
def test_oracle_solves_every_word_problem(split):
    env = MathEnv(dataset="word", split=split)
    for problem in word_problems(split):
        trace = play_episode_with_options(env, {"problem_id": problem.id})
        assert env.problem.id == problem.id
        _assert_oracle_episode(env, trace)
    env.close()


def play_episode_with_options(env: MathEnv, options: dict) -> list[tuple]:
    env.reset(seed=0, options=options)
    trace = []
    for agent in env.agent_iter():
        _, _, termination, truncation, _ = env.last()
        if termination or truncation:
            env.step(None)
            continue
        env.step(oracle_action(env, agent))
        trace.append((agent, None, None, env.rewards[agent], dict(env.infos[agent])))
    return trace


def test_oracle_solves_generated_problems_of_every_level():
    env = MathEnv(dataset="generated", split="test", alpha=0.5)
    ids = [f"gen-L{level}-{seed}" for level in math_generator.LEVELS for seed in range(0, 100, 2)]
    env_train = MathEnv(dataset="generated", split="train", alpha=0.5)
    for problem_id in ids:
        _assert_oracle_episode(env, play_episode_with_options(env, {"problem_id": problem_id}))
    for seed in range(90):
        _assert_oracle_episode(
            env_train, play_episode(env_train, lambda a, p: oracle_action(env_train, a), seed=seed)
        )
    env.close()
    env_train.close()


def test_oracle_on_public_formats_including_latex_answers():
    for name in (
        "math_hendrycks.jsonl",
        "math500.jsonl",
        "gsm8k.jsonl",
        "aime_capitalised.jsonl",
        "aime_lowercase.json",
    ):
        env = MathEnv(dataset=str(FIXTURES / name))
        for problem_id in env.problem_set.ids():
            _assert_oracle_episode(env, play_episode_with_options(env, {"problem_id": problem_id}))
        env.close()


# ---------------------------------------------------------------------------- rewards


def test_wrong_answers_get_no_reward_and_run_to_max_turns(env):
    env.reset(seed=0, options={"problem_id": "word-001"})  # answer 26
    trace = play_episode_with_policy(env, {"reasoner": boxed("25"), "tool_agent": program("27")})
    assert len(trace) == 2 * env.max_turns
    assert all(step[3] == 0.0 and not step[4]["correct"] and not step[4]["agree"] for step in trace)
    assert not env.success and not trace[-1][4]["success"]


def test_agreeing_on_a_wrong_answer_terminates_without_success(env):
    env.reset(seed=0, options={"problem_id": "word-001"})
    trace = play_episode_with_policy(env, {"reasoner": boxed("25"), "tool_agent": program("25")})
    assert len(trace) == 2 and trace[-1][4]["agree"] and not env.success
    assert [step[3] for step in trace] == [0.0, 0.0]


def play_episode_with_policy(env: MathEnv, replies: dict) -> list[tuple]:
    trace = []
    for agent in env.agent_iter():
        _, _, termination, truncation, _ = env.last()
        if termination or truncation:
            env.step(None)
            continue
        env.step(replies[agent])
        trace.append((agent, None, None, env.rewards[agent], dict(env.infos[agent])))
    return trace


def test_reward_formulas_with_alpha():
    env = MathEnv(dataset="word", alpha=0.5)
    env.reset(seed=0, options={"problem_id": "word-007"})  # answer 5/36
    env.step(boxed("\\frac{5}{36}"))
    assert env.rewards["reasoner"] == pytest.approx(1.0 + 0.5 * 1.0)
    env.step(program("1/6"))
    info = env.infos["tool_agent"]
    # each reward is the change of a level: the tool agent's c_t stays 0, c_r does not move
    assert (info["role_reward"], info["global_reward"]) == (0.0, 0.0)
    assert env.rewards["tool_agent"] == 0.0
    assert not info["agree"] and not info["success"]
    # Turn 2: the reasoner is now wrong (c_r 1 -> 0: it pays back), the tool agent right.
    env.step(boxed("1/7"))
    info = env.infos["reasoner"]
    assert info["agree"] is False and (info["role_reward"], info["global_reward"]) == (-1.0, -1.0)
    assert env.rewards["reasoner"] == pytest.approx(-1.0 - 0.5 * 1.0)
    env.step(program("5/36"))
    info = env.infos["tool_agent"]
    assert (info["role_reward"], info["global_reward"]) == (1.0, 0.0)
    assert env.rewards["tool_agent"] == pytest.approx(1.0)
    env.close()


def test_reconciling_in_a_later_turn_terminates_with_success(env):
    env.reset(seed=0, options={"problem_id": "word-004"})  # answer 2
    step_both(env, boxed("3"), program("2"))
    prompt = env.observe("reasoner")["prompt"]
    assert "print('2')" in prompt and "answer: 2" in prompt and "Round 2 of 3" in prompt
    env.step(boxed("2"))
    info = env.infos["reasoner"]
    assert info["agree"] and info["success"] and info["role_reward"] == 1.0
    assert all(env.terminations.values())


def test_success_is_judged_on_the_final_answer(env):
    env.reset(seed=0, options={"problem_id": "word-004"})
    trace = play_episode_with_policy(env, {"reasoner": boxed("2"), "tool_agent": program("7")})
    assert len(trace) == 6 and env.success
    env.reset(seed=0, options={"problem_id": "word-004"})
    step_both(env, boxed("2"), program("7"))
    assert not env.infos["reasoner"]["success"]  # not decided before the last action
    step_both(env, boxed("2"), program("7"))
    step_both(env, boxed("5"), program("7"))
    assert not env.success and not env.infos["tool_agent"]["success"]


@pytest.mark.parametrize(
    ("reply", "status"),
    [
        ("I would compute it by hand: 26.", "no_code"),
        ("```python\nraise SystemExit(3)\n```", "error"),
        ("```python\nx = 1 / 0\n```", "error"),
        ("```python\nx = 26\n```", "no_output"),
        ("```python\nimport time\nprint(26, flush=True)\ntime.sleep(30)\n```", "timeout"),
    ],
)
def test_tool_agent_failures_get_the_format_penalty(reply, status):
    env = MathEnv(dataset="word", code_timeout_s=1.0)
    env.reset(seed=0, options={"problem_id": "word-001"})
    env.step(boxed("26"))
    env.step(reply)
    info = env.infos["tool_agent"]
    assert info["tool_status"] == status and info["role_reward"] == FORMAT_PENALTY
    assert info["format_ok"] is False and info["answer"] is None and not info["agree"]
    assert env.rewards["tool_agent"] == pytest.approx(FORMAT_PENALTY)  # c_r unchanged: no global
    prompt = env.observe("reasoner")["prompt"]
    assert "tool agent" in prompt and "/tmp/" not in prompt
    env.close()


def test_reasoner_without_boxed_gets_the_penalty_and_feedback(env):
    env.reset(seed=0)
    env.step("The answer is 26.")
    info = env.infos["reasoner"]
    assert info["role_reward"] == FORMAT_PENALTY and not info["format_ok"] and info["answer"] is None
    assert env.rewards["reasoner"] == FORMAT_PENALTY
    env.step(program("26"))
    assert env.observe("reasoner")["prompt"].startswith("Your previous reply could not be used: no \\boxed{")


def test_decimal_program_output_agrees_with_a_fraction():
    env = MathEnv(dataset=[{"question": "What is 1/3 as a number?", "answer": "\\frac{1}{3}"}])
    env.reset(seed=0)
    step_both(env, boxed("\\frac{1}{3}"), "```python\nprint(round(1/3, 6))\n```")
    info = env.infos["tool_agent"]
    assert info["answer"] == "0.333333" and info["correct"] and info["agree"] and env.success
    env.close()


def test_answer_from_output():
    assert answer_from_output("working...\n  42  \n\n") == "42"
    assert answer_from_output("x\n\\boxed{\\frac{1}{2}}\n") == "\\frac{1}{2}"
    assert answer_from_output("$3/4$") == "3/4"
    assert answer_from_output("\n \n") is None


# ---------------------------------------------------------------------------- robustness


def test_pathological_answers_return_in_time_and_the_env_keeps_working():
    checker = AnswerChecker(timeout_s=3.0)
    env = MathEnv(dataset="word", checker=checker)
    env.reset(seed=0, options={"problem_id": "word-001"})  # answer 26
    # Each step checks against the gold answer and, for the second agent, the agreement.
    budget = 2 * checker.timeout_s + 2
    for agent, reply in [
        ("reasoner", boxed("9^{9^{9^{9}}}")),
        ("tool_agent", program("26")),
        ("reasoner", boxed("1" * 60_000)),
        ("tool_agent", program("9^{9^{9^{9}}}")),
    ]:
        start = time.monotonic()
        env.step(reply)
        assert time.monotonic() - start < budget, agent
        info = env.infos[agent]
        if agent == "reasoner":
            assert info["role_reward"] == 0.0 and info["check"] in ("refused", "too_long"), info
            assert len(env.observe("tool_agent")["prompt"]) < 10_000  # a long answer is cut
    # over MAX_ACTION_CHARS, the step reads only the first 65,536 characters: here no closed \boxed{}
    env.reset(seed=0, options={"problem_id": "word-001"})
    env.step(boxed("1" * 1_000_000))
    info = env.infos["reasoner"]
    assert info["action_cut_from"] > 1_000_000 and info["role_reward"] == FORMAT_PENALTY
    env.step(program("9^{9^{9^{9}}}"))
    assert env.infos["tool_agent"]["role_reward"] == 0.0 and not env.infos["tool_agent"]["agree"]
    trace = play_episode(env, lambda agent, prompt: oracle_action(env, agent), seed=1)
    _assert_oracle_episode(env, trace)
    env.close()
    assert checker.worker_pids() == []


def test_close_leaves_no_worker_processes():
    script = textwrap.dedent(
        """
        import os, time
        import llm_zoo
        from llm_zoo.checkers.math_check import default_checker
        first = llm_zoo.make("Math-v0", dataset=[{"question": "q", "answer": "\\\\sqrt{2}"}])
        second = llm_zoo.make("Math-v0")
        first.reset(seed=0)
        twin = first.clone()
        twin.step("\\\\boxed{sqrt(2)}")
        pids = default_checker().worker_pids()
        assert pids, "the sqrt answer should have needed a worker"
        first.close(); twin.close()
        assert default_checker().worker_pids() == pids, "second still holds the checker"
        second.close()
        print(json.dumps({"pids": pids, "after": default_checker().worker_pids(), "alive": [
            p for p in pids if os.path.exists(f"/proc/{p}")]}))
        """
    ).replace("import os, time", "import json, os, time")
    output = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert output.returncode == 0, output.stderr
    report = json.loads(output.stdout)
    assert report["pids"] and report["after"] == [] and report["alive"] == []


def test_problem_selection_is_seeded_and_selectable():
    first, second = MathEnv(), MathEnv()
    ids = []
    for seed in range(5):
        first.reset(seed=seed)
        second.reset(seed=seed)
        assert first.problem == second.problem
        ids.append(first.task_id)
    assert len(set(ids)) > 1
    first.reset(options={"problem_id": "word-003"})
    assert first.problem.id == "word-003" and first.infos["reasoner"]["task_id"] == "word-003"
    with pytest.raises(KeyError, match="unknown problem id 'word-999'"):
        first.reset(options={"problem_id": "word-999"})
    first.close()
    second.close()


def test_make_arguments_select_problems():
    env = llm_zoo.make("Math-v0", dataset="generated", split="test", difficulty=2)
    for seed in range(10):
        env.reset(seed=seed)
        assert env.problem.source == "generated" and env.problem.difficulty == 2
        assert int(env.problem.id.rsplit("-", 1)[1]) < math_generator.TEST_SEEDS
    env.close()
    env = llm_zoo.make("Math-v0", dataset=str(FIXTURES / "math_hendrycks.jsonl"), difficulty=[1, 5])
    assert [p.difficulty for p in env.problem_set.fixed] == [1, 5]
    env.close()
    with pytest.raises(ValueError, match="unknown dataset 'gsm9k'"):
        llm_zoo.make("Math-v0", dataset="gsm9k")
    with pytest.raises(TypeError, match="valid arguments"):
        llm_zoo.make("Math-v0", datasett="word")
    with pytest.raises(ValueError, match="code_timeout_s"):
        MathEnv(code_timeout_s=0)


def test_clones_share_problems_and_checker_but_not_state(env):
    env.reset(seed=3)
    twin = env.clone()
    assert twin.problem_set is env.problem_set and twin.checker is env.checker
    twin.step(boxed("1"))
    assert env.reasoner_reply == "" and env.agent_selection == "reasoner"
    twin.close()


def test_render_shows_problem_history_and_status(env):
    env.reset(seed=0, options={"problem_id": "word-001"})
    env.step(boxed("26"))
    assert "gold answer: (shown when the episode is over)" in env.render()  # people play it too
    env.step(program("26"))
    text = env.render()
    assert "word-001" in text and "gold answer: 26" in text and "agreed" in text and "correct" in text


def test_percent_approximation_and_huge_answers_earn_nothing():
    # Issue 24 (red team): a percent or an approximation of the gold was paid as the gold, and a
    # huge factorial cost the checker's hard timeout on every step.
    checker = AnswerChecker(timeout_s=2.0)
    env = MathEnv(dataset=[{"question": "What is 48 * 78?", "answer": "3744"}], checker=checker)
    for reply in (boxed("3744\\%"), boxed("\\approx 3744+10^{-9}"), boxed("99999999!")):
        env.reset(seed=0)
        start = time.monotonic()
        env.step(reply)
        assert time.monotonic() - start < 0.5, reply
        info = env.infos["reasoner"]
        assert not info["correct"] and info["role_reward"] == 0.0 and info["check"] == "refused", info
        env.step(program("3744"))
        assert env.observe("reasoner")["prompt"].startswith("Your answer was not accepted: ")
    env.reset(seed=0)
    step_both(env, boxed("3744"), program("3744"))
    assert env.success
    env.close()
