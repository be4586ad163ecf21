"""Checks of environment arguments, each failing with one line that names the argument, the value
and what is expected.

The built-in envs check their constructor arguments with these helpers, so ``llm_zoo.make`` refuses
a wrong type (``alpha="high"``, ``timeout="3"``, ``rows=True``) or an out-of-range size
(``rows=10**9``) before any work is done, instead of failing later with a numpy or sandbox message
(or running on silently). :class:`~llm_zoo.core.TextAECEnv` also checks ``reset``'s seed and
``observe``'s agent with them. Plugin envs may use them too.

Numbers: ``bool`` is never taken for a number (``rows=True`` is refused), numpy integers and floats
are, strings never are (``"3"`` is refused: no silent conversion), and NaN / infinity are refused.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Collection, Mapping
from typing import Any

import numpy as np

__all__ = [
    "MAX_MEMORY_MB",
    "MAX_TIMEOUT_S",
    "TASK_OPTIONS",
    "EnvArgumentError",
    "check_agent",
    "check_int",
    "check_number",
    "check_options",
    "check_seed",
]


#: Most seconds an env lets a sandboxed program run per test (``timeout``, ``tool_timeout_s``,
#: ``code_timeout_s``): ten minutes per program run stops a training step for good anyway.
MAX_TIMEOUT_S = 600.0
#: Most MiB of address space an env gives a sandboxed program (``memory_mb``, ``tool_memory_mb``).
MAX_MEMORY_MB = 65_536


class EnvArgumentError(TypeError, ValueError):
    """An environment argument has the wrong type or is out of range.

    Both a ``TypeError`` and a ``ValueError``, so code that catches either (the usual exceptions
    for a wrong type and a wrong value) catches it.
    """


def _got(value: Any) -> str:
    text = repr(value)
    if len(text) > 80:
        text = text[:60] + "..." + text[-10:]
    return f"got {text} (a {type(value).__name__})"


def _is_int(value: Any) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def check_int(name: str, value: Any, *, low: int, high: int | None = None, why: str = "") -> int:
    """``value`` as an ``int`` if it is an integer in ``[low, high]`` (no upper bound when ``high``
    is ``None``); :class:`EnvArgumentError` otherwise. ``why`` explains the bound in the message."""
    expected = f"an integer >= {low}" if high is None else f"an integer in [{low}, {high}]"
    if not _is_int(value) or value < low or (high is not None and value > high):
        reason = f" ({why})" if why else ""
        raise EnvArgumentError(f"{name} must be {expected}{reason}, {_got(value)}")
    return int(value)


def check_number(
    name: str,
    value: Any,
    *,
    low: float | None = None,
    high: float | None = None,
    low_open: bool = False,
    high_open: bool = False,
    unit: str = "",
) -> float:
    """``value`` as a ``float`` if it is a finite real number within the bounds (``None``: no bound;
    ``low_open`` / ``high_open`` exclude the bound itself); :class:`EnvArgumentError` otherwise."""
    if low is None and high is None:
        expected = "a finite number"
    elif high is None:
        expected = f"a number {'>' if low_open else '>='} {low:g}"
    elif low is None:
        expected = f"a number {'<' if high_open else '<='} {high:g}"
    else:
        expected = f"a number in {'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"
    expected += f" {unit}" if unit else ""
    ok = (
        isinstance(value, (int, float, np.integer, np.floating))
        and not isinstance(value, (bool, np.bool_))
        and math.isfinite(value)
        and (low is None or (value > low if low_open else value >= low))
        and (high is None or (value < high if high_open else value <= high))
    )
    if not ok:
        raise EnvArgumentError(f"{name} must be {expected}, {_got(value)}")
    return float(value)


def check_seed(seed: Any) -> int | None:
    """A ``reset`` seed: ``None`` or an integer >= 0, as Gymnasium requires (numpy's generators
    refuse negative seeds with a message about ``SeedSequence``)."""
    if seed is None:
        return None
    if not _is_int(seed) or seed < 0:
        raise EnvArgumentError(
            f"reset(seed=...) must be None or an integer >= 0 (as in Gymnasium), {_got(seed)}"
        )
    return int(seed)


def check_agent(agent: Any, agents: Collection[str]) -> str:
    """``agent`` if it is one of ``agents``; :class:`EnvArgumentError` naming the valid ones."""
    if not isinstance(agent, str) or agent not in agents:
        raise EnvArgumentError(f"unknown agent {agent!r}; the agents are {', '.join(map(repr, agents))}")
    return agent


#: The ``reset`` options that pick the task in one llm-zoo env or another. An env that does not
#: take one of them refuses it rather than play another task without a word.
TASK_OPTIONS = ("problem_id", "problem_index", "board")


def check_options(options: Any, allowed: Mapping[str, str], env_name: str) -> dict[str, Any]:
    """``reset``'s ``options`` as a dict; :class:`EnvArgumentError` for a key that would pick the
    task but is not one of ``allowed`` (key -> what it does, for the message).

    Refused: a :data:`TASK_OPTIONS` key this env does not take (``problem_id`` on an env whose
    levels are generated), and a key that looks like a typo of an allowed one (``problem_idx``).
    Other keys are ignored, as PettingZoo expects (its ``api_test`` resets with
    ``options={"options": 1}``).
    """
    if options is None:
        return {}
    if not isinstance(options, Mapping):
        raise EnvArgumentError(f"{env_name}: reset(options=...) must be a dict or None, {_got(options)}")
    refused, hints = [], []
    for key in options:
        if key in allowed:
            continue
        close = difflib.get_close_matches(str(key), list(allowed), n=1, cutoff=0.8)
        if key in TASK_OPTIONS or close:
            refused.append(key)
            hints += close
    if refused:
        valid = "; ".join(f"{key!r}: {meaning}" for key, meaning in allowed.items()) or "none"
        note = f" Did you mean {', '.join(map(repr, hints))}?" if hints else ""
        raise EnvArgumentError(
            f"{env_name} does not take the reset option(s) {', '.join(map(repr, refused))}.{note} "
            f"Its task options: {valid}"
        )
    return dict(options)
