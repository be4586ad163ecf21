"""Building ASTs from several threads: CPython 3.11 shares one depth counter between threads, so
concurrent ``ast.parse`` calls fail with ``SystemError: AST constructor recursion depth mismatch``
(an env server hit it in 1 of 8 Code-v0 makes beside other clients' Plan-Path steps)."""

from __future__ import annotations

import ast
import re
import threading
import time
from pathlib import Path

import pytest

from llm_zoo import safe_ast

SRC = Path(__file__).resolve().parent.parent / "src" / "llm_zoo"


def test_trees_are_built_one_thread_at_a_time(monkeypatch):
    building = 0
    most = 0
    guard = threading.Lock()
    real_parse = ast.parse

    def slow_parse(*args, **kwargs):
        nonlocal building, most
        with guard:
            building += 1
            most = max(most, building)
        time.sleep(0.01)  # long enough for every other thread to try to enter
        try:
            return real_parse(*args, **kwargs)
        finally:
            with guard:
                building -= 1

    monkeypatch.setattr(ast, "parse", slow_parse)
    results: list = []

    def work(index: int) -> None:
        results.append(safe_ast.literal_eval(f"[{index}, ({index}, 'x')]"))
        results.append(type(safe_ast.parse(f"def f{index}(): return {index}")))

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert most == 1
    assert sorted(r for r in results if isinstance(r, list)) == [[i, (i, "x")] for i in range(8)]
    assert results.count(ast.Module) == 8


def test_literal_eval_behaves_as_the_standard_one():
    assert safe_ast.literal_eval("  \t[1, -2.5, 'a', (None, True), {'k': b'v'}]") == [
        1, -2.5, "a", (None, True), {"k": b"v"},
    ]  # fmt: skip
    with pytest.raises(ValueError):
        safe_ast.literal_eval("__import__('os')")
    with pytest.raises(SyntaxError):
        safe_ast.literal_eval("[1, 2")


def test_no_module_of_the_package_builds_trees_past_the_lock():
    """Env servers run envs, checkers and datasets on many threads: every tree they build goes
    through :mod:`llm_zoo.safe_ast` (the command line's own parsing runs on one thread)."""
    unguarded = re.compile(r"\bast\.(parse|literal_eval)\(")
    offenders = [
        f"{path.relative_to(SRC)}:{number}"
        for path in SRC.rglob("*.py")
        if path.name not in ("safe_ast.py", "cli.py")
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if unguarded.search(line) and not line.lstrip().startswith("#")
    ]
    assert offenders == []
