"""The text of the tool agent / plan agent answers (:mod:`llm_zoo.envs.grid_agents`).

What both grid puzzles write and read: the markers the agents end their moves with, move lists
written as the agents are asked to write them, the plan agent's moves read from its answer
(strictly from its ``#### [...]`` list, or leniently from its move words), the record of a tool
agent's answer (:class:`ToolRun`) and the plan agent's view of it, and the oracle's perfect answers.

It is apart from :mod:`llm_zoo.envs.grid_agents` because none of it needs the env, the sandbox or
the rewards: it is pure text in and out, shared by the env's prompts, its answer parsing and the
puzzles' oracles.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from llm_zoo.parsing import ParseError, extract_moves

__all__ = [
    "ACTIONS_LIST_MARKER",
    "FINAL_MOVES_MARKER",
    "MAX_MOVES",
    "ToolRun",
    "count",
    "describe_tool_run",
    "format_moves",
    "oracle_answer",
    "parse_lenient_moves",
    "parse_plan_moves",
    "shorten",
]

#: The line the tool agent's program must print.
ACTIONS_LIST_MARKER = "**Actions List**:"
#: The marker that precedes the plan agent's final moves.
FINAL_MOVES_MARKER = "####"
#: Longest move list accepted from either agent.
MAX_MOVES = 1000

# A move word, or a capital move letter standing alone ("U" but not the "U" of "Up" or "USA").
_MOVE_TOKEN = re.compile(r"(?i:\b(up|down|left|right)\b)|\b([UDLR])\b")
_MOVE_WORDS = {"up": "U", "down": "D", "left": "L", "right": "R"}

# How much of the tool agent's program and output the plan agent is shown.
_MAX_CODE_SHOWN = 6000
_MAX_STDOUT_SHOWN = 2000
_MAX_STDERR_SHOWN = 1000


def oracle_answer(agent: str, moves: Sequence[str]) -> str:
    """A perfect answer playing ``moves``: for the tool agent a program that prints them, for the
    plan agent the final line. Used by the puzzles' ``oracle_action`` (tests, ``check_env``)."""
    listed = json.dumps(list(moves))
    if agent == "tool_agent":
        return f"```python\nprint('{ACTIONS_LIST_MARKER} ' + {listed!r})\n```\n"
    return f"These moves solve the board.\n\n{FINAL_MOVES_MARKER} {listed}"


def shorten(text: str, limit: int) -> str:
    """``text`` if it has at most ``limit`` characters, else its head and tail around a marker."""
    if len(text) <= limit:
        return text
    marker = f"\n[... {len(text) - limit} characters cut ...]\n"
    head = (limit * 2) // 3
    return text[:head] + marker + text[len(text) - (limit - head) :]


def count(number: int, noun: str, plural: str = "") -> str:
    """``"1 move"``, ``"3 moves"`` (``plural`` defaults to ``noun + "s"``)."""
    return f"{number} {noun if number == 1 else plural or noun + 's'}"


def format_moves(moves: Sequence[str]) -> str:
    """Moves written the way the agents are asked to write them: ``["U", "R"]``."""
    return json.dumps(list(moves))


@dataclass(frozen=True)
class ToolRun:
    """What came of one tool-agent answer.

    Attributes:
        code: The program found in the answer ("" when there was none).
        ran: Whether the program was run in the sandbox.
        stdout: Its standard output (as returned by the sandbox, already capped).
        stderr: Its standard error.
        moves: The moves read from its ``**Actions List**`` line; ``None`` when the answer
            cannot be used.
        error: Why the answer cannot be used ("" when ``moves`` is set). Written for the model.
    """

    code: str = ""
    ran: bool = False
    stdout: str = ""
    stderr: str = ""
    moves: tuple[str, ...] | None = None
    error: str = ""

    def __deepcopy__(self, memo: dict[int, Any]) -> ToolRun:
        return self  # immutable


def parse_plan_moves(text: str, *, lenient: bool = False) -> list[str]:
    """The moves after the last ``####`` in the plan agent's answer; raises ``ParseError``.

    With ``lenient``, an answer without a valid ``#### [...]`` list is read by
    :func:`parse_lenient_moves` instead (the strict error is raised if that finds no move either).
    """
    try:
        return extract_moves(text, FINAL_MOVES_MARKER, max_moves=MAX_MOVES)
    except ParseError:
        if not lenient:
            raise
        moves = parse_lenient_moves(text)
        if not moves:
            raise
        return moves


def parse_lenient_moves(text: str) -> list[str]:
    """Every move word (up/down/left/right, any case) and standalone capital U/D/L/R, in order,
    after the last ``####`` (or in all of ``text`` without one). At most :data:`MAX_MOVES` are read."""
    position = text.rfind(FINAL_MOVES_MARKER)
    tail = text if position < 0 else text[position + len(FINAL_MOVES_MARKER) :]
    moves = []
    for match in _MOVE_TOKEN.finditer(tail):
        word, letter = match.groups()
        moves.append(_MOVE_WORDS[word.lower()] if word else letter)
        if len(moves) == MAX_MOVES:
            break
    return moves


def describe_tool_run(run: ToolRun | None, *, compact: bool = False) -> str:
    """The plan agent's view of the tool agent's latest answer: program, output, moves or error.

    ``compact`` leaves out the program, its output and its error: only the moves, or ``""`` when
    there are none (the compact plan prompt then has no tool section, as when the plan agent plays
    alone). Measured for #49 on SmolLM2-135M, 3 x 3 boards, greedy: with the error (written to the
    tool agent: "open with ```python on its own line ...") the plan agent's answers were code
    fences or the error echoed, and AT-GRPO trained it into fences only (0/48 parsed); with a fixed
    line "The tool agent found no moves" it echoed the board and that line (0/48 solved after training).
    """
    if run is None:
        return "The tool agent has not answered yet."
    if compact:
        if run.moves is None:
            return ""
        return f"The tool agent's program suggests these moves: {format_moves(run.moves)}"
    if not run.code:
        return f"The tool agent's answer contained no usable program: {run.error}."
    parts = ["The tool agent's program:", f"```python\n{shorten(run.code.rstrip(), _MAX_CODE_SHOWN)}\n```"]
    stdout = run.stdout.rstrip()
    parts.append(
        f"Its output:\n```text\n{shorten(stdout, _MAX_STDOUT_SHOWN)}\n```"
        if stdout
        else "It printed nothing."
    )
    if run.stderr.strip() and run.moves is None:
        parts.append(f"Its error output:\n```text\n{run.stderr.strip()[-_MAX_STDERR_SHOWN:]}\n```")
    if run.moves is None:
        parts.append(f"No moves could be read from it: {run.error}.")
    else:
        parts.append(f"Moves read from its output ({len(run.moves)}): {format_moves(run.moves)}")
    return "\n".join(parts)
