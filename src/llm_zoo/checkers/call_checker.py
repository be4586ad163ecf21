"""Call-based tests that are code: a dataset's ``check(candidate)`` run in the sandbox, in a
process of its own, with the candidate's calls relayed to another process.

Most call-based tests are fixed calls (arguments -> expected value, compared in the host; see
:mod:`llm_zoo.checkers.call_harness`). Some are not: HumanEval/32 accepts any root of a random polynomial
(checked with the prompt's ``poly``), /38 and /50 decode random strings made by the prompt's
encoders, MBPP compares ``set(f(x)) == set(y)`` or within a tolerance looser than the judge's. For
these the problem carries the *test source* (:attr:`llm_zoo.data.code.CallSpec.checker`), Python
that defines ``check(candidate)``, and one hidden test whose input is :data:`CHECK_INPUT`: "run
the check".

The test source must never be readable by the candidate's code (an env is a reinforcement
learning target: a program that could read the checker's frames, file or expected values would
learn to). So they never share a process. Two kinds of sandbox run, each in a fresh process:

* the *checker* (:func:`checker_program`): the test source (and, for HumanEval, the prompt's
  helpers), with ``candidate`` and the tested function's name bound to a proxy. It never holds the
  candidate's code. Its standard input (:func:`checker_stdin`) holds the calls answered so far:
  arguments, and the return value or the candidate's failure;
* the *candidate*: the model's code in the call harness, in batch mode
  (:func:`llm_zoo.checkers.call_harness.batch_stdin`): only arguments go in, only return values come out.

The host relays between them in rounds (:class:`llm_zoo.envs.code_judge.CallJudge`):

1. it runs the checker. The proxy returns the known answers while the calls match them. At the
   first call it has no answer for, it records the arguments, returns a placeholder and the run
   turns *speculative*: later calls are recorded too and assertions that fail or raise are ignored
   (:func:`speculative_source` rewrites the test source's ``assert`` statements for this), so
   one round collects every call whose arguments do not depend on earlier return values;
2. it runs the candidate on the recorded calls (one process, in order, as HumanEval's own
   harness makes them);
3. it repeats with the new answers. The verdict comes from a checker run that made no
   speculative call: ``check`` returned (pass) or raised (fail: a failed assertion, an error, or a
   call the candidate failed: crash, time-out or a return value that is not plain, which the proxy
   raises as an error the test cannot catch).

A check whose calls never depend on return values (all of HumanEval's and MBPP's) takes two
checker runs and one candidate run. Bounds per verdict: :data:`MAX_CHECK_CALLS` calls,
:data:`MAX_CHECK_ROUNDS` rounds, no new round after :data:`CHECK_TIME_FACTOR` times the env's
per-run time limit; each run is under the env's time and memory limits. The
checker's ``random`` is seeded with :data:`CHECK_SEED`, so every round replays the same calls
(the sandbox reseeds ``random`` per run otherwise). Values cross between the processes as plain
values (None, bool, int, float, str, bytes, list, tuple, set, dict): the host reads the checker's
reports with ``ast.literal_eval`` and sends answers as ``marshal`` data, never ``pickle``. So the
check sees copies: changes the candidate makes to its arguments in place do not reach it, and a
check that passes objects (or keyword arguments) to the candidate fails with a message saying so.
"""

from __future__ import annotations

import ast
import binascii
import dataclasses
import functools
import marshal
from typing import Any

from llm_zoo import safe_ast
from llm_zoo.checkers.call_harness import PRELUDE, literal, literal_writer_source, small_index

__all__ = [
    "CHECK_INPUT",
    "CHECK_SEED",
    "CHECK_TIME_FACTOR",
    "MAX_CHECK_CALLS",
    "MAX_CHECK_ROUNDS",
    "REPORT_MARKER",
    "CheckerReport",
    "checker_program",
    "checker_stdin",
    "read_checker_report",
    "speculative_source",
]

#: The input of the hidden test that runs a problem's check (not a literal list, so it never
#: equals a generated test's arguments).
CHECK_INPUT = "check(candidate)"

#: Most calls of the candidate one verdict may take.
MAX_CHECK_CALLS = 10_000

#: Most checker runs one verdict may take.
MAX_CHECK_ROUNDS = 12

#: A verdict starts no new round after this many times the per-run time limit.
CHECK_TIME_FACTOR = 4

#: Seed of the checker's ``random`` module.
CHECK_SEED = 0

#: Prefix of the checker's report lines on standard output.
REPORT_MARKER = "@@llm_zoo_check@@ "

_HELD = "__llm_zoo_held__"
_SPECULATING = "__llm_zoo_speculating__"

_CHECKER = """\
import binascii, io, marshal, math, random, sys

SOURCE = {source!r}
NAME = {name!r}
PRELUDE = {prelude!r}
MAX_CALLS = {max_calls!r}
MARK = {marker!r}
report_stream, sys.stdout = sys.stdout, sys.stderr  # the test's own prints go to stderr


{literal_writer}

def emit(kind, text=""):
    report_stream.write(MARK + kind + " " + text + "\\n")
    report_stream.flush()


class Stop(BaseException):
    \"\"\"Ends a speculative run.\"\"\"


class CandidateFailed(BaseException):
    \"\"\"The candidate failed a call of the check (not catchable by the check's own handlers).\"\"\"


class Pending:
    \"\"\"Stands in for a return value not known yet: absorbs common operations, so that a
    speculative run goes on to record later calls.\"\"\"

    def __repr__(self):
        return "<return value not known yet>"

    def __iter__(self):
        return iter(())

    def __len__(self):
        return 0

    def __float__(self):
        return 0.0

    def __int__(self):
        return 0

    __index__ = __int__

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return self

    def absorb(self, *args, **kwargs):
        return self


for _name in ("add radd sub rsub mul rmul truediv rtruediv floordiv rfloordiv mod rmod pow rpow "
              "neg pos abs getitem call and rand or ror xor rxor").split():
    setattr(Pending, "__" + _name + "__", Pending.absorb)
PENDING = Pending()
state = {{"calls": 0, "speculating": False, "failed": None, "stopped": False}}
known = marshal.loads(binascii.a2b_base64(sys.stdin.read()))
sys.stdin = io.StringIO("")


def plain(value, depth=0):
    if depth > 100:
        return False
    if value is None or isinstance(value, (bool, int, float, str, bytes)):
        return True
    if isinstance(value, (list, tuple, set, frozenset)):
        return all(plain(item, depth + 1) for item in value)
    if isinstance(value, dict):
        return all(plain(k, depth + 1) and plain(v, depth + 1) for k, v in value.items())
    return False


def same(a, b):
    if type(a) is not type(b):
        return False
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(v, b[k]) for k, v in a.items())
    return a == b or repr(a) == repr(b)


def candidate(*args, **kwargs):
    if kwargs:
        raise TypeError("the candidate takes positional arguments only")
    args = list(args)
    if not plain(args):
        if state["speculating"]:
            state["stopped"] = True
            raise Stop
        raise TypeError(
            "the check called the candidate with a value that is not plain "
            "(None, bool, int, float, str, bytes, list, tuple, set, dict)"
        )
    index = state["calls"]
    if index >= MAX_CALLS:
        emit("limit")
        state["stopped"] = True
        raise Stop
    state["calls"] = index + 1
    emit("call", literal_text(args))
    if not state["speculating"]:
        if index < len(known) and same(known[index][0], args):
            _, ok, value = known[index]
            if ok:
                return value
            state["failed"] = value
            raise CandidateFailed(value)
        state["speculating"] = True
        emit("unknown", str(index))
    return PENDING


def main():
    random.seed({seed!r})
    namespace = {{"__name__": "checker", "__builtins__": __builtins__}}
    namespace[{speculating!r}] = lambda: state["speculating"]
    try:
        exec(PRELUDE, namespace)
        exec(compile(SOURCE, "check.py", "exec"), namespace)
        check = namespace.get("check")
        if not callable(check):
            emit("error", repr("the test source defines no check(candidate)"))
            return
        namespace[NAME] = candidate
        check(candidate)
    except Stop:
        pass
    except CandidateFailed:
        pass
    except BaseException as error:
        if not state["speculating"] and state["failed"] is None:
            emit("fail", repr((type(error).__name__ + ": " + str(error))[:300]))
            return
    if state["failed"] is not None:
        emit("fail", repr(state["failed"]))
    else:
        emit("stopped" if state["speculating"] or state["stopped"] else "pass")


main()
"""


class _SpeculativeAsserts(ast.NodeTransformer):
    """``assert test, msg`` -> the same check, ignored while the run is speculative."""

    def visit_Assert(self, node: ast.Assert) -> list[ast.stmt]:
        speculating = ast.Call(ast.Name(_SPECULATING, ast.Load()), [], [])
        held = ast.Name(_HELD, ast.Store())
        guarded = ast.Try(
            body=[ast.Assign([held], node.test)],
            handlers=[
                ast.ExceptHandler(
                    ast.Name("Exception", ast.Load()),
                    None,
                    [ast.If(speculating, [ast.Assign([held], ast.Constant(True))], [ast.Raise()])],
                )
            ],
            orelse=[],
            finalbody=[],
        )
        failed = ast.BoolOp(
            ast.And(),
            [ast.UnaryOp(ast.Not(), speculating), ast.UnaryOp(ast.Not(), ast.Name(_HELD, ast.Load()))],
        )
        error = ast.Call(ast.Name("AssertionError", ast.Load()), [node.msg] if node.msg else [], [])
        statements: list[ast.stmt] = [guarded, ast.If(failed, [ast.Raise(error)], [])]
        for statement in statements:
            ast.copy_location(statement, node)
        return statements


@functools.lru_cache(maxsize=64)
def speculative_source(source: str) -> str:
    """``source`` with each ``assert`` rewritten so that, while the checker run is speculative, a
    failing or raising assertion is ignored (otherwise it fails as before); ``ValueError`` if the
    source is not valid Python."""
    try:
        tree = safe_ast.parse(source)
    except SyntaxError as err:
        raise ValueError(f"the test source is not valid Python ({err.msg}, line {err.lineno})") from None
    return ast.unparse(ast.fix_missing_locations(_SpeculativeAsserts().visit(tree)))


@functools.lru_cache(maxsize=64)
def checker_program(source: str, name: str) -> str:
    """The checker program for the test source ``source`` (defining ``check(candidate)``) of a
    function called ``name``. It holds no code of the candidate's."""
    return _CHECKER.format(
        source=speculative_source(source), name=name, prelude=PRELUDE, max_calls=MAX_CHECK_CALLS,
        marker=REPORT_MARKER, literal_writer=literal_writer_source(), seed=CHECK_SEED,
        speculating=_SPECULATING,
    )  # fmt: skip


def checker_stdin(answers: list[tuple[str, bool, Any]]) -> str:
    """The checker's standard input: the calls answered so far, in order, each ``(arguments as
    stored, True, return value)`` or ``(arguments, False, why the candidate failed)``."""
    payload = [(literal(args), ok, value) for args, ok, value in answers]
    return binascii.b2a_base64(marshal.dumps(payload, 2)).decode("ascii")


@dataclasses.dataclass(frozen=True)
class CheckerReport:
    """What one checker run reported.

    Attributes:
        calls: The arguments of each call it made, in order (Python literal lists).
        unknown_from: Index of the first call it had no answer for (the run was speculative from
            there on); ``None`` if it had an answer for every call.
        outcome: ``"pass"``, ``"fail"``, ``"stopped"`` (speculative run ended), ``"limit"`` (more
            than :data:`MAX_CHECK_CALLS` calls), ``"error"`` (the test source defines no check), or
            ``None`` (the run ended without a report: crash, time-out).
        message: Why it failed (``"fail"`` / ``"error"``).
    """

    calls: tuple[str, ...]
    unknown_from: int | None
    outcome: str | None
    message: str = ""


def read_checker_report(stdout: str) -> CheckerReport:
    """Parse a checker run's standard output (its report lines; anything else is ignored)."""
    calls: list[str] = []
    unknown_from: int | None = None
    outcome: str | None = None
    message = ""
    for line in stdout.splitlines():
        if not line.startswith(REPORT_MARKER):
            continue
        kind, _, text = line[len(REPORT_MARKER) :].partition(" ")
        if kind == "call":
            calls.append(text)
        elif kind == "unknown" and unknown_from is None and small_index(text) is not None:
            unknown_from = small_index(text)
        elif kind == "limit":
            outcome = "limit"
        elif kind in ("pass", "fail", "stopped", "error") and outcome != "limit":
            outcome = kind
            if kind in ("fail", "error"):
                try:
                    message = str(literal(text))
                except ValueError:
                    message = text
    return CheckerReport(tuple(calls), unknown_from, outcome, message)
