"""What a client of ``llm-zoo serve`` may ask for: the operator decides.

A client's ``make`` carries constructor arguments. Two kinds reach past the env into the server,
so by default they are refused with one error frame naming the argument and how the operator
allows it:

* an argument whose value **names a file** (a string with a path separator, starting with ``.``
  or ``~``, or naming something that exists where the server runs): a ``dataset`` path made the
  server read a file of the operator's and show it in the prompts;
* a **resource bound raised** above the env's own default (:data:`RESOURCE_ARGUMENTS`: time
  limits, memory limits, search and mutant budgets): Code-v0's ``timeout`` let one client hold a
  worker for 600 s a step. Lowering a bound is always allowed.

The operator lifts a refusal per argument name with ``llm-zoo serve --allow-arg NAME`` (every env),
and limits the env ids served with ``--env ENV_ID`` (repeatable; default: every registered env).
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable, Collection, Mapping
from typing import Any

__all__ = ["RESOURCE_ARGUMENTS", "argument_problem"]

#: Constructor arguments that bound what one step may cost the server.
RESOURCE_ARGUMENTS = frozenset(
    {
        "timeout",
        "timeout_s",
        "code_timeout_s",
        "tool_timeout_s",
        "memory_mb",
        "tool_memory_mb",
        "max_search_states",
        "mutants",
    }
)


def _names_a_file(value: str) -> bool:
    if any(sep in value for sep in ("/", "\\")) or value.startswith((".", "~")):
        return True
    try:
        return bool(value) and len(value) < 4096 and os.path.exists(value)
    except (OSError, ValueError):
        return True


def _default(factory: Callable[..., Any], name: str) -> Any:
    try:
        parameter = inspect.signature(factory).parameters.get(name)
    except (TypeError, ValueError):
        return None
    return None if parameter is None or parameter.default is inspect.Parameter.empty else parameter.default


def argument_problem(
    env_id: str, factory: Callable[..., Any], kwargs: Mapping[str, Any], allowed: Collection[str]
) -> str | None:
    """Why a client may not make ``env_id`` (built by ``factory``) with ``kwargs``, or ``None``;
    ``allowed``: argument names the operator lets clients set freely."""
    for name, value in kwargs.items():
        if name in allowed:
            continue
        if isinstance(value, str) and _names_a_file(value):
            return (
                f"argument {name}={value[:80]!r} of {env_id} names a file on the server, which clients may not "
                f"choose; the server's operator can allow it with --allow-arg {name}"
            )
        if name in RESOURCE_ARGUMENTS:
            default = _default(factory, name)
            numeric = isinstance(value, int | float) and not isinstance(value, bool)
            if numeric and isinstance(default, int | float) and value > default:
                return (
                    f"argument {name}={value!r} of {env_id} raises a resource bound above the server's "
                    f"{default!r} (lowering it is allowed); the server's operator can allow it with "
                    f"--allow-arg {name}"
                )
    return None
