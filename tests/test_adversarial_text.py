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
from llm_zoo.envs.math_options import last_number, read_reasoner_answer, read_tool_program
from llm_zoo.parsing import (
    ParseError,
    extract_boxed,
    extract_code_block,
    extract_marked_list,
    extract_moves,
    iter_fenced_blocks,
)

MEGABYTE = 1_000_000
#: CPU seconds one step (plus the next observation) may take. Generous: the slowest linear parser
#: needs about 0.2 s on 1 MB; the quadratic ones took minutes. CPU time of this process, not wall
#: time, so that a busy machine does not fail the test (no shape runs a program: nothing happens
#: in other processes).
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
    "signed_digit_run": _fill("1", prefix="-", suffix="_"),
    "thousands_groups": _fill(",111", prefix="1", suffix="x"),
    "import_prefix": _fill("a", prefix="from "),
}

#: Every built-in env, and the options that switch on other parsers of model text (those parsers
#: are also timed on their own in the fast test; the whole envs with them in the slow suite).
BUILTIN_CONFIGS = {
    "PlanPath-v0": {},
    "Sokoban-v0": {},
    "Code-v0": {},
    "Math-v0": {},
    "PlanPath-v0 lenient": {"move_parser": "lenient"},
    "Math-v0 lenient": {"answer_parser": "lenient", "code_parser": "lenient"},
}
#: What the agents before the one under test answer: a short answer every env can parse or refuse.
BENIGN_ACTION = "I have no answer yet."


def _cpu_seconds(call) -> float:
    """CPU seconds this process spent in ``call()`` (a ``ParseError`` is an answer, not a failure)."""
    start = time.process_time()
    with contextlib.suppress(ParseError):
        call()
    return time.process_time() - start


def _step_and_observe(env: llm_zoo.TextAECEnv, action: str) -> None:
    agent = env.agent_selection
    env.step(action)
    if env.agents:
        env.observe(env.agent_selection)
    env.observe(agent)  # the acting agent's next prompt quotes its feedback


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
        "math_last_number": lambda: last_number(text),
        "math_lenient_answer": lambda: read_reasoner_answer(text, "lenient"),
        "math_lenient_program": lambda: read_tool_program(text, "lenient"),
    }
    for name, call in calls.items():
        elapsed = _cpu_seconds(call)
        assert elapsed < STEP_LIMIT_S, f"{name} on {shape}: {elapsed:.2f} CPU s"


@pytest.mark.parametrize(
    "config", [pytest.param(c, marks=[pytest.mark.slow] if " " in c else []) for c in BUILTIN_CONFIGS]
)
def test_every_role_steps_a_megabyte_action_within_a_second(config):
    env = llm_zoo.make(config.split()[0], **BUILTIN_CONFIGS[config])
    slow = []
    try:
        for role_index, role in enumerate(env.possible_agents):
            for shape, action in SHAPES.items():
                env.reset(seed=0)
                for _ in range(role_index):
                    env.step(BENIGN_ACTION)
                assert env.agent_selection == role
                elapsed = _cpu_seconds(lambda action=action: _step_and_observe(env, action))
                if elapsed >= STEP_LIMIT_S:
                    slow.append(f"{role}/{shape}: {elapsed:.2f} CPU s")
    finally:
        env.close()
    assert not slow, f"{config} steps over {STEP_LIMIT_S} s: {slow}"
