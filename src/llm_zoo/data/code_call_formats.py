"""HumanEval and MBPP records for ``Code-v0``: their assert-based tests become call-based tests,
and what cannot become one runs as a check.

Both datasets test a solution with Python ``assert`` statements. Each assert of the forms below is
**converted** into one call-based test (arguments, expected value), compared in the host process
by :func:`llm_zoo.checkers.call_harness.values_match`: only the arguments enter the sandbox.

Accepted assert forms (``f`` is the tested function: HumanEval's ``candidate``, MBPP's function):

* ``f(args) == expected`` (either side), ``f(args) is expected``; ``tuple(...)`` / ``list(...)``
  around either side is dropped (lists and tuples compare equal);
* ``abs(f(args) - expected) < tol`` (or ``<=``), ``math.isclose(f(args), expected, ...)``: compared
  with the harness's tolerance (1e-6, absolute or relative), when ``tol`` (or ``rel_tol`` /
  ``abs_tol``) is within it;
* ``f(args)`` (expected ``True``) and ``not f(args)`` (expected ``False``);
* ``assert True`` and bare names / strings are ignored.

Arguments and expected values must be *static*: literals, arithmetic on them, names bound by
earlier simple assignments in ``check``, ``for`` loops over static ranges (unrolled), and a few
pure builtins (``len``, ``sum``, ``sorted``, ``range``, ``list``, ``str``, ...) and comprehensions,
evaluated here by a small interpreter with size limits (never ``eval``).

Statements that do not fit (random inputs, helper functions from the prompt, order-free
``set(...)`` comparisons, tolerances looser than the judge's, imports; counted in
``metadata["unconverted_statements"]``) are **run as a check** instead: the problem keeps the
converted tests and gets the hidden test :data:`~llm_zoo.data.code_problem.CHECK_TEST`, which runs
test source in a sandbox process of its own that calls the candidate's code in another one (see
:mod:`llm_zoo.checkers.call_checker`; the test source never shares a process with the model's code):

* HumanEval: the prompt (its helpers, such as ``poly`` or ``encode_cyclic``) and the record's whole
  ``test``, so ``check(candidate)`` runs as the dataset wrote it. Of the 164 problems, 159 are
  fixed calls only; HumanEval/32 (any root of a random polynomial), /38 and /50 (random strings
  through the prompt's encoders) are checked only, /33 and /53 both;
* MBPP: ``test_imports`` and the asserts that did not convert, in a ``check``; the function's name
  is bound to the candidate.

MBPP records with ``test_setup_code`` are skipped with a :class:`UserWarning` (their setup builds
objects, which cannot cross between processes as plain values).
"""

from __future__ import annotations

import ast
import warnings
from collections.abc import Callable, Mapping
from typing import Any

from llm_zoo import safe_ast
from llm_zoo.checkers.call_harness import TOLERANCE
from llm_zoo.data.code_problem import (
    CHECK_TEST,
    CallSpec,
    CodeDatasetError,
    CodeProblem,
    TestCase,
    call_test,
    field_value,
)

__all__ = ["convert_asserts", "from_humaneval", "from_mbpp", "static_value"]

_MAX_ITEMS = 100_000  # longest sequence a static expression may build
_MAX_STEPS = 2_000_000  # evaluation budget per problem
_MAX_LOOP = 1_000  # iterations of an unrolled ``for`` loop

_PURE: dict[str, Callable[..., Any]] = {
    "abs": abs, "bool": bool, "float": float, "int": int, "len": len, "list": list, "max": max,
    "min": min, "range": range, "round": round, "set": set, "sorted": sorted, "str": str,
    "sum": sum, "tuple": tuple, "dict": dict, "reversed": lambda x: list(reversed(x)),
}  # fmt: skip
_BINARY = {
    ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b, ast.Mult: lambda a, b: a * b,
    ast.Div: lambda a, b: a / b, ast.FloorDiv: lambda a, b: a // b, ast.Mod: lambda a, b: a % b,
    ast.Pow: lambda a, b: a**b,
}  # fmt: skip
_COMPARE = {
    ast.Eq: lambda a, b: a == b, ast.NotEq: lambda a, b: a != b, ast.Lt: lambda a, b: a < b,
    ast.LtE: lambda a, b: a <= b, ast.Gt: lambda a, b: a > b, ast.GtE: lambda a, b: a >= b,
    ast.In: lambda a, b: a in b, ast.NotIn: lambda a, b: a not in b,
}  # fmt: skip
_UNARY = {ast.USub: lambda a: -a, ast.UAdd: lambda a: +a, ast.Not: lambda a: not a, ast.Invert: lambda a: ~a}


def _tolerant(expected: Any) -> Any:
    """An expected number of a tolerance assert as a float: the judges compare an expected int
    exactly, but ``abs(f(x) - 2) < 1e-6`` accepts ``2.0000001``."""
    return float(expected) if isinstance(expected, int) and not isinstance(expected, bool) else expected


class _Unconvertible(Exception):
    """A statement or expression outside the static subset."""


class _Evaluator:
    """Evaluates the static subset of Python expressions (see the module docstring)."""

    def __init__(self) -> None:
        self.steps = 0

    def __call__(self, node: ast.AST, env: Mapping[str, Any]) -> Any:
        self.steps += 1
        if self.steps > _MAX_STEPS:
            raise _Unconvertible("evaluation budget exceeded")
        method = getattr(self, f"_{type(node).__name__}", None)
        if method is None:
            raise _Unconvertible(f"{type(node).__name__} is not static")
        value = method(node, env)
        if isinstance(value, (str, bytes, list, tuple, set, dict)) and len(value) > _MAX_ITEMS:
            raise _Unconvertible("value too large")
        if isinstance(value, range):
            value = list(value) if len(value) <= _MAX_ITEMS else self._fail("range too long")
        return value

    @staticmethod
    def _fail(reason: str) -> Any:
        raise _Unconvertible(reason)

    def _Constant(self, node: ast.Constant, env: Mapping[str, Any]) -> Any:
        if node.value is Ellipsis:
            raise _Unconvertible("...")
        return node.value

    def _Name(self, node: ast.Name, env: Mapping[str, Any]) -> Any:
        if node.id in env:
            return env[node.id]
        if node.id in ("True", "False", "None"):
            return {"True": True, "False": False, "None": None}[node.id]
        raise _Unconvertible(f"name {node.id!r} is not static")

    def _List(self, node: ast.List, env: Mapping[str, Any]) -> list:
        if any(isinstance(e, ast.Starred) for e in node.elts):
            raise _Unconvertible("starred")
        return [self(e, env) for e in node.elts]

    def _Tuple(self, node: ast.Tuple, env: Mapping[str, Any]) -> tuple:
        return tuple(self._List(node, env))  # type: ignore[arg-type]

    def _Set(self, node: ast.Set, env: Mapping[str, Any]) -> set:
        return set(self._List(node, env))  # type: ignore[arg-type]

    def _Dict(self, node: ast.Dict, env: Mapping[str, Any]) -> dict:
        if any(key is None for key in node.keys):
            raise _Unconvertible("** in a dict")
        return {self(k, env): self(v, env) for k, v in zip(node.keys, node.values, strict=True)}  # type: ignore[arg-type]

    def _UnaryOp(self, node: ast.UnaryOp, env: Mapping[str, Any]) -> Any:
        return self._apply(_UNARY, node.op, self(node.operand, env))

    def _BinOp(self, node: ast.BinOp, env: Mapping[str, Any]) -> Any:
        left, right = self(node.left, env), self(node.right, env)
        if isinstance(node.op, ast.Pow) and isinstance(right, (int, float)) and abs(right) > 10_000:
            raise _Unconvertible("exponent too large")
        if isinstance(node.op, ast.Mult):
            for seq, count in ((left, right), (right, left)):
                sized = isinstance(seq, (str, bytes, list, tuple)) and isinstance(count, int)
                if sized and len(seq) * count > _MAX_ITEMS:
                    raise _Unconvertible("value too large")
        return self._apply(_BINARY, node.op, left, right)

    def _BoolOp(self, node: ast.BoolOp, env: Mapping[str, Any]) -> Any:
        value: Any = None
        for operand in node.values:
            value = self(operand, env)
            if (isinstance(node.op, ast.And) and not value) or (isinstance(node.op, ast.Or) and value):
                return value
        return value

    def _Compare(self, node: ast.Compare, env: Mapping[str, Any]) -> bool:
        left = self(node.left, env)
        for op, comparator in zip(node.ops, node.comparators, strict=True):
            right = self(comparator, env)
            if not self._apply(_COMPARE, op, left, right):
                return False
            left = right
        return True

    def _Subscript(self, node: ast.Subscript, env: Mapping[str, Any]) -> Any:
        value = self(node.value, env)
        if isinstance(node.slice, ast.Slice):
            parts = [
                None if p is None else self(p, env)
                for p in (node.slice.lower, node.slice.upper, node.slice.step)
            ]
            return self._guard(lambda: value[slice(*parts)])
        index = self(node.slice, env)
        return self._guard(lambda: value[index])

    def _Call(self, node: ast.Call, env: Mapping[str, Any]) -> Any:
        if not isinstance(node.func, ast.Name) or node.func.id not in _PURE or node.func.id in env:
            raise _Unconvertible(f"call of {ast.unparse(node.func)!r}")
        if node.keywords or any(isinstance(a, ast.Starred) for a in node.args):
            raise _Unconvertible("keyword or starred arguments")
        args = [self(a, env) for a in node.args]
        function = _PURE[node.func.id]
        return self._guard(lambda: function(*args))

    def _comprehension(self, node: Any, env: Mapping[str, Any]) -> list:
        results: list = []

        def walk(generators: list[ast.comprehension], scope: dict[str, Any]) -> None:
            if not generators:
                results.append(self(node.elt, scope))
                if len(results) > _MAX_ITEMS:
                    raise _Unconvertible("comprehension too large")
                return
            first, rest = generators[0], generators[1:]
            if first.is_async:
                raise _Unconvertible("async comprehension")
            for item in self(first.iter, scope):
                inner = dict(scope)
                bind(first.target, item, inner)
                if all(self(condition, inner) for condition in first.ifs):
                    walk(rest, inner)

        walk(list(node.generators), dict(env))
        return results

    _ListComp = _comprehension
    _GeneratorExp = _comprehension

    def _SetComp(self, node: ast.SetComp, env: Mapping[str, Any]) -> set:
        return set(self._comprehension(node, env))

    def _apply(self, table: Mapping[Any, Callable[..., Any]], op: ast.AST, *args: Any) -> Any:
        if type(op) not in table:
            raise _Unconvertible(f"operator {type(op).__name__}")
        return self._guard(lambda: table[type(op)](*args))

    @staticmethod
    def _guard(compute: Callable[[], Any]) -> Any:
        try:
            return compute()
        except (ArithmeticError, TypeError, ValueError, IndexError, KeyError, MemoryError) as err:
            raise _Unconvertible(f"{type(err).__name__}: {err}") from None


def bind(target: ast.AST, value: Any, scope: dict[str, Any]) -> None:
    """Bind a ``for`` / assignment target (a name or a tuple of names) in ``scope``."""
    if isinstance(target, ast.Name):
        scope[target.id] = value
    elif isinstance(target, (ast.Tuple, ast.List)):
        items = list(value)
        if len(items) != len(target.elts):
            raise _Unconvertible("unpacking mismatch")
        for sub, item in zip(target.elts, items, strict=True):
            bind(sub, item, scope)
    else:
        raise _Unconvertible("assignment target")


def static_value(source: str, env: Mapping[str, Any] | None = None) -> Any:
    """Evaluate one static expression (see the module docstring); ``ValueError`` if it is not one."""
    try:
        return _Evaluator()(safe_ast.parse(source, mode="eval").body, env or {})
    except (_Unconvertible, SyntaxError) as err:
        raise ValueError(f"not a static expression: {err}") from None


def _unwrap(node: ast.AST) -> ast.AST:
    """Drop ``tuple(...)`` / ``list(...)`` around a value (lists and tuples compare equal)."""
    while (
        isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("tuple", "list")
        and len(node.args) == 1 and not node.keywords
    ):  # fmt: skip
        node = node.args[0]
    return node


class _Converter:
    """Turns the asserts of one test body into call-based tests."""

    def __init__(self, function: str):
        self.function = function
        self.evaluate = _Evaluator()
        self.tests: list[TestCase] = []
        self.unconverted: list[ast.stmt] = []

    def is_call(self, node: ast.AST) -> bool:
        node = _unwrap(node)
        return (
            isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == self.function
        )

    def add(self, call: ast.AST, expected: Any, env: Mapping[str, Any]) -> None:
        call = _unwrap(call)
        assert isinstance(call, ast.Call)
        if call.keywords or any(isinstance(a, ast.Starred) for a in call.args):
            raise _Unconvertible("keyword arguments in the call")
        args = [self.evaluate(a, env) for a in call.args]
        try:
            self.tests.append(call_test(args, expected))
        except CodeDatasetError as err:
            raise _Unconvertible(str(err)) from None

    def assertion(self, test: ast.AST, env: Mapping[str, Any]) -> None:
        if isinstance(test, ast.Constant) and test.value is True:
            return
        if self.is_call(test):
            return self.add(test, True, env)
        if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not) and self.is_call(test.operand):
            return self.add(test.operand, False, env)
        if isinstance(test, ast.Compare) and len(test.ops) == 1:
            left, right, op = test.left, test.comparators[0], test.ops[0]
            if isinstance(op, (ast.Eq, ast.Is)):
                if self.is_call(left) and not self.is_call(right):
                    return self.add(left, self.evaluate(_unwrap(right), env), env)
                if self.is_call(right) and not self.is_call(left):
                    return self.add(right, self.evaluate(_unwrap(left), env), env)
            if isinstance(op, (ast.Lt, ast.LtE)) and self._tolerance_form(left, right, env):
                return None
        isclose = isinstance(test, ast.Call) and ast.unparse(test.func) in ("math.isclose", "isclose")
        if isclose and isinstance(test, ast.Call) and len(test.args) == 2 and self.is_call(test.args[0]):
            self._within_judge_tolerance([self.evaluate(k.value, env) for k in test.keywords])
            return self.add(test.args[0], _tolerant(self.evaluate(test.args[1], env)), env)
        raise _Unconvertible(f"assert {ast.unparse(test)[:60]}")

    def _within_judge_tolerance(self, tolerances: list[Any]) -> None:
        """An assert that accepts more than the judge's tolerance would fail right answers: drop it."""
        for tolerance in tolerances:
            if not isinstance(tolerance, (int, float)) or tolerance > TOLERANCE:
                raise _Unconvertible(f"tolerance {tolerance!r} looser than the judge's {TOLERANCE}")

    def _tolerance_form(self, node: ast.AST, limit: ast.AST, env: Mapping[str, Any]) -> bool:
        """``abs(f(args) - expected) < limit`` (or ``expected - f(args)``): add the test, if the
        limit is within the judge's tolerance."""
        if not (isinstance(node, ast.Call) and ast.unparse(node.func) in ("abs", "math.fabs")):
            return False
        inner = node.args[0] if len(node.args) == 1 else None
        if not (isinstance(inner, ast.BinOp) and isinstance(inner.op, ast.Sub)):
            return False
        if self.is_call(inner.left) or self.is_call(inner.right):
            self._within_judge_tolerance([self.evaluate(limit, env)])
        if self.is_call(inner.left):
            self.add(inner.left, _tolerant(self.evaluate(inner.right, env)), env)
        elif self.is_call(inner.right):
            self.add(inner.right, _tolerant(self.evaluate(inner.left, env)), env)
        else:
            return False
        return True

    def statements(self, body: list[ast.stmt], env: dict[str, Any]) -> None:
        for statement in body:
            try:
                self.statement(statement, env)
            except _Unconvertible:
                self.unconverted.append(statement)

    def statement(self, node: ast.stmt, env: dict[str, Any]) -> None:
        if isinstance(node, ast.Assert):
            self.assertion(node.test, env)
        elif isinstance(node, (ast.Pass, ast.Expr)) and (
            isinstance(node, ast.Pass) or isinstance(node.value, (ast.Constant, ast.Name))
        ):
            return  # docstrings, comments-as-strings, a bare `print`
        elif isinstance(node, ast.Assign) and len(node.targets) == 1:
            bind(node.targets[0], self.evaluate(node.value, env), env)
        elif isinstance(node, ast.For) and not node.orelse:
            items = self.evaluate(node.iter, env)
            if len(items) > _MAX_LOOP:
                raise _Unconvertible("loop too long")
            kept = len(self.tests)
            try:  # all iterations or none: a loop is one statement
                for item in items:
                    bind(node.target, item, env)
                    for inner in node.body:
                        self.statement(inner, env)
            except _Unconvertible:
                del self.tests[kept:]
                raise
        else:
            raise _Unconvertible(type(node).__name__)


def convert_asserts(statements: list[ast.stmt], function: str) -> tuple[list[TestCase], list[ast.stmt]]:
    """Call-based tests from assert statements about ``function``, and the statements that could
    not be converted (see the module docstring)."""
    converter = _Converter(function)
    converter.statements(statements, {})
    return converter.tests, converter.unconverted


def _parse(source: str, what: str) -> ast.Module:
    try:
        return safe_ast.parse(source)
    except SyntaxError as err:
        raise CodeDatasetError(f"{what} is not valid Python ({err.msg}, line {err.lineno})") from None


def _skipped(problem_id: str, reason: str) -> None:
    warnings.warn(f"{problem_id}: {reason}; the problem is skipped", UserWarning, stacklevel=4)


def from_humaneval(record: Mapping[str, Any]) -> CodeProblem:
    """A HumanEval record (``task_id``, ``prompt``, ``canonical_solution``, ``entry_point``,
    ``test``): converted tests, and a check running the whole ``test`` if any statement of
    ``check`` does not convert."""
    task_id = str(field_value(record, "task_id", (str, int)))
    prompt = field_value(record, "prompt")
    entry_point = field_value(record, "entry_point")
    test_source = field_value(record, "test")
    test_module = _parse(test_source, "field 'test'")
    check = next((n for n in test_module.body if isinstance(n, ast.FunctionDef) and n.name == "check"), None)
    if check is None or len(check.args.args) != 1:
        raise CodeDatasetError("field 'test' should define check(candidate)")
    tests, unconverted = convert_asserts(check.body, check.args.args[0].arg)
    checker = f"{prompt.rstrip()}\n\n\n{test_source.strip()}\n" if unconverted else None
    _parse(checker or "", "the prompt with the field 'test'")
    canonical = record.get("canonical_solution")
    return CodeProblem(
        id=task_id if task_id.lower().startswith("humaneval") else f"humaneval/{task_id}",
        statement=f"Complete the Python function `{entry_point}` described by the signature and docstring below.",
        tests=tuple(tests) + ((CHECK_TEST,) if checker else ()),
        reference=prompt + canonical if isinstance(canonical, str) else None,
        source="humaneval",
        title=entry_point,
        metadata={"unconverted_statements": len(unconverted)},
        call=CallSpec(entry_point, None, prompt.rstrip(), checker=checker),
    )


def _signature(code: str, name: str) -> str:
    for node in _parse(code, "field 'code'").body:
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return f"def {name}({ast.unparse(node.args)}):"
    raise CodeDatasetError(f"the reference code defines no function {name!r}")


def from_mbpp(record: Mapping[str, Any]) -> CodeProblem | None:
    """An MBPP record (``task_id``, ``text`` or ``prompt``, ``code``, ``test_list``, optional
    ``test_imports``); the tested function is the one the first assert calls. Asserts that do not
    convert run as a check. ``None`` (with a warning) if the record needs ``test_setup_code``."""
    task_id = field_value(record, "task_id", (int, str))
    text = record.get("text") or record.get("prompt")
    if not isinstance(text, str) or not text:
        raise CodeDatasetError("missing field 'text' (or 'prompt')")
    code = field_value(record, "code")
    assertions = field_value(record, "test_list", list)
    if not assertions or not all(isinstance(a, str) for a in assertions):
        raise CodeDatasetError("field 'test_list' should be a non-empty list of assert statements")
    imports = record.get("test_imports") or []
    if not isinstance(imports, list) or not all(isinstance(line, str) for line in imports):
        raise CodeDatasetError("field 'test_imports' should be a list of import statements")
    problem_id = f"mbpp/{task_id}"
    if (record.get("test_setup_code") or "").strip():
        _skipped(problem_id, "it needs test_setup_code")
        return None
    statements = _parse("\n".join(assertions), "field 'test_list'").body
    defined = {n.name for n in _parse(code, "field 'code'").body if isinstance(n, ast.FunctionDef)}
    called = [
        n.func.id
        for n in ast.walk(statements[0])
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in defined
    ]
    if not called:
        raise CodeDatasetError("the first assert calls no function that the field 'code' defines")
    name = called[0]
    tests, unconverted = convert_asserts(statements, name)
    checker = None
    if unconverted:
        body = "\n".join("    " + line for n in unconverted for line in ast.unparse(n).splitlines())
        header = "\n".join(imports) + "\n\n\n" if imports else ""
        checker = f"{header}def check(candidate):\n{body}\n"
        _parse(checker, "field 'test_imports' with the asserts")
    return CodeProblem(
        id=problem_id,
        statement=text.strip(),
        tests=tuple(tests) + ((CHECK_TEST,) if checker else ()),
        reference=code,
        source="mbpp",
        title=name,
        metadata={"unconverted_statements": len(unconverted)},
        call=CallSpec(name, None, _signature(code, name), checker=checker),
    )
