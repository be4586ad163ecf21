"""Shared helpers for the built-in Code-v0 problem specs (see tools/build_code_problems.py)."""

from __future__ import annotations

import random
import textwrap
from dataclasses import dataclass


@dataclass(frozen=True)
class Spec:
    """One problem as written: the expected outputs are produced by running ``reference``.

    Attributes:
        slug: Short unique name; the problem id is ``builtin/<slug>``.
        title: Display title.
        difficulty: ``easy`` / ``medium`` / ``hard``.
        statement: Full statement with input/output format, constraints and an example.
        reference: A correct, efficient Python 3 stdin/stdout solution.
        inputs: Hidden test inputs (at least 5; the statement's example comes first).
    """

    slug: str
    title: str
    difficulty: str
    statement: str
    reference: str
    inputs: tuple[str, ...]


def spec(slug: str, title: str, difficulty: str, statement: str, reference: str, inputs: list[str]) -> Spec:
    return Spec(
        slug,
        title,
        difficulty,
        textwrap.dedent(statement).strip() + "\n",
        textwrap.dedent(reference).strip() + "\n",
        tuple(inputs),
    )


def rng(seed: int) -> random.Random:
    return random.Random(seed)


def line(values) -> str:
    return " ".join(map(str, values))


def array_input(values) -> str:
    """``n`` on the first line, the values on the second."""
    values = list(values)
    return f"{len(values)}\n{line(values)}\n"
