"""``ast.parse`` and ``ast.literal_eval`` that may be called from several threads at once.

CPython 3.11 counts the depth of the AST it is building in one counter shared by every thread,
and checks it is back where it started when the tree is done. Two threads parsing at once (an
env server makes and steps envs on many threads) see each other's depth and fail with
``SystemError: AST constructor recursion depth mismatch`` (CPython issue 106905). An outside load
test of ``llm-zoo serve`` hit it in 1 of 8 Code-v0 makes beside other clients' Plan-Path steps:
both read literals with ``ast.literal_eval``. One lock serialises building trees; walking and
unparsing them needs none.
"""

from __future__ import annotations

import ast
import threading
from typing import Any

__all__ = ["literal_eval", "parse"]

_BUILDING = threading.Lock()


def parse(source: str, mode: str = "exec") -> ast.AST:
    """:func:`ast.parse`, one thread at a time."""
    with _BUILDING:
        return ast.parse(source, mode=mode)


def literal_eval(text: str) -> Any:
    """:func:`ast.literal_eval` of a string, one thread at a time while the tree is built."""
    tree = parse(text.lstrip(" \t"), mode="eval")
    return ast.literal_eval(tree)
