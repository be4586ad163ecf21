"""Linear-time parsing: 1 MB adversarial actions of many shapes, to every role of every built-in env.

Each parser of model text once used a regex with overlapping quantifiers: a run of backticks
without a newline made the fenced-code regex quadratic (a 1 MB Plan-Path action kept a step busy for
over 12 minutes) and a long digit run made Code-v0's number regex worse still. Every step and the
observation that follows must now finish well within a second.
"""

from __future__ import annotations

import contextlib
import time

import pytest

import llm_zoo
from llm_zoo.envs.code import outputs_match, parse_tests
from llm_zoo.envs.grid_agents import parse_lenient_moves
from llm_zoo.envs.math import answer_from_output
from llm_zoo.parsing import (
    ParseError,
    extract_boxed,
    extract_code_block,
    extract_marked_list,
    extract_moves,
    iter_fenced_blocks,
)

MEGABYTE = 1_000_000
#: Seconds one step (plus the next observation) may take. Generous: the linear parsers need about
#: 0.1 s on 1 MB, on a loaded 2-core machine.
STEP_LIMIT_S = 1.0


def _fill(unit: str, prefix: str = "", suffix: str = "") -> str:
    """``prefix`` + ``unit`` repeated to about 1 MB + ``suffix``."""
    return prefix + unit * ((MEGABYTE - len(prefix) - len(suffix)) // len(unit)) + suffix


#: Shape name -> a 1 MB action. None of them holds a complete, non-empty code block, so no program
#: is run and the time measured is parsing and bookkeeping.
SHAPES = {
    "backtick_run": _fill("`"),
    "backtick_run_then_newline": _fill("`", suffix="\n"),
    "python_openers_no_newline": _fill("```python "),
    "python_opener_then_text": _fill("x", prefix="```python\n"),
    "json_opener_unterminated": _fill('{"input": "', prefix="```json\n["),
    "json_opener_deep_brackets": _fill("[", prefix="```json\n"),
    "boxed_openers": _fill("\\boxed{"),
    "boxed_deep_braces": _fill("{", prefix="\\boxed{"),
    "boxed_then_spaces": _fill("\\boxed" + " " * 60),
    "marker_and_brackets": _fill("#### ["),
    "marker_deep_brackets": _fill("[", prefix="#### "),
    "marker_unterminated_list": _fill('"U", ', prefix="#### ["),
    "move_words": _fill("up Left D R "),
    "spaces": _fill(" "),
    "newlines": _fill("\n"),
    "digits": _fill("1", suffix="x"),
    "mixed": _fill('``py\n\\boxed{ #### [ {"input": ` \n'),
    "empty_blocks": _fill("```python\n"),
}

BUILTIN_IDS = ("PlanPath-v0", "Sokoban-v0", "Code-v0", "Math-v0")
#: What the agents before the one under test answer: a short answer every env can parse or refuse.
BENIGN_ACTION = "I have no answer yet."


def _timed_step(env: llm_zoo.TextAECEnv, action: str) -> float:
    agent = env.agent_selection
    start = time.perf_counter()
    env.step(action)
    if env.agents:
        env.observe(env.agent_selection)
    env.observe(agent)  # the acting agent's next prompt quotes its feedback
    return time.perf_counter() - start


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_every_parser_is_fast_on_one_megabyte(shape):
    text = SHAPES[shape]
    calls = {
        "code_block": lambda: extract_code_block(text),
        "json_block": lambda: extract_code_block(text, languages=("json",)),
        "fenced_blocks": lambda: sum(1 for _ in iter_fenced_blocks(text)),
        "boxed": lambda: extract_boxed(text),
        "marked_list": lambda: extract_marked_list(text, "####"),
        "moves": lambda: extract_moves(text, "####"),
        "lenient_moves": lambda: parse_lenient_moves(text),
        "code_tests_json": lambda: parse_tests(text, 10),
        "math_tool_answer": lambda: answer_from_output(text),
        "code_judge_expected": lambda: outputs_match(text, "1"),
        "code_judge_actual": lambda: outputs_match("1", text),
    }
    for name, call in calls.items():
        start = time.perf_counter()
        with contextlib.suppress(ParseError):
            call()
        elapsed = time.perf_counter() - start
        assert elapsed < STEP_LIMIT_S, f"{name} on {shape}: {elapsed:.2f} s"


@pytest.mark.parametrize("env_id", BUILTIN_IDS)
def test_every_role_steps_a_megabyte_action_within_a_second(env_id):
    env = llm_zoo.make(env_id)
    slow = []
    try:
        for role_index, role in enumerate(env.possible_agents):
            for shape, action in SHAPES.items():
                env.reset(seed=0)
                for _ in range(role_index):
                    env.step(BENIGN_ACTION)
                assert env.agent_selection == role
                elapsed = _timed_step(env, action)
                if elapsed >= STEP_LIMIT_S:
                    slow.append(f"{role}/{shape}: {elapsed:.2f} s")
    finally:
        env.close()
    assert not slow, f"{env_id} steps over {STEP_LIMIT_S} s: {slow}"
