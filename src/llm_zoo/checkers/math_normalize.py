"""Rewriting math answers into the forms ``math-verify`` compares well, before it sees them.

:class:`llm_zoo.checkers.math_check.AnswerChecker` passes every ``(gold, pred)`` pair through
:func:`normalize_pair`. Each rewrite fixes a measured miss of math-verify 0.9 and changes nothing
that math-verify already judged right:

* **Spelled-out pi.** ``4pi``, ``pi/2``, ``2 pi r`` and ``π`` become ``4\\pi``, ``\\pi/2``, ... :
  math-verify reads a bare ``pi`` as the product of two symbols ``p`` and ``i``, so it judged
  ``4\\pi`` and ``4pi`` different. Only a standalone ``pi`` is rewritten (not ``pie``, ``\\pi``,
  ``spin``).
* **Inequalities against an interval.** When one answer is an interval (``[2,5]``, ``(2, 5]``,
  ``(-\\infty, 1)``) and the other an inequality in one variable (``2 \\le x \\le 5``,
  ``x < 1``, ``5 \\geq x > 2``), the inequality is rewritten as that interval. math-verify
  accepted ``[2,5]`` for a gold ``2 \\le x \\le 5`` but not the other way round. Only done
  against an interval: on its own, ``(2,5)`` may be a point.

Everything here is plain string work in time linear in the answer (answers are at most
``max_answer_chars`` long anyway); nothing is evaluated.
"""

from __future__ import annotations

import re

__all__ = ["inequality_as_interval", "normalize_pair", "spell_pi"]

# A standalone "pi": not part of a longer word and not already the command \pi.
_BARE_PI = re.compile(r"(?<![\\A-Za-z])pi(?![A-Za-z])")
# Relation symbols, longest spelling first; a command must not run on into a longer one
# (``\le`` is also the start of ``\left``).
_RELATION = re.compile(r"\\(?:leqslant|geqslant|leq|geq|le|ge|lt|gt)(?![A-Za-z])|<=|>=|≤|≥|<|>")
_LESS = {"\\leqslant", "\\leq", "\\le", "\\lt", "<=", "≤", "<"}
_STRICT = {"\\lt", "\\gt", "<", ">"}
# One variable: a letter, or a Greek-letter command such as \theta.
_VARIABLE = re.compile(r"[A-Za-z]|\\[A-Za-z]+")
_INFINITY = "\\infty"


def spell_pi(answer: str) -> str:
    """``answer`` with every standalone ``pi`` (and ``π``) written ``\\pi``."""
    return _BARE_PI.sub(r"\\pi", answer.replace("π", "\\pi"))


def _strip_math(answer: str) -> str:
    return answer.strip().strip("$").strip()


def _is_interval(answer: str) -> bool:
    """``[a,b]``, ``(a,b)`` or a half-open mix, with exactly one comma at the top level."""
    text = _strip_math(answer).replace("\\left", "").replace("\\right", "")
    if len(text) < 5 or text[0] not in "[(" or text[-1] not in "])":
        return False
    depth, commas = 0, 0
    for char in text[1:-1]:
        if char in "([{":
            depth += 1
        elif char in ")]}":
            depth -= 1
            if depth < 0:
                return False
        elif char == "," and depth == 0:
            commas += 1
    return depth == 0 and commas == 1


def inequality_as_interval(answer: str) -> str | None:
    """The interval an inequality in one variable describes (``"2 \\le x < 5"`` -> ``"[2, 5)"``,
    ``"x > 1"`` -> ``"(1, \\infty)"``), or ``None`` if ``answer`` is not such an inequality."""
    text = _strip_math(answer)
    relations = list(_RELATION.finditer(text))
    if not 1 <= len(relations) <= 2:
        return None
    parts, symbols, start = [], [], 0
    for match in relations:
        parts.append(text[start : match.start()].strip())
        symbols.append(match.group())
        start = match.end()
    parts.append(text[start:].strip())
    if not all(parts):
        return None
    less = [symbol in _LESS for symbol in symbols]
    if len(parts) == 3:  # a REL x REL b
        if not _VARIABLE.fullmatch(parts[1]) or less[0] != less[1]:
            return None
        low, high = (parts[0], parts[2]) if less[0] else (parts[2], parts[0])
        low_open, high_open = (symbols[0], symbols[1]) if less[0] else (symbols[1], symbols[0])
        return _interval(low, high, low_open in _STRICT, high_open in _STRICT)
    left, right = parts
    if _VARIABLE.fullmatch(left) and not _VARIABLE.fullmatch(right):
        bound, variable_is_less = right, less[0]  # x < b  or  x > a
    elif _VARIABLE.fullmatch(right) and not _VARIABLE.fullmatch(left):
        bound, variable_is_less = left, not less[0]  # a < x  or  b > x
    else:
        return None
    strict = symbols[0] in _STRICT
    if variable_is_less:
        return _interval("-" + _INFINITY, bound, True, strict)
    return _interval(bound, _INFINITY, strict, True)


def _interval(low: str, high: str, low_open: bool, high_open: bool) -> str:
    return f"{'(' if low_open else '['}{low}, {high}{')' if high_open else ']'}"


def normalize_pair(gold: str, pred: str) -> tuple[str, str]:
    """``(gold, pred)`` rewritten as the module docstring describes (unchanged where no rule
    applies)."""
    gold, pred = spell_pi(gold), spell_pi(pred)
    if _is_interval(gold) and not _is_interval(pred):
        pred = inequality_as_interval(pred) or pred
    elif _is_interval(pred) and not _is_interval(gold):
        gold = inequality_as_interval(gold) or gold
    return gold, pred
