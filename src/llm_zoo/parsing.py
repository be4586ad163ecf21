"""Extracting structured actions from model text.

Everything here takes arbitrary text (model output) and either returns the extracted value or
raises :class:`ParseError` whose message is written to be shown to the model in its next prompt.
Nothing is ever ``eval``'d or ``exec``'d: list literals go through :func:`ast.literal_eval`, which
only builds Python literals, after a size check.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable

__all__ = [
    "ParseError",
    "extract_boxed",
    "extract_code_block",
    "extract_marked_list",
    "extract_moves",
]

#: Literal lists longer than this many characters are refused before parsing.
MAX_LIST_CHARS = 20_000

_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+\-]*)[^\n]*\n(.*?)```", re.DOTALL)


class ParseError(ValueError):
    """The text does not contain what was asked for. The message explains what was expected."""


def extract_code_block(text: str, languages: Iterable[str] = ("python", "py", "python3")) -> str:
    """Return the last fenced code block (```` ```python ... ``` ````) in ``text``.

    Blocks tagged with one of ``languages`` win over untagged ones; blocks tagged with another
    language are ignored. Raises :class:`ParseError` if there is no complete block.
    """
    wanted = {lang.lower() for lang in languages}
    tagged, untagged = [], []
    for match in _FENCE.finditer(text):
        tag = match.group(1).lower()
        if tag in wanted:
            tagged.append(match.group(2))
        elif not tag:
            untagged.append(match.group(2))
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
        value = ast.literal_eval(literal)
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


def extract_boxed(text: str) -> str:
    """Return the content of the last ``\\boxed{...}`` (or ``\\fbox{...}``), braces balanced."""
    starts = [m.end() for m in re.finditer(r"\\(?:boxed|fbox)\s*\{", text)]
    if not starts:
        raise ParseError("no \\boxed{...} found: end your answer with \\boxed{your final answer}")
    start = starts[-1]
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
