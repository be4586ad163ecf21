"""Known-wrong programs for Code-v0's unit-tester reward: mutants of the reference solution.

A unit tester's tests are worth what they can tell apart. A test copied from the statement's
sample is valid, but a program with an off-by-one passes it as well as the right one does. To pay
for tests that catch bugs, Code-v0 keeps, per problem, a few *known-wrong* programs: single-site
mutants of the problem's reference solution (or of the proxy reference, the first coder program
that passed every hidden test, where a dataset has none) that fail at least one hidden test.
:func:`mutant_sources` writes the candidates; :func:`known_wrong_mutants` runs them on the hidden
tests and keeps the hardest to catch.

Mutations (one site each, in source order, from Python's own ``ast``; never ``eval``):

* a comparison flipped at its boundary: ``<`` and ``<=``, ``>`` and ``>=``, ``==`` and ``!=``,
  ``in`` and ``not in``;
* an arithmetic operator swapped: ``+`` and ``-``, ``*`` to ``+``, ``//`` and ``%``;
* an integer constant moved by one: ``n`` to ``n + 1`` and to ``n - 1`` (``n - 1`` only for
  ``n > 0``); ``True`` and ``False`` swapped; a string constant of 2 or more characters without
  its last one;
* a boolean operator swapped: ``and`` and ``or``; a unary minus or ``not`` dropped;
* a name swapped for its twin: ``min`` and ``max``, ``any`` and ``all``;
* a call that only reorders or cleans its argument dropped: ``reversed(x)``, ``sorted(x)``,
  ``abs(x)`` become ``x``; ``x.strip()``, ``x.lower()``, ``x.upper()`` (and ``lstrip``,
  ``rstrip``) become ``x``.

A candidate that fails every hidden test (it crashes, or prints nothing useful) is known-wrong
too, but any test catches it; the candidates that pass the most hidden tests while failing one
are kept first, so a trivial test catches fewer of the kept mutants than tests that exercise the
problem. Selection is deterministic: the same reference and hidden tests give the same mutants.
"""

from __future__ import annotations

import ast
import hashlib
from collections.abc import Callable, Iterator, Sequence

from llm_zoo import safe_ast

__all__ = ["MAX_CANDIDATES", "known_wrong_mutants", "mutant_sources"]

#: Most candidate mutants run on the hidden tests per problem (spread over the program's sites).
MAX_CANDIDATES = 16
#: Problems whose kept mutants are remembered in this process (the selection runs programs).
_CACHE_SIZE = 4096

_COMPARE_SWAPS: dict[type, type] = {
    ast.Lt: ast.LtE,
    ast.LtE: ast.Lt,
    ast.Gt: ast.GtE,
    ast.GtE: ast.Gt,
    ast.Eq: ast.NotEq,
    ast.NotEq: ast.Eq,
    ast.In: ast.NotIn,
    ast.NotIn: ast.In,
}
_BINARY_SWAPS: dict[type, type] = {
    ast.Add: ast.Sub,
    ast.Sub: ast.Add,
    ast.Mult: ast.Add,
    ast.FloorDiv: ast.Mod,
    ast.Mod: ast.FloorDiv,
}
_BOOL_SWAPS: dict[type, type] = {ast.And: ast.Or, ast.Or: ast.And}
_NAME_TWINS = {"min": "max", "max": "min", "any": "all", "all": "any"}
_DROPPED_CALLS = frozenset({"reversed", "sorted", "abs"})
_DROPPED_METHODS = frozenset({"strip", "lstrip", "rstrip", "lower", "upper"})


class _Unwrap(ast.NodeTransformer):
    """Replaces the node at one walk index by its operand (a call's argument, a method's object,
    a unary operation's operand)."""

    def __init__(self, target: ast.AST):
        self.target = target

    def visit(self, node: ast.AST) -> ast.AST:
        if node is self.target:
            if isinstance(node, ast.UnaryOp):
                return node.operand
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                return node.func.value
            if isinstance(node, ast.Call):
                return node.args[0]
        return self.generic_visit(node)


_kept: dict[str, tuple[str, ...]] = {}


def _sites(tree: ast.AST) -> Iterator[tuple[int, Callable[[ast.AST], None]]]:
    """``(node index, mutate)`` for every single-site mutation of ``tree``, in walk order;
    ``mutate`` changes the node of that index in a fresh copy of the tree."""
    for index, node in enumerate(ast.walk(tree)):
        if isinstance(node, ast.Compare):
            for position, op in enumerate(node.ops):
                if type(op) in _COMPARE_SWAPS:

                    def flip(n: ast.AST, position: int = position) -> None:
                        assert isinstance(n, ast.Compare)
                        n.ops[position] = _COMPARE_SWAPS[type(n.ops[position])]()

                    yield index, flip
        elif isinstance(node, ast.BinOp) and type(node.op) in _BINARY_SWAPS:

            def swap(n: ast.AST) -> None:
                assert isinstance(n, ast.BinOp)
                n.op = _BINARY_SWAPS[type(n.op)]()

            yield index, swap
        elif isinstance(node, ast.BoolOp) and type(node.op) in _BOOL_SWAPS:

            def swap_bool(n: ast.AST) -> None:
                assert isinstance(n, ast.BoolOp)
                n.op = _BOOL_SWAPS[type(n.op)]()

            yield index, swap_bool
        elif isinstance(node, ast.Constant) and type(node.value) is int:
            for step in (1, -1) if node.value > 0 else (1,):

                def move(n: ast.AST, step: int = step) -> None:
                    assert isinstance(n, ast.Constant) and isinstance(n.value, int)
                    n.value = n.value + step

                yield index, move
        elif isinstance(node, ast.Constant) and type(node.value) is bool:

            def negate(n: ast.AST) -> None:
                assert isinstance(n, ast.Constant)
                n.value = not n.value

            yield index, negate
        elif isinstance(node, ast.Constant) and type(node.value) is str and len(node.value) >= 2:

            def shorten(n: ast.AST) -> None:
                assert isinstance(n, ast.Constant) and isinstance(n.value, str)
                n.value = n.value[:-1]

            yield index, shorten
        elif isinstance(node, ast.Name) and node.id in _NAME_TWINS:

            def twin(n: ast.AST) -> None:
                assert isinstance(n, ast.Name)
                n.id = _NAME_TWINS[n.id]

            yield index, twin
        elif _unwrappable(node):
            yield index, _UNWRAP


def _unwrappable(node: ast.AST) -> bool:
    if isinstance(node, ast.UnaryOp):
        return isinstance(node.op, (ast.USub, ast.Not))
    if not isinstance(node, ast.Call) or node.keywords:
        return False
    if isinstance(node.func, ast.Name):
        return node.func.id in _DROPPED_CALLS and len(node.args) == 1
    return isinstance(node.func, ast.Attribute) and node.func.attr in _DROPPED_METHODS and not node.args


# marks a site whose node is replaced by its operand (done by _Unwrap on the whole tree)
_UNWRAP: Callable[[ast.AST], None] = lambda node: None  # noqa: E731


def mutant_sources(reference: str, limit: int = MAX_CANDIDATES) -> list[str]:
    """At most ``limit`` single-site mutants of ``reference``, spread evenly over its mutation
    sites, each different from the reference and from the others. ``[]`` for a source that does
    not parse."""
    try:
        tree = safe_ast.parse(reference)
        original = ast.unparse(tree)
    except (SyntaxError, ValueError, RecursionError):
        return []
    sites = list(_sites(tree))
    if len(sites) > limit:  # evenly spread, so a long program's last lines get mutants too
        sites = [sites[i * len(sites) // limit] for i in range(limit)]
    sources: list[str] = []
    for index, mutate in sites:
        copy: ast.AST = safe_ast.parse(reference)
        node = next(n for i, n in enumerate(ast.walk(copy)) if i == index)
        if mutate is _UNWRAP:
            copy = _Unwrap(node).visit(copy)
        else:
            mutate(node)
        try:
            source = ast.unparse(copy)
        except (ValueError, RecursionError):
            continue
        if source != original and source not in sources:
            sources.append(source)
    return sources


def known_wrong_mutants(
    reference: str,
    hidden_passes: Callable[[str], Sequence[bool] | None],
    count: int,
    *,
    key: str,
) -> tuple[str, ...]:
    """Up to ``count`` mutants of ``reference`` that fail at least one hidden test, those that
    pass the most hidden tests first (ties in source order).

    Args:
        reference: A program that passes every hidden test.
        hidden_passes: Runs a program on the hidden tests: whether it passed each, or ``None``
            for a program not to keep (one that timed out).
        count: How many to keep (0 keeps none and runs nothing).
        key: What else decides the verdicts (the hidden tests, the judge's limits); with the
            reference it keys a cache, so a problem's mutants are selected once per process.
    """
    if count <= 0:
        return ()
    digest = hashlib.sha256(f"{count}\0{key}\0{reference}".encode("utf-8", "surrogatepass")).hexdigest()
    if digest in _kept:
        return _kept[digest]
    ranked: list[tuple[int, int, str]] = []
    for order, source in enumerate(mutant_sources(reference)):
        verdicts = hidden_passes(source)
        passes = list(verdicts) if verdicts is not None else []
        if passes and not all(passes):
            ranked.append((-sum(passes), order, source))
    kept = tuple(source for _, _, source in sorted(ranked)[:count])
    if len(_kept) >= _CACHE_SIZE:
        _kept.pop(next(iter(_kept)))
    _kept[digest] = kept
    return kept
