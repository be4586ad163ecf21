"""Running call-based solutions: a harness program that calls a named function in the sandbox.

A *call-based* problem (LeetCode / LiveCodeBench ``functional`` tests, APPS ``fn_name``,
HumanEval, MBPP) is judged by calling a function, or a method of a class, with each test's
arguments and comparing the return value with the expected one.

How a call runs. :func:`harness_program` wraps the candidate's source in a small program for the
sandbox (:mod:`llm_zoo.sandbox`). The program carries only the candidate's code; the test's
arguments reach it on standard input (:func:`call_stdin`: the argument list, stored as a Python
literal by :func:`args_text`, sent as base64 of ``marshal`` format 2, which holds plain values only
and, unlike ``ast``, costs no import in the sandbox); the expected value never enters the
sandbox. The harness

1. reads the arguments (``marshal.loads``, never ``eval``) and then gives the candidate an empty
   standard input;
2. runs :data:`PRELUDE` (common imports, as LeetCode and LiveCodeBench provide: ``List``,
   ``Optional``, ``defaultdict``, ``deque``, ``heapq``, ``math``, ...) and then the candidate's code
   in a fresh namespace named ``"solution"`` (so an ``if __name__ == "__main__":`` block does not run);
3. finds the target: with a class name (``"Solution"``), that class's method called through a new
   instance; if the class is missing, a top-level function of the method's name is accepted;
4. calls it; the candidate's own prints go to standard error;
5. converts the return value to plain built-in values (tuples, lists, dicts, sets, str, int, float,
   bool, None, bytes; NumPy scalars and arrays via ``item()`` / ``tolist()``) and prints its ``repr``
   on one line after :data:`RESULT_MARKER` (infinite floats as ``1e999`` / ``-1e999``, see
   :func:`literal_text`). Any other type, a NaN (it equals nothing, so no test could expect it) or
   a crash is an error (non-zero exit, message on standard error naming the type).

The host reads that line with :func:`read_call_result` (``ast.literal_eval`` again) and compares it
with :func:`values_match`, in the host process.

*Batch mode* (:func:`batch_stdin`, used by the checker path of :mod:`llm_zoo.checkers.call_checker`): the
standard input holds several argument lists; one process makes the calls in order, as HumanEval's
own harness does, printing a numbered result line for each (:func:`read_call_results`), and stops
at the first call that fails. The run's time limit covers all its calls.

Comparison (:func:`values_match`), "JSON-equal" with the stdout judge's number tolerance: lists and
tuples are interchangeable; dicts need equal key sets and matching values; sets compare exactly;
``bool`` matches only ``bool`` and ``None`` only ``None``; an expected int accepts only a number
of exactly its value (however large; ``6.0`` is accepted for ``6``, ``6.0000001`` is not); an
expected float accepts an int or float within absolute or relative tolerance 1e-6; strings and
bytes compare exactly.
"""

from __future__ import annotations

import binascii
import collections
import contextlib
import functools
import inspect
import marshal
import math
import threading
from typing import Any

from llm_zoo import safe_ast

__all__ = [
    "BATCH_PREFIX",
    "PRELUDE",
    "RESULT_MARKER",
    "TOLERANCE",
    "args_text",
    "batch_stdin",
    "call_stdin",
    "call_text",
    "canonical_literal",
    "harness_program",
    "literal",
    "literal_text",
    "literal_writer_source",
    "read_call_result",
    "read_call_results",
    "small_index",
    "value_text",
    "values_match",
]

#: Absolute / relative tolerance for numbers (the same as the stdout judge's).
TOLERANCE = 1e-6

#: Prefix of the harness's result line on standard output.
RESULT_MARKER = "@@llm_zoo_call_result@@ "

#: Starts the harness's standard input when it holds several calls (:func:`batch_stdin`).
BATCH_PREFIX = "batch:"

#: Names the candidate's code may use without importing them (as LeetCode's environment does).
PRELUDE = """\
from typing import *
from collections import *
from heapq import *
from bisect import *
from itertools import *
from functools import *
import math, string, re, heapq, bisect, itertools, functools, collections, operator, sys
"""

_HARNESS = """\
import binascii, io, marshal, math, sys

SOURCE = {source!r}
CLASS_NAME = {class_name!r}
NAME = {name!r}
PRELUDE = {prelude!r}
BATCH_PREFIX = {batch_prefix!r}


def fail(message):
    sys.stderr.write("harness: " + message + "\\n")
    sys.stderr.flush()
    sys.exit(3)


NON_FINITE = [False]

{literal_writer}

def plain(value, depth=0):
    if depth > 200:
        fail("the return value is nested too deeply")
    if value is None or isinstance(value, (bool, str, bytes)):
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        if value != value:
            fail("the return value holds a NaN float, which equals nothing (return a number, inf or None)")
        if not math.isfinite(value):
            NON_FINITE[0] = True
        return float(value)
    if isinstance(value, (list, tuple)):
        items = [plain(item, depth + 1) for item in value]
        return items if isinstance(value, list) else tuple(items)
    if isinstance(value, (set, frozenset)):
        return {{plain(item, depth + 1) for item in value}}
    if isinstance(value, dict):
        return {{plain(key, depth + 1): plain(item, depth + 1) for key, item in value.items()}}
    if type(value).__module__ == "numpy" and hasattr(value, "tolist"):
        return plain(value.tolist(), depth + 1)
    fail(
        f"the function returned a value of type {{type(value).__name__}}, not a plain value "
        "(None, bool, int, float, str, list, tuple, dict, set)"
    )


def target(namespace):
    if CLASS_NAME:
        cls = namespace.get(CLASS_NAME)
        if isinstance(cls, type):
            method = getattr(cls(), NAME, None)
            if callable(method):
                return method
            fail(f"class {{CLASS_NAME}} has no method {{NAME}}")
    function = namespace.get(NAME)
    if callable(function):
        return function
    fail(f"the program defines no {{'class ' + CLASS_NAME + ' with a method ' if CLASS_NAME else 'function '}}{{NAME}}")


def main():
    text = sys.stdin.read()
    batch = text.startswith(BATCH_PREFIX)
    try:
        calls = marshal.loads(binascii.a2b_base64(text[len(BATCH_PREFIX):] if batch else text))
    except (ValueError, EOFError, TypeError, binascii.Error) as error:
        fail(f"the test's arguments could not be read ({{error}})")
    if not batch:
        calls = [calls]
    if not isinstance(calls, (list, tuple)) or not all(isinstance(args, (list, tuple)) for args in calls):
        fail("the test's arguments must be a list")
    if hasattr(sys, "set_int_max_str_digits"):
        sys.set_int_max_str_digits(0)
    sys.stdin = io.StringIO("")
    real_stdout, sys.stdout = sys.stdout, sys.stderr
    namespace = {{"__name__": "solution", "__builtins__": __builtins__}}
    exec(PRELUDE, namespace)
    exec(compile(SOURCE, "solution.py", "exec"), namespace)
    function = target(namespace)
    for index, args in enumerate(calls):
        NON_FINITE[0] = False
        result = plain(function(*args))
        text = literal_text(result) if NON_FINITE[0] else repr(result)
        real_stdout.write("\\n" + {marker!r} + (f"{{index}} " if batch else "") + text + "\\n")
        real_stdout.flush()


main()
"""


def harness_program(source: str, name: str, class_name: str | None = None) -> str:
    """The program that runs ``source`` and calls ``name`` (a method of ``class_name`` if given)
    with the arguments it reads on standard input. It holds no expected value."""
    return _HARNESS.format(
        source=source, class_name=class_name or "", name=name, prelude=PRELUDE, marker=RESULT_MARKER,
        batch_prefix=BATCH_PREFIX, literal_writer=literal_writer_source(),
    )  # fmt: skip


def literal_text(value: object) -> str:
    """``repr(value)``, except that infinite floats are written ``1e999`` / ``-1e999``, which
    :func:`literal` reads back as infinities (``repr`` gives ``inf``, which is not a literal)."""
    if isinstance(value, float) and value in (math.inf, -math.inf):
        return "1e999" if value > 0 else "-1e999"
    if isinstance(value, list):
        return "[" + ", ".join(literal_text(item) for item in value) + "]"
    if isinstance(value, tuple):
        return "(" + "".join(literal_text(item) + ", " for item in value) + ")"
    if isinstance(value, (set, frozenset)):
        return "{" + ", ".join(literal_text(item) for item in value) + "}" if value else "set()"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{literal_text(k)}: {literal_text(v)}" for k, v in value.items()) + "}"
    return repr(value)


@functools.cache
def literal_writer_source() -> str:
    """The source of :func:`literal_text`, for the programs that run in the sandbox (they cannot
    import this package)."""
    return inspect.getsource(literal_text)


def batch_stdin(args_literals: list[str]) -> str:
    """The harness's standard input for several calls of one process, in order (from the stored
    argument lists): it prints one numbered result line per call, and stops at the first that fails."""
    calls = [literal(text) for text in args_literals]
    return BATCH_PREFIX + binascii.b2a_base64(marshal.dumps(calls, 2)).decode("ascii")


def read_call_results(stdout: str, count: int) -> list[Any]:
    """The return values a batch run printed, in call order, up to the first call without one
    (it crashed, timed out or returned a value that is not plain); at most ``count``."""
    printed: dict[int, str] = {}
    for line in stdout.splitlines():
        if line.startswith(RESULT_MARKER):
            number, _, text = line[len(RESULT_MARKER) :].partition(" ")
            index = small_index(number, count)
            if index is not None:
                printed.setdefault(index, text)
    values = []
    for index in range(count):
        if index not in printed:
            break
        try:
            values.append(literal(printed[index]))
        except ValueError:
            break
    return values


def literal(text: str) -> Any:
    """Read a Python literal (never evaluated as code); ``ValueError`` naming the problem.

    A value this process could not write back as text is refused here, so that no caller can
    raise on it later: an integer beyond Python's limit for int-to-str conversion (4300 digits
    by default; ``0x`` literals of any length parse), or nesting deeper than ``repr`` goes.
    Long texts read before are not parsed again (:class:`_LiteralCache`): a judge, the unit
    tester's answers and the oracle read the same test inputs at every step."""
    if len(text) < _LiteralCache.MIN_CHARS:
        return _read_literal(text)
    cached = _LITERALS.get(text)
    if cached is not None:
        return marshal.loads(cached)  # a fresh copy: callers may change the value
    value = _read_literal(text)
    with contextlib.suppress(ValueError):  # nested too deep for marshal: simply not cached
        _LITERALS.put(text, marshal.dumps(value))
    return value


def _read_literal(text: str) -> Any:
    try:
        value = safe_ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError) as error:
        raise ValueError(f"not a Python literal: {type(error).__name__}: {error}") from None
    try:
        repr(value)
    except (ValueError, RecursionError, MemoryError) as error:
        raise ValueError(
            f"a literal too large to print: {type(error).__name__}: {str(error)[:120]}"
        ) from None
    return value


class _LiteralCache:
    """Texts of accepted literals and their values (``marshal``-ed, 10-100x faster to read back
    than parsing the text), least recently used first out, at most ``MAX_CHARS`` characters of
    text in all. Thread-safe."""

    MIN_CHARS = 256  # shorter texts parse in microseconds
    MAX_CHARS = 16_000_000

    def __init__(self) -> None:
        self._entries: collections.OrderedDict[str, bytes] = collections.OrderedDict()
        self._chars = 0
        self._lock = threading.Lock()

    def get(self, text: str) -> bytes | None:
        with self._lock:
            found = self._entries.get(text)
            if found is not None:
                self._entries.move_to_end(text)
            return found

    def put(self, text: str, payload: bytes) -> None:
        if len(text) > self.MAX_CHARS // 4:
            return
        with self._lock:
            if text not in self._entries:
                self._chars += len(text)
            self._entries[text] = payload
            while self._chars > self.MAX_CHARS:
                old, _ = self._entries.popitem(last=False)
                self._chars -= len(old)


_LITERALS = _LiteralCache()


def small_index(text: str, limit: int = 10**9) -> int | None:
    """``int(text)`` for a plain decimal index in ``[0, limit)`` (ASCII digits only), else ``None``:
    never raises, whatever the text (``int`` accepts other digits, signs, spaces and underscores,
    and refuses numbers over 4300 digits with ``ValueError``)."""
    text = text.strip()
    if not (text.isascii() and text.isdigit()) or len(text) > len(str(limit)):
        return None
    number = int(text)
    return number if number < limit else None


#: Types whose ``repr`` is the literal :func:`literal_text` writes (no float: it may be infinite).
_REPR_IS_LITERAL = frozenset({int, str, bool, type(None)})
#: Flat lists holding only one of these types compare exactly with ``==`` (see :func:`values_match`).
_EXACT_KINDS = ({int}, {str}, {bool})


def _host_literal_text(value: Any) -> str:
    """:func:`literal_text`, with a list of plain values (most test arguments, or rows of a grid)
    written by ``repr`` at C speed. ``literal_text`` itself stays as it is: its source also runs
    in the sandbox."""
    if not isinstance(value, list):
        return literal_text(value)
    if set(map(type, value)) <= _REPR_IS_LITERAL:
        return repr(value)
    return "[" + ", ".join(_host_literal_text(item) for item in value) + "]"


def _check_literal(value: Any, what: str) -> str:
    text = _host_literal_text(value)
    try:
        if literal(text) == value or value != value:
            return text
    except ValueError:
        pass
    raise ValueError(
        f"{what} {text[:80]!r} is not a plain value (None, bool, int, float, str, list, dict, ...)"
    )


def args_text(args: list[Any] | tuple[Any, ...]) -> str:
    """The standard input of one call: the arguments as a Python literal list."""
    return _check_literal(list(args), "the arguments")


def value_text(value: Any) -> str:
    """An expected return value as a Python literal (how call-based tests store it)."""
    return _check_literal(value, "the value")


@functools.lru_cache(maxsize=256)  # a judge asks for the same tests' inputs at every step
def call_stdin(args_literal: str) -> str:
    """The harness's standard input for one call, from the stored argument list (a Python literal)."""
    return binascii.b2a_base64(marshal.dumps(literal(args_literal), 2)).decode("ascii")


@functools.lru_cache(maxsize=256)
def canonical_literal(text: str) -> str:
    """``repr`` of the value ``text`` spells, so equal values compare equal as text; ``text``
    itself if it is not a literal."""
    try:
        return repr(literal(text))
    except ValueError:
        return text


def call_text(name: str, args_literal: str) -> str:
    """``name(arg1, arg2)`` for prompts, from the stored argument list."""
    try:
        args = literal(args_literal)
    except ValueError:
        return f"{name}(<unreadable arguments>)"
    return f"{name}({', '.join(repr(a) for a in args)})" if isinstance(args, list) else f"{name}(?)"


def read_call_result(stdout: str) -> Any:
    """The return value the harness printed; ``ValueError`` if there is none or it is unreadable."""
    for line in reversed(stdout.splitlines()):
        if line.startswith(RESULT_MARKER):
            return literal(line[len(RESULT_MARKER) :])
    raise ValueError("the program ended without the function returning (no result line)")


def _numbers_match(expected: float, actual: float, tolerance: float) -> bool:
    if isinstance(expected, int):  # exact: float(sum(a) + 150) is close, not right; 6.0 is 6
        return expected == actual  # int == float compares exact values in Python, however large
    try:
        if math.isnan(expected) or math.isnan(actual):
            return math.isnan(expected) and math.isnan(actual)
        return math.isclose(expected, actual, rel_tol=tolerance, abs_tol=tolerance)
    except OverflowError:  # an int beyond any float (10**400 against 0.5): not within a tolerance
        return False


def values_match(expected: Any, actual: Any, *, tolerance: float = TOLERANCE) -> bool:
    """Whether a returned ``actual`` is accepted for ``expected`` (see the module docstring).
    Never raises: values it cannot compare (nested past the recursion limit) do not match."""
    try:
        return _values_match(expected, actual, tolerance)
    except (RecursionError, OverflowError, TypeError, ValueError):
        return False


def _values_match(expected: Any, actual: Any, tolerance: float) -> bool:
    if isinstance(expected, bool) or isinstance(actual, bool):
        return isinstance(expected, bool) and isinstance(actual, bool) and expected == actual
    if expected is None or actual is None:
        return expected is None and actual is None
    number = (int, float)
    if isinstance(expected, number) and isinstance(actual, number):
        return _numbers_match(expected, actual, tolerance)
    if isinstance(expected, (list, tuple)) and isinstance(actual, (list, tuple)):
        if len(expected) != len(actual):
            return False
        if set(map(type, expected)) | set(map(type, actual)) in _EXACT_KINDS:
            # only ints (never bools), only strs or only bools: the rules below are plain equality
            return list(expected) == list(actual)
        return all(_values_match(e, a, tolerance) for e, a in zip(expected, actual, strict=True))
    if isinstance(expected, dict) and isinstance(actual, dict):
        return expected.keys() == actual.keys() and all(
            _values_match(value, actual[key], tolerance) for key, value in expected.items()
        )
    if isinstance(expected, (set, frozenset)) and isinstance(actual, (set, frozenset)):
        return set(expected) == set(actual)
    if type(expected) in (str, bytes, complex) and type(actual) is type(expected):
        return expected == actual
    return False
