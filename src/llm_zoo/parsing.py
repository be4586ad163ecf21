"""Extracting structured actions from model text.

Everything here takes arbitrary text (model output) and either returns the extracted value or
raises :class:`ParseError` whose message is written to be shown to the model in its next prompt.
Nothing is ever ``eval``'d or ``exec``'d: list literals go through :func:`ast.literal_eval`, which
only builds Python literals, after a size check. Every function takes time linear in the length
of the text (``str.find`` scanning; the few regexes are single character classes matched at one
position): a policy can write megabytes.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator

from llm_zoo import safe_ast

__all__ = [
    "ParseError",
    "extract_boxed",
    "extract_code_block",
    "extract_marked_list",
    "extract_moves",
    "iter_fenced_blocks",
]

#: Literal lists longer than this many characters are refused before parsing.
MAX_LIST_CHARS = 20_000

_FENCE = "```"
# Matched only at one position and within one line (a single character class each, nothing to
# backtrack into), so each match is linear in what it reads.
_TAG = re.compile(r"[ \t]*([A-Za-z0-9_+\-]*)")
_SPACES = re.compile(r"\s*")
_BOX_COMMANDS = ("\\boxed", "\\fbox")


class ParseError(ValueError):
    """The text does not contain what was asked for. The message explains what was expected."""


def iter_fenced_blocks(text: str) -> Iterator[tuple[str, str]]:
    """Yield ``(tag, body)`` for each complete fenced block in ``text``, left to right.

    A block opens with ```` ``` ```` followed, on the same line, by optional spaces or tabs, an
    optional tag (letters, digits, ``_+-``) and anything else up to the newline; its body runs to
    the next ```` ``` ```` (which may end a line of code). Blocks never overlap. This is what the
    regex ```` ```[ \\t]*([A-Za-z0-9_+\\-]*)[^\\n]*\\n(.*?)``` ```` (DOTALL) matches, found with
    ``str.find`` so that it takes linear time on any input: the regex took quadratic time on a
    long run of backticks without a newline.
    """
    position = 0
    while True:
        opener = text.find(_FENCE, position)
        if opener < 0:
            return
        newline = text.find("\n", opener + len(_FENCE))
        if newline < 0:
            return  # no later opener can have a newline either
        closer = text.find(_FENCE, newline + 1)
        if closer < 0:
            return  # every later opener's body starts at or after this one's: none is closed
        tag = _TAG.match(text, opener + len(_FENCE), newline).group(1)  # always matches
        yield tag, text[newline + 1 : closer]
        position = closer + len(_FENCE)


def extract_code_block(text: str, languages: Iterable[str] = ("python", "py", "python3")) -> str:
    """Return the last fenced code block (```` ```python ... ``` ````) in ``text``.

    Blocks tagged with one of ``languages`` win over untagged ones; blocks tagged with another
    language are ignored. Raises :class:`ParseError` if there is no complete block.
    """
    wanted = {lang.lower() for lang in languages}
    tagged, untagged = [], []
    for tag, body in iter_fenced_blocks(text):
        if tag.lower() in wanted:
            tagged.append(body)
        elif not tag:
            untagged.append(body)
    blocks = tagged or untagged
    if not blocks:
        if "```" in text:
            raise ParseError(
                "found a ``` fence but no complete code block: open with ```python on its own "
                "line and close with ``` on its own line"
            )
        raise ParseError("no code block found: put the whole program in one ```python ... ``` block")
    code = blocks[-1]
    if not code.strip():
        raise ParseError("the code block is empty")
    return code


def extract_marked_list(text: str, marker: str) -> list[object]:
    """Return the list literal that follows the *last* occurrence of ``marker``.

    Example: ``extract_marked_list('... #### ["U", "R"]', "####") == ["U", "R"]``.
    """
    position = text.rfind(marker)
    if position < 0:
        raise ParseError(f"no `{marker}` found: end your answer with {marker} [...]")
    rest = text[position + len(marker) :].lstrip()
    if not rest.startswith("["):
        raise ParseError(
            f'`{marker}` must be followed by a list in square brackets, e.g. {marker} ["U", "R"]'
        )
    depth = 0
    end = -1
    for index, char in enumerate(rest[: MAX_LIST_CHARS + 1]):
        if char == "[":
            depth += 1
        elif char == "]":
            depth -= 1
            if depth == 0:
                end = index
                break
    if end < 0:
        if len(rest) > MAX_LIST_CHARS:
            raise ParseError(f"the list after `{marker}` is longer than {MAX_LIST_CHARS} characters")
        raise ParseError(f"the list after `{marker}` is not closed with ]")
    literal = rest[: end + 1]
    try:
        value = safe_ast.literal_eval(literal)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError) as err:
        raise ParseError(
            f"the list after `{marker}` is not a valid list literal ({type(err).__name__}): "
            f'write it like ["U", "R", "D"]'
        ) from None
    if not isinstance(value, list):
        raise ParseError(f"`{marker}` must be followed by a list, got {type(value).__name__}")
    return value


_MOVE_WORDS = {"up": "U", "down": "D", "left": "L", "right": "R"}


def extract_moves(text: str, marker: str, *, max_moves: int = 1000) -> list[str]:
    """Return the moves (``"U"``, ``"D"``, ``"L"``, ``"R"``) in the list after ``marker``.

    Items are case-insensitive letters or the words up/down/left/right. Any other item is an error
    naming it, so a model learns the exact format.
    """
    items = extract_marked_list(text, marker)
    if len(items) > max_moves:
        raise ParseError(f"too many moves: {len(items)} > {max_moves}")
    moves = []
    for position, item in enumerate(items):
        token = item.strip() if isinstance(item, str) else None
        move = None
        if token is not None:
            move = token.upper() if token.upper() in {"U", "D", "L", "R"} else _MOVE_WORDS.get(token.lower())
        if move is None:
            shown = repr(item)
            shown = shown if len(shown) <= 40 else shown[:37] + "..."
            raise ParseError(f'move {position + 1} is {shown}; every move must be one of "U", "D", "L", "R"')
        moves.append(move)
    return moves


def _last_box_start(text: str) -> int:
    """Index just after the ``{`` of the last ``\\boxed{`` / ``\\fbox{`` (whitespace allowed before
    the brace), or -1. Scans backwards with ``str.rfind``: linear time."""
    best = -1
    for command in _BOX_COMMANDS:
        end = len(text)
        while True:
            found = text.rfind(command, 0, end)
            if found < 0 or found < best:
                break  # not found, or too early to beat the start already known
            index = _SPACES.match(text, found + len(command)).end()
            if index < len(text) and text[index] == "{":
                best = index + 1
                break
            end = found  # try the previous occurrence of this command
    return best


def extract_boxed(text: str) -> str:
    """Return the content of the last ``\\boxed{...}`` (or ``\\fbox{...}``), braces balanced."""
    start = _last_box_start(text)
    if start < 0:
        raise ParseError("no \\boxed{...} found: end your answer with \\boxed{your final answer}")
    depth = 1
    for index in range(start, len(text)):
        char = text[index]
        if char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
            if depth == 0:
                content = text[start:index].strip()
                if not content:
                    raise ParseError("the \\boxed{} is empty")
                return content
    raise ParseError("the last \\boxed{ is not closed with a matching }")
