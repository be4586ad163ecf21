"""Math-v0 options for small models: agent orders, compact prompts and lenient answer readers.

Plain functions, used by :class:`llm_zoo.envs.math.MathEnv` and tested on their own. None of them
changes what a reward means: an answer is still checked against the gold answer, a program is still
run in the sandbox and its last printed line is its answer, and a reply from which no answer can be
read still earns the format penalty. They change only what the agents are told and how much
surrounding text is tolerated around an answer.

* :data:`AGENT_ORDERS` - the turn orders ``("reasoner", "tool_agent")`` (default),
  ``("tool_agent", "reasoner")`` (the reasoner sees the tool's result before it answers) and
  ``("reasoner",)`` (the reasoner alone, without a tool) and ``("tool_agent",)`` (the tool agent
  alone: its program's printed answer is scored, the single agent with the same tools).
* :func:`compact_tool_prompt` / :func:`compact_reasoner_prompt` - short prompts
  (``prompt_style="compact"``): the tool agent is asked, as in a coding exercise, for a short
  Python program that prints the answer to the problem written in plain text; the reasoner sees
  the tool's printed result and is asked for the answer as a number.
* :func:`read_reasoner_answer` - ``"strict"``: the last ``\\boxed{}``; ``"lenient"``: the last
  ``\\boxed{}`` if there is one, else the last number of the reply.
* :func:`read_tool_program` - ``"strict"``: the last fenced code block; ``"lenient"``: the fenced
  block if there is a complete one, else the code after a fence never closed (cut off by the token
  limit), else the reply's lines starting with ``print(``, ``import `` or ``from `` (a bare
  ``print(12 * 7)`` runs as written).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from llm_zoo.parsing import ParseError, extract_boxed, extract_code_block

__all__ = [
    "AGENT_ORDERS",
    "ANSWER_PARSERS",
    "CODE_PARSERS",
    "PROMPT_STYLES",
    "check_choice",
    "compact_reasoner_prompt",
    "compact_tool_prompt",
    "last_number",
    "plain_question",
    "read_reasoner_answer",
    "read_tool_program",
]

#: Allowed ``agents`` arguments (turn order within a turn).
AGENT_ORDERS: tuple[tuple[str, ...], ...] = (
    ("reasoner", "tool_agent"),
    ("tool_agent", "reasoner"),
    ("reasoner",),
    ("tool_agent",),
)
PROMPT_STYLES = ("full", "compact")
ANSWER_PARSERS = ("strict", "lenient")
CODE_PARSERS = ("strict", "lenient")

# A number as people write it: optional sign, digits with optional thousands commas, an optional
# decimal part or a /denominator (3/4). The lookbehind keeps "x2" or "3.5.1"-style tails out.
_NUMBER = re.compile(
    r"(?<![\w.])-?\d{1,3}(?:,\d{3})+(?:\.\d+)?(?![\w])|(?<![\w.])-?\d+(?:\.\d+|/\d+)?(?![\w])"
)
_OPEN_FENCE = re.compile(r"```(?:python3?|py)?[ \t]*\n")
_CODE_LINE = re.compile(r"^\s*(?:print\s*\(|import\s+\w|from\s+\w[\w.]*\s+import\s)")


def check_choice(name: str, value: object, choices: Sequence[object]) -> None:
    """Raise ``ValueError`` naming ``name``, the bad ``value`` and the valid ``choices``."""
    if isinstance(value, list):
        value = tuple(value)
    if value not in choices:
        shown = ", ".join(repr(list(c)) if isinstance(c, tuple) else repr(c) for c in choices)
        raise ValueError(f"{name} must be one of {shown}; got {value!r}")


def last_number(text: str) -> str | None:
    """The last number written in ``text`` (``"1,234"`` -> ``"1234"``, ``"3/4"``, ``"-2.5"``), or ``None``."""
    matches = _NUMBER.findall(text)
    return matches[-1].replace(",", "") if matches else None


def read_reasoner_answer(text: str, parser: str = "strict") -> str:
    """The reasoner's answer in ``text``; raises :class:`~llm_zoo.parsing.ParseError` when none.

    ``"strict"``: the last ``\\boxed{}``. ``"lenient"``: the last ``\\boxed{}`` when the reply has
    one (a malformed one is still an error), else the last number of the reply.
    """
    check_choice("answer_parser", parser, ANSWER_PARSERS)
    if parser == "strict" or re.search(r"\\(?:boxed|fbox)\s*\{", text):
        return extract_boxed(text)
    number = last_number(text)
    if number is None:
        raise ParseError(
            "no \\boxed{...} and no number found: end your reply with the answer, e.g. \\boxed{42}"
        )
    return number


def read_tool_program(text: str, parser: str = "strict") -> str:
    """The tool agent's program in ``text``; raises :class:`~llm_zoo.parsing.ParseError` when none.

    ``"strict"``: the last fenced code block. ``"lenient"``: that block if the reply has a complete
    one; else the code after an opening fence that was never closed (cut off by the token limit);
    else every line that starts with ``print(``, ``import `` or ``from ... import`` (in order).
    """
    check_choice("code_parser", parser, CODE_PARSERS)
    try:
        return extract_code_block(text)
    except ParseError:
        if parser == "strict":
            raise
    opened = _OPEN_FENCE.search(text)
    if opened is not None and text[opened.end() :].strip():
        return text[opened.end() :].strip("\n") + "\n"  # a block cut off by the token limit
    lines = [line.strip() for line in text.splitlines() if _CODE_LINE.match(line)]
    if not lines:
        raise ParseError("no code found: put the program in a ```python block, or write print(...)")
    return "\n".join(lines) + "\n"


def plain_question(question: str) -> str:
    """``question`` with its TeX math written as plain text (``$`` dropped, ``\\times`` -> ``*``,
    ``\\div`` -> ``/``), the way a small model writes it in Python."""
    text = question.replace("\\times", "*").replace("\\cdot", "*").replace("\\div", "/").replace("$", "")
    return re.sub(r"[ \t]+", " ", text).strip()


def compact_tool_prompt(
    question: str,
    *,
    reasoner_answer: str | None = None,
    previous_program: str | None = None,
    previous_result: str | None = None,
) -> str:
    """The tool agent's compact prompt: a request for a short Python program that prints the answer
    to the problem (in plain text, see :func:`plain_question`), phrased the way coding exercises are.

    ``reasoner_answer`` (the reasoner's latest answer, if it has given one) and the tool agent's own
    previous program and its result (a later round) are shown when given.
    """
    parts = []
    if reasoner_answer is not None:
        parts.append(f"Your teammate's answer: {reasoner_answer}")
    if previous_program is not None:
        parts.append(
            f"Your previous program:\n{previous_program.strip()}\nResult: {previous_result or '(none)'}"
        )
    parts.append(f"Write a short Python program that prints the answer to: {plain_question(question)}")
    return "\n".join(parts)


def compact_reasoner_prompt(question: str, *, tool_result: str | None = None, tool_ran: bool = False) -> str:
    """The reasoner's compact prompt: the problem, the tool's printed result when its program ran
    (``tool_result``; ``tool_ran`` without a result: the program printed nothing or failed), and a
    request for the answer."""
    parts = [f"Problem: {question}"]
    if tool_result is not None:
        parts.append(f"A Python program computed the answer and printed: {tool_result}")
    elif tool_ran:
        parts.append("Your teammate's Python program gave no result.")
    parts.append("What is the answer? Reply with the number only.")
    return "\n".join(parts)
