"""A seeded generator of math problems with exact answers (arithmetic, algebra, number theory,
counting), written for llm-zoo.

``generate_problem(level, seed)`` is a pure function: the same ``(level, seed)`` gives the same
problem on every machine and Python version (the only randomness is ``random.Random(seed)
.random()``, whose sequence Python guarantees; no ``randint``/``choice``, whose algorithms may
change). Answers are computed with exact integer / :class:`~fractions.Fraction` arithmetic and
written as an integer (``"42"``, ``"-7"``) or a reduced fraction (``"-3/4"``). Each problem's
``params`` hold the numbers it was built from, so tests can re-solve it independently.

Levels (``difficulty``):

1. one step: order of operations, gcd, lcm, remainders, digit sums, ``ax + b = c``, percentages;
2. two or three steps: fraction arithmetic, ``ax + b = cx + d``, 2x2 linear systems, divisor counts,
   modular powers, binomial coefficients, arithmetic series;
3. several steps: quadratics with integer roots, nested fraction expressions, 3x3 linear systems,
   Euler's totient, inclusion-exclusion counts, linear congruences, multiset permutations, sums of
   divisors.

Splits: test problems use seeds ``0 .. TEST_SEEDS - 1`` (a fixed set of ``TEST_SEEDS`` per level);
training problems use seeds from ``TRAIN_SEED_START`` up, and :func:`sample_seed` skips any training
seed whose problem has the same *content* as a test problem (:func:`content_key`: the kind and its
numbers, with the operands of commutative operations sorted, so "lcm of 30 and 18" in training
cannot repeat "lcm of 18 and 30" of the test split), so the two splits share no problem. Before
content keys, only equal question texts were skipped.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from fractions import Fraction
from functools import lru_cache
from typing import Any

__all__ = [
    "KINDS",
    "LEVELS",
    "TEST_SEEDS",
    "TRAIN_SEED_START",
    "content_key",
    "format_number",
    "generate",
    "sample_seed",
    "test_keys",
    "test_questions",
]

LEVELS = (1, 2, 3)
#: Number of test problems per level (seeds ``0 .. TEST_SEEDS - 1``).
TEST_SEEDS = 100
#: Training seeds are ``TRAIN_SEED_START <= seed < 2**31``.
TRAIN_SEED_START = 1_000_000
_SEED_END = 2**31


class _Draw:
    """Random choices built only on ``random.Random.random()`` (reproducible across versions)."""

    def __init__(self, seed: int):
        self._random = random.Random(seed)

    def between(self, low: int, high: int) -> int:
        """Uniform integer in ``[low, high]``."""
        return low + min(int(self._random.random() * (high - low + 1)), high - low)

    def nonzero(self, low: int, high: int) -> int:
        value = 0
        while value == 0:
            value = self.between(low, high)
        return value

    def choice(self, items: Sequence[Any]) -> Any:
        return items[self.between(0, len(items) - 1)]


def format_number(value: Fraction | int) -> str:
    """``7`` -> ``"7"``, ``Fraction(-3, 4)`` -> ``"-3/4"``."""
    value = Fraction(value)
    return str(value.numerator) if value.denominator == 1 else f"{value.numerator}/{value.denominator}"


def _frac_tex(value: Fraction) -> str:
    sign = "-" if value < 0 else ""
    if value.denominator == 1:
        return str(value.numerator)
    return f"{sign}\\frac{{{abs(value.numerator)}}}{{{value.denominator}}}"


def _signed(coefficient: int, variable: str, first: bool = False) -> str:
    """A term of a linear expression: ``3x``, ``- x``, ``+ 2y``."""
    magnitude = "" if abs(coefficient) == 1 and variable else str(abs(coefficient))
    if first:
        return f"{'-' if coefficient < 0 else ''}{magnitude}{variable}"
    return f" {'-' if coefficient < 0 else '+'} {magnitude}{variable}"


def _linear(coefficients: Sequence[int], variables: str) -> str:
    terms = [(c, v) for c, v in zip(coefficients, variables, strict=True) if c != 0]
    return "".join(_signed(c, v, first=i == 0) for i, (c, v) in enumerate(terms))


# ---------------------------------------------------------------------------- level 1


def _order_of_operations(d: _Draw) -> tuple[str, Fraction, dict[str, Any]]:
    a, b, c, e = d.between(2, 60), d.between(2, 15), d.between(2, 15), d.between(1, 40)
    return (
        f"Compute $ {a} + {b} \\times {c} - {e} $.",
        Fraction(a + b * c - e),
        {"a": a, "b": b, "c": c, "e": e},
    )


def _gcd(d: _Draw) -> tuple[str, Fraction, dict[str, Any]]:
    g, x, y = d.between(2, 30), d.between(2, 20), d.between(2, 20)
    a, b = g * x, g * y
    return f"What is the greatest common divisor of {a} and {b}?", Fraction(math.gcd(a, b)), {"a": a, "b": b}


def _lcm(d: _Draw) -> tuple[str, Fraction, dict[str, Any]]:
    a, b = d.between(4, 40), d.between(4, 40)
    return (
        f"What is the least common multiple of {a} and {b}?",
        Fraction(a * b // math.gcd(a, b)),
        {"a": a, "b": b},
    )


def _remainder(d: _Draw) -> tuple[str, Fraction, dict[str, Any]]:
    n, m = d.between(100, 9999), d.between(3, 19)
    return f"What is the remainder when {n} is divided by {m}?", Fraction(n % m), {"n": n, "m": m}


def _digit_sum(d: _Draw) -> tuple[str, Fraction, dict[str, Any]]:
    n = d.between(1000, 999_999)
    return f"What is the sum of the digits of {n}?", Fraction(sum(int(ch) for ch in str(n))), {"n": n}


def _linear_one_side(d: _Draw) -> tuple[str, Fraction, dict[str, Any]]:
    x, a, b = d.between(-20, 20), d.nonzero(-9, 9), d.between(-30, 30)
    c = a * x + b
    left = _linear([a], "x") + (_signed(b, "") if b else "")
    return f"Solve for $x$: $ {left} = {c} $.", Fraction(x), {"a": a, "b": b, "c": c}


def _percent(d: _Draw) -> tuple[str, Fraction, dict[str, Any]]:
    p, n = d.choice([5, 10, 12, 15, 20, 25, 30, 35, 40, 45, 60, 75, 80, 120, 150]), d.between(2, 60) * 10
    return f"What is {p}% of {n}?", Fraction(p * n, 100), {"p": p, "n": n}


# ---------------------------------------------------------------------------- level 2


def _fraction_sum(d: _Draw) -> tuple[str, Fraction, dict[str, Any]]:
    fractions = [Fraction(d.between(1, 12), d.between(2, 12)) for _ in range(3)]
    signs = [1, d.choice([1, -1]), d.choice([1, -1])]
    value = sum((s * f for s, f in zip(signs, fractions, strict=True)), Fraction(0))
    text = _frac_tex(fractions[0]) + "".join(
        f" {'+' if s > 0 else '-'} {_frac_tex(f)}" for s, f in zip(signs[1:], fractions[1:], strict=True)
    )
    params = {"terms": [format_number(s * f) for s, f in zip(signs, fractions, strict=True)]}
    return f"Compute $ {text} $. Give your answer as a fraction in lowest terms.", value, params


def _linear_both_sides(d: _Draw) -> tuple[str, Fraction, dict[str, Any]]:
    a, c = d.nonzero(-9, 9), d.nonzero(-9, 9)
    while c == a:
        c = d.nonzero(-9, 9)
    b, e = d.between(-25, 25), d.between(-25, 25)
    left = _linear([a], "x") + (_signed(b, "") if b else "")
    right = _linear([c], "x") + (_signed(e, "") if e else "")
    return f"Solve for $x$: $ {left} = {right} $.", Fraction(e - b, a - c), {"a": a, "b": b, "c": c, "e": e}


def _system_two(d: _Draw) -> tuple[str, Fraction, dict[str, Any]]:
    x, y = d.between(-12, 12), d.between(-12, 12)
    rows = [[0, 0], [0, 0]]
    while rows[0][0] * rows[1][1] - rows[0][1] * rows[1][0] == 0:
        rows = [[d.nonzero(-7, 7), d.nonzero(-7, 7)] for _ in range(2)]
    rhs = [r[0] * x + r[1] * y for r in rows]
    target = d.choice(["x + y", "x - y", "xy"])
    value = {"x + y": x + y, "x - y": x - y, "xy": x * y}[target]
    equations = " and ".join(f"$ {_linear(r, 'xy')} = {v} $" for r, v in zip(rows, rhs, strict=True))
    return f"If {equations}, what is the value of ${target}$?", Fraction(value), {
        "rows": rows, "rhs": rhs, "target": target,
    }  # fmt: skip


def _divisor_count(d: _Draw) -> tuple[str, Fraction, dict[str, Any]]:
    n = d.choice([2, 3, 4, 6, 8, 12]) * d.between(5, 150)
    divisors = {m for k in range(1, math.isqrt(n) + 1) if n % k == 0 for m in (k, n // k)}
    return f"How many positive divisors does {n} have?", Fraction(len(divisors)), {"n": n}


def _power_mod(d: _Draw) -> tuple[str, Fraction, dict[str, Any]]:
    base, exponent, modulus = d.between(2, 19), d.between(10, 200), d.between(5, 23)
    question = f"What is the remainder when ${base}^{{{exponent}}}$ is divided by {modulus}?"
    return (
        question,
        Fraction(pow(base, exponent, modulus)),
        {"base": base, "exponent": exponent, "modulus": modulus},
    )


def _committee(d: _Draw) -> tuple[str, Fraction, dict[str, Any]]:
    n = d.between(6, 20)
    k = d.between(2, min(6, n - 2))
    question = f"In how many ways can a committee of {k} people be chosen from a group of {n} people?"
    return question, Fraction(math.comb(n, k)), {"n": n, "k": k}


def _arithmetic_series(d: _Draw) -> tuple[str, Fraction, dict[str, Any]]:
    first, step, count = d.between(-20, 30), d.nonzero(-6, 9), d.between(8, 40)
    shown = ", ".join(str(first + i * step) for i in range(3))
    question = f"What is the sum of the first {count} terms of the arithmetic sequence {shown}, ...?"
    value = count * (2 * first + (count - 1) * step) // 2
    return question, Fraction(value), {"first": first, "step": step, "count": count}


# ---------------------------------------------------------------------------- level 3


def _quadratic(d: _Draw) -> tuple[str, Fraction, dict[str, Any]]:
    r, s = d.between(-12, 12), d.between(-12, 12)
    while s == r:
        s = d.between(-12, 12)
    lead = d.choice([1, 1, 2, 3])
    b, c = -lead * (r + s), lead * r * s
    polynomial = (
        f"{lead if lead > 1 else ''}x^2" + (_signed(b, "x") if b else "") + (_signed(c, "") if c else "")
    )
    asks = {
        "the larger root": max(r, s),
        "the smaller root": min(r, s),
        "the sum of the squares of its roots": r * r + s * s,
        "the positive difference between its roots": abs(r - s),
    }
    ask = d.choice(sorted(asks))
    question = f"The equation $ {polynomial} = 0 $ has two distinct real roots. What is {ask}?"
    return question, Fraction(asks[ask]), {"lead": lead, "b": b, "c": c, "ask": ask}


def _nested_fractions(d: _Draw) -> tuple[str, Fraction, dict[str, Any]]:
    p, q, r, t = (Fraction(d.between(1, 9), d.between(2, 9)) for _ in range(4))
    while p == q:
        q = Fraction(d.between(1, 9), d.between(2, 9))
    value = (p - q) / r + t
    text = f"\\left( {_frac_tex(p)} - {_frac_tex(q)} \\right) \\div {_frac_tex(r)} + {_frac_tex(t)}"
    params = {"p": format_number(p), "q": format_number(q), "r": format_number(r), "t": format_number(t)}
    return f"Compute $ {text} $. Give your answer as a fraction in lowest terms.", value, params


def _system_three(d: _Draw) -> tuple[str, Fraction, dict[str, Any]]:
    solution = [d.between(-9, 9) for _ in range(3)]
    rows: list[list[int]] = []
    while not rows or _det3(rows) == 0:
        rows = [[d.between(-5, 5) for _ in range(3)] for _ in range(3)]
        if any(all(v == 0 for v in row) for row in rows):
            rows = []
    rhs = [sum(a * x for a, x in zip(row, solution, strict=True)) for row in rows]
    target = d.choice(["x + y + z", "x", "y", "z"])
    values = {"x + y + z": sum(solution), "x": solution[0], "y": solution[1], "z": solution[2]}
    equations = ", ".join(f"$ {_linear(r, 'xyz')} = {v} $" for r, v in zip(rows, rhs, strict=True))
    question = f"Real numbers $x$, $y$, $z$ satisfy {equations}. What is ${target}$?"
    return question, Fraction(values[target]), {"rows": rows, "rhs": rhs, "target": target}


def _det3(m: list[list[int]]) -> int:
    return (
        m[0][0] * (m[1][1] * m[2][2] - m[1][2] * m[2][1])
        - m[0][1] * (m[1][0] * m[2][2] - m[1][2] * m[2][0])
        + m[0][2] * (m[1][0] * m[2][1] - m[1][1] * m[2][0])
    )


def _totient(d: _Draw) -> tuple[str, Fraction, dict[str, Any]]:
    n = d.between(30, 600)
    value = n
    remaining, prime = n, 2
    while prime * prime <= remaining:
        if remaining % prime == 0:
            value -= value // prime
            while remaining % prime == 0:
                remaining //= prime
        prime += 1
    if remaining > 1:
        value -= value // remaining
    question = f"How many integers from 1 to {n} (inclusive) are relatively prime to {n}?"
    return question, Fraction(value), {"n": n}


def _inclusion_exclusion(d: _Draw) -> tuple[str, Fraction, dict[str, Any]]:
    a, b = d.between(2, 15), d.between(2, 15)
    while b == a:
        b = d.between(2, 15)
    n = d.between(100, 2000)
    value = n // a + n // b - n // (a * b // math.gcd(a, b))
    question = f"How many integers from 1 to {n} (inclusive) are divisible by {a} or by {b}?"
    return question, Fraction(value), {"n": n, "a": a, "b": b}


def _congruence(d: _Draw) -> tuple[str, Fraction, dict[str, Any]]:
    m = d.between(7, 60)
    a = d.between(2, m - 1)
    while math.gcd(a, m) != 1:
        a = d.between(2, m - 1)
    b = d.between(1, m - 1)
    x = (b * pow(a, -1, m)) % m or m
    question = f"What is the smallest positive integer $x$ such that ${a}x \\equiv {b} \\pmod{{{m}}}$?"
    return question, Fraction(x), {"a": a, "b": b, "m": m}


def _arrangements(d: _Draw) -> tuple[str, Fraction, dict[str, Any]]:
    letters = "ABCDE"[: d.between(2, 4)]
    counts = [d.between(1, 4) for _ in letters]
    word = "".join(letter * count for letter, count in zip(letters, counts, strict=True))
    value = math.factorial(len(word))
    for count in counts:
        value //= math.factorial(count)
    question = f"How many distinct strings can be made by rearranging all the letters of {word}?"
    return question, Fraction(value), {"word": word}


def _divisor_sum(d: _Draw) -> tuple[str, Fraction, dict[str, Any]]:
    n = d.choice([2, 3, 4, 6, 10, 12]) * d.between(5, 100)
    total = sum(k + (n // k if k * k != n else 0) for k in range(1, math.isqrt(n) + 1) if n % k == 0)
    return f"What is the sum of all positive divisors of {n}?", Fraction(total), {"n": n}


Maker = Callable[[_Draw], tuple[str, Fraction, dict[str, Any]]]

#: Problem kinds per level, as (name, maker).
KINDS: dict[int, tuple[tuple[str, Maker], ...]] = {
    1: (
        ("order_of_operations", _order_of_operations), ("gcd", _gcd), ("lcm", _lcm),
        ("remainder", _remainder), ("digit_sum", _digit_sum), ("linear_one_side", _linear_one_side),
        ("percent", _percent),
    ),
    2: (
        ("fraction_sum", _fraction_sum), ("linear_both_sides", _linear_both_sides),
        ("system_two", _system_two), ("divisor_count", _divisor_count), ("power_mod", _power_mod),
        ("committee", _committee), ("arithmetic_series", _arithmetic_series),
    ),
    3: (
        ("quadratic", _quadratic), ("nested_fractions", _nested_fractions),
        ("system_three", _system_three), ("totient", _totient),
        ("inclusion_exclusion", _inclusion_exclusion), ("congruence", _congruence),
        ("arrangements", _arrangements), ("divisor_sum", _divisor_sum),
    ),
}  # fmt: skip

_TOPICS = {
    "order_of_operations": "arithmetic", "percent": "arithmetic", "fraction_sum": "arithmetic",
    "nested_fractions": "arithmetic", "digit_sum": "number theory", "gcd": "number theory",
    "lcm": "number theory", "remainder": "number theory", "divisor_count": "number theory",
    "power_mod": "number theory", "totient": "number theory", "congruence": "number theory",
    "divisor_sum": "number theory", "linear_one_side": "algebra", "linear_both_sides": "algebra",
    "system_two": "algebra", "system_three": "algebra", "quadratic": "algebra",
    "arithmetic_series": "algebra", "committee": "counting", "inclusion_exclusion": "counting",
    "arrangements": "counting",
}  # fmt: skip


def generate(level: int, seed: int) -> tuple[str, str, str, str, dict[str, Any]]:
    """The problem for ``(level, seed)``: ``(question, answer, kind, topic, params)``."""
    if level not in KINDS:
        raise ValueError(f"unknown difficulty level {level!r}; valid levels: {list(LEVELS)}")
    if not 0 <= int(seed) < _SEED_END:
        raise ValueError(f"seed must be in [0, 2**31), got {seed!r}")
    draw = _Draw(level * _SEED_END + int(seed))
    kind, maker = draw.choice(KINDS[level])
    question, value, params = maker(draw)
    return question, format_number(value), kind, _TOPICS[kind], params


#: Kinds whose value does not change when the listed parameters are permuted.
_COMMUTATIVE: dict[str, tuple[str, ...]] = {
    "gcd": ("a", "b"), "lcm": ("a", "b"), "order_of_operations": ("b", "c"), "percent": ("p", "n"),
    "inclusion_exclusion": ("a", "b"),
}  # fmt: skip
#: Kinds whose list parameters (terms, equations) can be reordered without changing the problem.
_REORDERABLE: dict[str, tuple[str, ...]] = {"fraction_sum": ("terms",), "system_two": ("rows", "rhs"),
                                            "system_three": ("rows", "rhs")}  # fmt: skip


def _frozen(value: Any) -> Any:
    return tuple(_frozen(v) for v in value) if isinstance(value, list | tuple) else value


def content_key(kind: str, params: dict[str, Any]) -> tuple[Any, ...]:
    """What a generated problem asks, independent of how it is written: ``kind`` and ``params``
    with the operands of commutative operations in sorted order (``gcd``/``lcm`` of a and b, the
    product ``b x c`` in ``a + b x c - e``, ``p% of n``, the two divisors of an inclusion-exclusion
    count) and reorderable lists sorted (the terms of a fraction sum, the equations of a system)."""
    values = {name: _frozen(value) for name, value in params.items()}
    swapped = _COMMUTATIVE.get(kind, ())
    if swapped:
        ordered = sorted(values[name] for name in swapped)
        values.update(zip(swapped, ordered, strict=True))
    listed = _REORDERABLE.get(kind, ())
    if listed:
        rows = sorted(zip(*(values[name] for name in listed), strict=True))
        for position, name in enumerate(listed):
            values[name] = tuple(row[position] for row in rows)
    if kind == "fraction_sum":  # terms are signed fractions as text: sort by value
        values["terms"] = tuple(sorted(values["terms"], key=Fraction))
    return (kind, *sorted(values.items()))


@lru_cache(maxsize=len(LEVELS))
def test_keys(level: int) -> frozenset[tuple[Any, ...]]:
    """The :func:`content_key` of every test problem at ``level`` (kept out of the training split)."""
    problems = (generate(level, seed) for seed in range(TEST_SEEDS))
    return frozenset(content_key(kind, params) for _, _, kind, _, params in problems)


@lru_cache(maxsize=len(LEVELS))
def test_questions(level: int) -> frozenset[str]:
    """The question texts of the test split at ``level`` (kept out of the training split)."""
    return frozenset(generate(level, seed)[0] for seed in range(TEST_SEEDS))


def sample_seed(level: int, split: str, random_integer: Callable[[int, int], int]) -> int:
    """A seed of ``split`` at ``level``; ``random_integer(low, high)`` draws from ``[low, high)``.

    Training seeds whose problem has the content of a test problem (:func:`content_key`) are
    skipped (drawn again).
    """
    if split == "test":
        return random_integer(0, TEST_SEEDS)
    if split != "train":
        raise ValueError(f"unknown split {split!r}; valid splits: 'train', 'test'")
    banned = test_keys(level)
    while True:
        seed = random_integer(TRAIN_SEED_START, _SEED_END)
        _, _, kind, _, params = generate(level, seed)
        if content_key(kind, params) not in banned:
            return seed
