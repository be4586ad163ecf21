"""The strict rules :class:`llm_zoo.checkers.math_check.AnswerChecker` applies before math-verify.

math-verify is a lenient judge, made to grade human-written solutions. For a gold ``3744`` it
accepted ``3744\\%`` (a percent of an integer counts as the integer) and ``\\approx 3744+10^{-9}``
(after a leading relation it reads only the first number); for ``\\frac{1}{2}`` it accepted
``0.5000001`` (decimals are compared rounded to 6 places); and it evaluates whatever it is
given, so ``99999999!`` ran until the checker's hard timeout. An RL policy finds such holes.
The rules:

* **Markers of an inexact answer.** A predicted answer with a percent sign (``%``, ``\\%``,
  "percent") or an approximation marker (``\\approx``, ``\\sim``, ``\\simeq``, ``≈``, ``∼``, a
  leading ``~``, the words "about", "approximately", "approx", "around", "roughly", "nearly",
  "almost") is wrong unless the gold answer carries the same kind of marker
  (:func:`marker_refusal`). So is an answer that starts with a relation or an arrow (``= 5``,
  ``\\to 5``, ``\\equiv 5``) where the gold does not: math-verify then reads only the first number
  after it, so ``= 3744+10^{-9}`` was ``3744``.
* **Values too large to evaluate.** A predicted answer whose value would be huge or slow to
  compute is wrong without being evaluated: a factorial of more than 1000, a power of more than
  10,000 digits (``10^{99999999}``, the tower ``9^{9^{9^{9}}}``), nesting deeper than 50 brackets
  (:func:`size_refusal`). An upper bound on every sub-expression's magnitude is computed in
  linear time, treating every letter or unknown command as a number of magnitude 10, so
  symbolic answers such as ``(n-1)!`` or ``e^{x^2}`` pass.
* **Exact gold, exact answer.** When both answers are plain numbers (an integer, a decimal,
  ``a/b``, ``\\frac{a}{b}``: :func:`llm_zoo.checkers.math_check.exact_value`), only an answer of exactly
  the gold's value is right (:func:`plain_verdict`): math-verify rounds a decimal to 6 places, so
  it took ``0.5000001`` for ``\\frac{1}{2}`` and ``3744.0000001`` for ``3744.0``. One leniency,
  for a gold that no decimal of the answer's length can write (``1/3``, ``2/3``; not ``1/2`` or
  ``3744``): a decimal with at least 6 significant digits that is within one unit of its last
  digit of the gold is right (``0.333333``, and ``0.6666666666666666`` as Python prints
  ``2/3``); ``0.33`` is not. Any other answer for a plain-number gold goes to math-verify, which
  compares exact expressions exactly (``3744+10^{-9}`` is wrong, ``\\sqrt{3744^2}`` right)
  once the markers above are refused. Golds that are not plain numbers (``\\sqrt{2}``,
  ``\\frac{\\pi}{2}``) keep math-verify's comparison, which accepts a decimal agreeing to 6
  places.

Everything here is string work linear in the answer (answers are at most ``max_answer_chars``
long); nothing is evaluated beyond float arithmetic on magnitudes.
"""

from __future__ import annotations

import math
import re
from fractions import Fraction

__all__ = [
    "MAX_FACTORIAL",
    "MAX_NESTING",
    "MAX_RESULT_DIGITS",
    "MIN_DECIMAL_DIGITS",
    "marker_refusal",
    "plain_verdict",
    "size_refusal",
]

#: The largest factorial argument evaluated.
MAX_FACTORIAL = 1000
#: The most decimal digits a power (or any sub-expression) may have.
MAX_RESULT_DIGITS = 10_000
#: The deepest bracket nesting evaluated.
MAX_NESTING = 50
#: Significant digits a decimal needs to stand for a gold that no decimal of its length writes.
MIN_DECIMAL_DIGITS = 6

_PERCENT = re.compile(r"%|\bpercent\b|\bpct\b", re.IGNORECASE)
_APPROX = re.compile(
    r"\\(?:approx|thickapprox|simeq|sim|backsim|eqsim|cong)(?![A-Za-z])|[≈∼≃≅]|^\s*~"
    r"|\b(?:about|approximately|approx|around|roughly|nearly|almost|circa|ca\.)\b",
    re.IGNORECASE,
)


# A relation or arrow before any value: math-verify then reads only the first number after it
# (``\\boxed{= 3744+10^{-9}}`` was 3744).
_LEADING_RELATION = re.compile(
    r"^(?:=|:=|<|>|≤|≥|≈|→|\\(?:doteq|equiv|leq?|geq?|lt|gt|to|rightarrow|Rightarrow|longrightarrow"
    r"|implies|propto|approx|sim|simeq|cong|mapsto|ne|neq)(?![A-Za-z]))"
)


def _strip_math(answer: str) -> str:
    return answer.strip().strip("$").strip()


def marker_refusal(gold: str, pred: str) -> str | None:
    """Why ``pred`` is wrong for its percent or approximation marker, or ``None``."""
    markers = (
        ("a percent sign", _PERCENT),
        ("an approximation marker", _APPROX),
        ("a relation before the value", _LEADING_RELATION),
    )
    for name, pattern in markers:
        found = pattern.search(_strip_math(pred))
        if found and not pattern.search(_strip_math(gold)):
            return f"{name} ({found.group().strip()!r}): the answer must be the exact value"
    return None


def plain_verdict(gold: tuple[Fraction, bool], pred: tuple[Fraction, bool]) -> tuple[bool, str]:
    """The verdict on two plain numbers ``(value, is_decimal)`` (see the module docstring)."""
    gold_value, (pred_value, pred_decimal) = gold[0], pred
    if gold_value == pred_value:
        return True, "equal numbers"
    if not pred_decimal:
        return False, "different numbers"
    return _rounded_decimal(gold_value, pred_value, _decimals(pred_value))


def _decimals(value: Fraction) -> int:
    # A decimal's value has a denominator 2^a 5^b; its number of decimals is max(a, b).
    denominator, places = value.denominator, 0
    while denominator != 1:
        places += 1
        denominator //= math.gcd(denominator, 10)
    return places


def _rounded_decimal(gold: Fraction, pred: Fraction, places: int) -> tuple[bool, str]:
    unit = Fraction(1, 10**places)
    if (gold / unit).denominator == 1:
        return False, "different numbers (the gold is written exactly with these decimals)"
    digits = len(str(abs(pred.numerator * 10**places // pred.denominator)).lstrip("0"))
    if digits < MIN_DECIMAL_DIGITS:
        return False, f"a decimal with fewer than {MIN_DECIMAL_DIGITS} significant digits"
    if abs(pred - gold) < unit:
        return True, "a decimal within one unit of its last digit of the gold"
    return False, "different numbers"


# ---------------------------------------------------------------------------- magnitudes

_TOKEN = re.compile(r"\\[A-Za-z]+|\d+(?:\.\d*)?|\.\d+|\S")
_SYMBOL_LOG10 = 1.0  # a letter or an unknown command stands for a number of magnitude 10
_OPEN = {"{": "}", "(": ")", "[": "]"}
_SKIP = {"\\left", "\\right", "\\!", "\\,", "\\;", "\\big", "\\Big", "\\bigl", "\\bigr"}
_PRODUCT = {"\\cdot", "\\times", "*"}
_FRACTION = {"\\frac", "\\dfrac", "\\tfrac", "\\binom", "\\dbinom", "\\tbinom"}


class _Refused(Exception):
    pass


class _Magnitudes:
    """A recursive-descent reader of a LaTeX answer computing, for each sub-expression, an upper
    bound ``L`` on ``log10(max(|value|, 1))``. Separators it does not know (``,``, ``=``, ``<``)
    end a term; unknown tokens count as symbols."""

    def __init__(self, text: str):
        self.tokens = [t for t in _TOKEN.findall(text) if t not in _SKIP]
        self.at = 0
        self.depth = 0

    def peek(self) -> str | None:
        return self.tokens[self.at] if self.at < len(self.tokens) else None

    def whole(self) -> None:
        while self.peek() is not None:
            self.sum()
            if self.peek() is not None and self.peek() not in _OPEN.values():
                self.at += 1  # a separator
            elif self.peek() is not None:
                self.at += 1  # an unbalanced closing bracket

    def sum(self) -> float:
        bound = self.product()
        while self.peek() in ("+", "-"):
            self.at += 1
            bound = max(bound, self.product()) + math.log10(2)
        return bound

    def product(self) -> float:
        bound, first = 0.0, True
        while True:
            token = self.peek()
            if token in _PRODUCT or token == "/":
                self.at += 1
                continue
            if token is None or (token in ("+", "-") and not first) or not self.starts_factor(token):
                return bound
            bound += self.power()
            first = False
            self.check(bound)

    @staticmethod
    def starts_factor(token: str) -> bool:
        return token in _OPEN or token in ("+", "-") or token[0].isalnum() or token[0] in "\\."

    def power(self) -> float:
        base = self.postfix(self.atom())
        if self.peek() == "^":
            self.at += 1
            exponent = self.postfix(self.atom())
            base = max(base, math.log10(2)) * 10 ** min(exponent, 300.0)
            self.check(base)
        return base

    def postfix(self, bound: float) -> float:
        while self.peek() == "!":
            self.at += 1
            if bound > math.log10(MAX_FACTORIAL):
                raise _Refused(f"a factorial of a number above {MAX_FACTORIAL}")
            argument = 10**bound
            bound = argument * math.log10(max(argument, 2))
        return bound

    def atom(self) -> float:
        token = self.peek()
        if token is None:
            return 0.0
        self.at += 1
        if token in ("+", "-"):
            return self.atom()
        if token in _OPEN:
            return self.group(_OPEN[token])
        if token[0].isdigit() or token[0] == ".":
            whole_digits = len(token.split(".")[0])
            if whole_digits > 300:
                return float(whole_digits)
            try:
                return math.log10(max(float(token), 1.0))
            except ValueError:  # "." or "1.2.3": not a number; bounded by its digits
                return float(whole_digits)
        if token in _FRACTION:
            top = self.atom()
            self.atom()  # a denominator can only shrink a fraction; C(n, k) <= 2^n
            bound = top if token.endswith("frac") else 10 ** min(top, 300.0) * math.log10(2)
            self.check(bound)
            return bound
        return _SYMBOL_LOG10

    def group(self, closing: str) -> float:
        self.depth += 1
        if self.depth > MAX_NESTING:
            raise _Refused(f"brackets nested more than {MAX_NESTING} deep")
        bound = 0.0
        while self.peek() is not None and self.peek() != closing:
            bound = max(bound, self.sum())
            if self.peek() is not None and self.peek() != closing:
                self.at += 1  # a separator inside the group
        self.at += 1
        self.depth -= 1
        return bound

    @staticmethod
    def check(bound: float) -> None:
        if bound > MAX_RESULT_DIGITS:
            raise _Refused(f"a value of more than {MAX_RESULT_DIGITS:,} digits")


def size_refusal(pred: str) -> str | None:
    """Why ``pred`` is too large to evaluate (see the module docstring), or ``None``."""
    try:
        _Magnitudes(_strip_math(pred)).whole()
    except _Refused as refused:
        return f"{refused}: not evaluated; write the value itself"
    except RecursionError:  # thousands of signs in a row: "- - - - ... 1"
        return "an expression nested too deeply: not evaluated; write the value itself"
    return None
