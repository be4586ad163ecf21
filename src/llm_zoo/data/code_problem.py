"""The problem types of ``Code-v0`` and the field readers shared by its dataset formats.

:class:`CodeProblem` is a statement with hidden ground-truth tests. A problem is one of two kinds:

* *stdin/stdout* (``call is None``): each :class:`~llm_zoo.data.code_problem.TestCase` is the text fed to standard input and
  the text the program must print;
* *call-based* (``call`` is a :class:`CallSpec`): the program defines the function (or class
  method) the spec names; each :class:`~llm_zoo.data.code_problem.TestCase` holds the call's arguments as a Python literal
  list in ``input`` (e.g. ``"[[1, 2], 3]"``) and the expected return value as a Python literal in
  ``output`` (e.g. ``"6"``), see :mod:`llm_zoo.checkers.call_harness`. A call-based problem may also carry
  test source (``call.checker``), run by the hidden test :data:`CHECK_TEST` (see
  :mod:`llm_zoo.checkers.call_checker`), for tests that are not fixed calls.

Everything here is re-exported by :mod:`llm_zoo.data.code`, the module to import.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from llm_zoo.checkers.call_checker import CHECK_INPUT
from llm_zoo.checkers.call_harness import args_text, value_text

__all__ = [
    "CHECK_TEST",
    "CallSpec",
    "CodeDatasetError",
    "CodeProblem",
    "TestCase",
    "call_test",
    "field_value",
    "json_field",
    "stdio_tests",
    "stdio_text",
]


class CodeDatasetError(ValueError):
    """A problem source could not be read: the message names the file and the record."""


@dataclass(frozen=True)
class TestCase:
    """One test. Stdin/stdout: the program gets ``input`` on stdin and must print ``output``
    (judged leniently, see :func:`llm_zoo.envs.code.outputs_match`). Call-based: ``input`` is
    the argument list and ``output`` the expected return value, both as Python literals."""

    __test__ = False  # not a pytest test class

    input: str
    output: str


#: The hidden test of a problem with a checker: run ``check(candidate)`` (:mod:`llm_zoo.checkers.call_checker`).
CHECK_TEST = TestCase(CHECK_INPUT, "True")


def call_test(args: list[Any] | tuple[Any, ...], expected: Any) -> TestCase:
    """A call-based test from plain values; :class:`CodeDatasetError` if they are not plain."""
    try:
        return TestCase(args_text(args), value_text(expected))
    except ValueError as err:
        raise CodeDatasetError(str(err)) from None


@dataclass(frozen=True)
class CallSpec:
    """What a call-based problem's program must define and how it is called.

    Attributes:
        name: The function to call, or the method when ``class_name`` is set.
        class_name: ``"Solution"`` for LeetCode-style problems (``Solution().name(*args)``);
            ``None`` for a top-level function.
        signature: The code skeleton shown to the agents (LeetCode's starter code, HumanEval's
            prompt, ``def name(args):`` for MBPP). May be empty.
        lenient_singleton: Also accept a return value equal to the only element of a one-element
            expected list (APPS stores many expected values wrapped in a list).
        checker: Test source defining ``check(candidate)`` (for HumanEval, the prompt's helpers
            and the record's ``test``), run by the hidden test :data:`CHECK_TEST` in a sandbox
            process of its own that calls the candidate's code in another one (see
            :mod:`llm_zoo.checkers.call_checker`); ``None`` when every test is a fixed call. Hidden.
    """

    name: str
    class_name: str | None = None
    signature: str = ""
    lenient_singleton: bool = False
    checker: str | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.isidentifier():
            raise ValueError(f"a call's function name must be a Python identifier, got {self.name!r}")
        if self.class_name is not None and not self.class_name.isidentifier():
            raise ValueError(f"a call's class name must be a Python identifier, got {self.class_name!r}")
        if self.checker is not None and (self.class_name is not None or not isinstance(self.checker, str)):
            raise ValueError("a call's checker must be test source (str), for a top-level function only")

    @property
    def target(self) -> str:
        """How the call reads in prompts: ``Solution().twoSum`` or ``two_sum``."""
        return f"{self.class_name}().{self.name}" if self.class_name else self.name


@dataclass(frozen=True)
class CodeProblem:
    """A programming problem, stdin/stdout or call-based (``call``).

    Attributes:
        id: Unique id, prefixed by the source (``"builtin/..."``, ``"apps/..."``, ...).
        statement: The problem text shown to the agents.
        tests: Hidden ground-truth tests (at least one).
        reference: A reference solution (a Python 3 program; for a call-based problem, code that
            defines the function), or ``None`` if the source has none.
        difficulty: ``"easy"``, ``"medium"``, ``"hard"`` or ``"unknown"``.
        source: ``"builtin"``, ``"apps"``, ``"code_contests"``, ``"livecodebench"``,
            ``"humaneval"``, ``"mbpp"`` or as given.
        title: A short name (may be empty).
        split: ``"train"`` / ``"test"`` for the built-in set; ``None`` when the source file itself
            is one split (it then belongs to whichever split is asked for).
        metadata: Source-specific extras (url, contest, raw difficulty, ...). Read-only by convention.
        call: For a call-based problem, the function to call; ``None`` for stdin/stdout.
    """

    id: str
    statement: str
    tests: tuple[TestCase, ...]
    reference: str | None = None
    difficulty: str = "unknown"
    source: str = "builtin"
    title: str = ""
    split: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict, compare=False)
    call: CallSpec | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.id, str) or not self.id:
            raise ValueError(f"a problem id must be a non-empty string, got {self.id!r}")
        object.__setattr__(self, "tests", tuple(self.tests))
        if not self.tests or not all(isinstance(t, TestCase) for t in self.tests):
            raise ValueError(f"problem {self.id!r}: tests must be a non-empty sequence of TestCase")
        if self.call is not None and not isinstance(self.call, CallSpec):
            raise ValueError(f"problem {self.id!r}: call must be a CallSpec or None")
        if CHECK_TEST in self.tests and (self.call is None or self.call.checker is None):
            raise ValueError(f"problem {self.id!r}: the test {CHECK_INPUT!r} needs a call with a checker")

    @property
    def kind(self) -> str:
        """``"call"`` for a call-based problem, ``"stdio"`` for stdin/stdout."""
        return "stdio" if self.call is None else "call"

    def __deepcopy__(self, memo: dict) -> CodeProblem:
        return self  # immutable: env clones share problems instead of copying every test


# ---------------------------------------------------------------------------------------- fields


def field_value(record: Mapping[str, Any], key: str, kind: type | tuple[type, ...] = str) -> Any:
    """``record[key]``, required and of type ``kind``; :class:`CodeDatasetError` otherwise."""
    if key not in record or record[key] is None:
        raise CodeDatasetError(f"missing field {key!r}")
    value = record[key]
    if not isinstance(value, kind):
        kinds = kind if isinstance(kind, tuple) else (kind,)
        names = " or ".join(k.__name__ for k in kinds)
        raise CodeDatasetError(f"field {key!r} should be {names}, got {type(value).__name__}")
    return value


def json_field(record: Mapping[str, Any], key: str, default: Any) -> Any:
    """A field holding JSON text (empty -> ``default``); already-decoded values pass through."""
    value = record.get(key)
    if value is None or value == "":
        return default
    if not isinstance(value, str):
        return value
    try:
        return json.loads(value)
    except json.JSONDecodeError as err:
        raise CodeDatasetError(f"field {key!r} is not valid JSON ({err})") from None


def stdio_text(value: Any, what: str) -> str:
    """A stdin/stdout test input or output: a string, or a list of lines (APPS has both)."""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(line, str) for line in value):
        return "\n".join(value) + "\n"
    raise CodeDatasetError(f"{what} should be a string or a list of strings, got {type(value).__name__}")


def stdio_tests(inputs: Any, outputs: Any, what: str) -> list[TestCase]:
    """Stdin/stdout tests from parallel lists of inputs and outputs."""
    if not isinstance(inputs, list) or not isinstance(outputs, list):
        raise CodeDatasetError(f"{what}: inputs and outputs should be lists")
    if len(inputs) != len(outputs):
        raise CodeDatasetError(f"{what}: {len(inputs)} inputs but {len(outputs)} outputs")
    return [
        TestCase(stdio_text(i, f"{what} input {n}"), stdio_text(o, f"{what} output {n}"))
        for n, (i, o) in enumerate(zip(inputs, outputs, strict=True))
    ]
