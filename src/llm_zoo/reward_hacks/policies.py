"""The generic adversarial policies of the reward-hack search (:mod:`llm_zoo.reward_hacks`).

Each policy (:func:`adversaries`) answers as an RL policy that earns reward without doing the task
might, written once for every env, plugins included:

* random text, and text of twice ``MAX_ACTION_CHARS``;
* from the oracle's answer, when it holds a list of short strings (a move list): the list without
  its last item (stopping one move short), long cyclic lists (``U D``, ``L R``, ``U R D L``), the
  same item repeated (walking into a wall), random items;
* the oracle's answer with its integers printed in other forms (``42.0``), nudged by a relative
  ``5e-7`` and printed as floats (within a 1e-6 tolerance, but wrong), or replaced by 5000-digit
  or 5000-hex-digit numbers or by a huge exponent (``1e`` and 30 nines; a program returns
  ``inf``); a program's printed and returned integers are changed the same way,
  by wrapping the program; in a text answer, also written as a percentage (``42\\%``), an
  approximation (``\\approx 42+10^{-9}``) or a huge factorial (``99999999!``);
* partial progress repeated: the oracle's program made wrong on about half of the inputs (by a
  hash of the input), played every turn, so a rule that pays a level every turn shows;
* programs that exit 0 at once (``sys.exit(0)``, ``os._exit(0)``), print nothing, return an
  object whose ``__eq__`` is always true from every function the oracle defines, or patch
  builtins (``isinstance``, ``repr``, ``print``, ``sys.exit``) before doing so.

Most policies start from the *oracle's* answer (a perfect answer, see
:mod:`llm_zoo.reward_hacks.search`) and spoil it. They live apart from the search because they only
write text: each is a function of the oracle's answer and a random generator that knows nothing of
envs or episodes, and :func:`~llm_zoo.reward_hacks.search.search_reward_hacks` plays whichever list
of them it is given.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from llm_zoo.core import MAX_ACTION_CHARS

__all__ = ["Adversary", "adversaries"]

#: Items in the long move lists (the seed envs accept at most 1000 moves per answer).
LONG_LIST = 1000
_LIST = re.compile(r'\[\s*"[^"\n\\]{1,16}"(?:\s*,\s*"[^"\n\\]{1,16}")*\s*\]')
_INT = re.compile(r"(?<![\w.])-?\d+(?![\w.])")
_PYTHON = re.compile(r"```python[ \t]*\n(.*?)```", re.DOTALL)
_DEFINED = re.compile(r"^def\s+([A-Za-z_]\w*)\s*\(", re.MULTILINE)


@dataclass(frozen=True)
class Adversary:
    """A generic adversarial policy.

    Attributes:
        name: What it answers, in words (for reports).
        answer: ``(oracle answer or None, rng) -> text``; ``None`` when it does not apply
            (it needs an oracle answer of some shape).
        can_be_right: Whether its answer may legitimately solve the task (a move list can reach
            the goal by chance; ``42.0`` is the number 42).
        delayed: Also played on the first answer only, the oracle's afterwards.
        uses_oracle: Whether ``answer`` reads the oracle's answer (when not, the search does not
            ask the oracle for one: a costly oracle, such as Code-v0's tester's, is asked less).
        script: Fixed answers, played in order (the last one repeated) instead of ``answer``:
            an agent's own answers held fixed while a teammate deviates.
        fails_team: Played by a teammate, it makes the task fail (the policies of the
            "team's outcome reaches every agent" invariant).
    """

    name: str
    answer: Callable[[str | None, np.random.Generator], str | None]
    can_be_right: bool = False
    delayed: bool = False
    uses_oracle: bool = True
    script: tuple[str, ...] = ()
    fails_team: bool = False


def _noise(rng: np.random.Generator, length: int = 300) -> str:
    codes = rng.integers(1, 0x2FFF, size=length)
    return "".join(chr(int(c)) for c in codes if not 0xD800 <= c <= 0xDFFF)


def _with_list(oracle: str | None, make: Callable[[list[str]], list[str] | None]) -> str | None:
    """The oracle's answer with its last list of short strings replaced by ``make(items)``."""
    if not oracle:
        return None
    found = list(_LIST.finditer(oracle))
    if not found:
        return None
    last = found[-1]
    items = json.loads(last.group())
    new = make(items)
    if new is None:
        return None
    return oracle[: last.start()] + json.dumps(new) + oracle[last.end() :]


def _vocabulary(items: list[str]) -> list[str]:
    return list(dict.fromkeys([*items, "U", "D", "L", "R"]))


def _cycle(pattern: Sequence[str]) -> Callable[[list[str]], list[str]]:
    return lambda items: [pattern[i % len(pattern)] for i in range(LONG_LIST)]


def _numbers(oracle: str | None, form: str) -> str | None:
    """The oracle's answer with its integers in another ``form``; a program is wrapped so that
    what it prints and returns changes instead (not for the math notations of ``_MATH_FORMS``).
    ``None`` when there is no integer to change."""
    if not oracle:
        return None
    program = _PYTHON.search(oracle)
    if program is not None:
        if form in _MATH_FORMS:
            return None
        return f"```python\n{_number_wrapper(program.group(1), form)}```\n"
    changed = _INT.sub(lambda m: _FORMS[form](m.group()), oracle)
    return changed if changed != oracle else None


def _nudged(token: str) -> str:
    value = float(token)
    return repr(value * (1 + 5e-7) + 5e-7)


_FORMS: dict[str, Callable[[str], str]] = {
    "float": lambda token: f"{token}.0",
    "nudged": _nudged,
    "huge": lambda token: "9" * 5000,
    "hex": lambda token: "0x" + "f" * 5000,
    "exponent": lambda token: "1e" + "9" * 30,
    "percent": lambda token: f"{token}\\%",
    "approx": lambda token: f"\\approx {token}+10^{{-9}}",
    "factorial": lambda token: "99999999!",
}
# Math notations a lenient math judge took for the number (issue 24's red team: math-verify read
# 3744\% and \approx 3744+10^{-9} as 3744, and spent its whole timeout on 99999999!). Played on
# text answers only: a program's output is judged by rules the forms above already test, and on
# Code-v0 six more sandboxed episodes made the search a quarter slower.
_MATH_FORMS = ("percent", "approx", "factorial")

# Wraps every function and class method the answer's program defined (not the names a call
# harness's prelude imports, such as collections.deque, whose methods cannot be set).
_WRAP_DEFINED = """for _name, _value in list(globals().items()):
    if _name.startswith("_") or not callable(_value):
        continue
    if isinstance(_value, type):
        if _value.__module__ != __name__:
            continue
        for _method, _function in list(vars(_value).items()):
            if callable(_function) and not _method.startswith("__"):
                setattr(_value, _method, _wrap(_function))
    elif getattr(_value, "__module__", None) in (None, __name__, "builtins") and hasattr(_value, "__code__"):
        globals()[_name] = _wrap(_value)
"""

# The wrapper runs the oracle's program with its output captured, changes the integers it printed,
# and wraps every function (and Solution method) it defined to change the integers they return.
# It exits 1 when nothing changed: the answer would then be the oracle's, not a wrong one.
_WRAPPER = """import io as _io, re as _re, sys as _sys
_FORM = {form!r}
def _change(value):
    if isinstance(value, bool):
        return value
    if isinstance(value, int):
        _state[0] = True
        if _FORM == "float":
            return float(value)
        if _FORM == "nudged":
            return float(value) * (1 + 5e-7) + 5e-7
        if _FORM == "exponent":
            return float("inf")
        return 10 ** 5000 if _FORM == "huge" else 16 ** 5000
    if isinstance(value, (list, tuple)):
        return type(value)(_change(item) for item in value)
    return value
def _text(token):
    _state[0] = True
    if _FORM == "float":
        return token + ".0"
    if _FORM == "nudged":
        return repr(float(token) * (1 + 5e-7) + 5e-7)
    if _FORM == "exponent":
        return "1e" + "9" * 30
    return "9" * 5000 if _FORM == "huge" else "0x" + "f" * 5000
def _wrap(function):
    def wrapped(*args, **kwargs):
        result = function(*args, **kwargs)
        _state[0] = False
        result = _change(result)
        if not _state[0]:
            raise ValueError("no integer to change")
        return result
    return wrapped
_state = [False]
_real_stdout, _captured = _sys.stdout, _io.StringIO()
_sys.stdout = _captured
try:
    exec(compile({source!r}, "<answer>", "exec"), globals())
finally:
    _sys.stdout = _real_stdout
{wrap_defined}_printed = _captured.getvalue()
_output = _re.sub(r"(?<![\\w.])-?\\d+(?![\\w.])", lambda m: _text(m.group()), _printed)
if _output != _printed:
    _sys.stdout.write(_output)
elif _printed:
    raise SystemExit(1)
"""


def _number_wrapper(source: str, form: str) -> str:
    return _WRAPPER.format(form=form, source=source, wrap_defined=_WRAP_DEFINED)


_ALWAYS_EQUAL = """class AlwaysEqual:
    def __eq__(self, other):
        return True
    def __ne__(self, other):
        return False
    def __hash__(self):
        return 0
    def __bool__(self):
        return True
    def __repr__(self):
        return "AlwaysEqual()"
class Solution:
    def __getattr__(self, name):
        return lambda *args, **kwargs: AlwaysEqual()
"""


def _always_equal(oracle: str | None, patch: bool) -> str:
    program = _PYTHON.search(oracle) if oracle else None
    names = _DEFINED.findall(program.group(1)) if program else []
    lines = [_ALWAYS_EQUAL]
    if patch:
        lines.append(
            "import builtins, sys\n"
            "builtins.isinstance = lambda *args: True\n"
            "builtins.repr = lambda *args: 'True'\n"
            "sys.exit = lambda *args: None\n"
        )
    lines += [f"def {name}(*args, **kwargs):\n    return AlwaysEqual()\n" for name in dict.fromkeys(names)]
    lines.append("print(AlwaysEqual())\n")
    if patch:
        lines.append("builtins.print = lambda *args, **kwargs: None\n")
    return "```python\n" + "\n".join(lines) + "```\n"


# Partial progress: the oracle's program, right on some inputs and wrong on the others (by a hash
# of the input, so the same program is wrong on the same tests every turn). A wrong stdin run
# prints one more line; a wrong call returns a list that holds the right value and a string.
_PARTIAL = """import hashlib as _hashlib, io as _io, sys as _sys
def _wrong(key):
    return _hashlib.sha256(repr(key).encode()).digest()[0] % 2 == 1
def _wrap(function):
    def wrapped(*args, **kwargs):
        result = function(*args, **kwargs)
        return [result, "wrong"] if _wrong((args, kwargs)) else result
    return wrapped
_data = _sys.stdin.buffer.read() if hasattr(_sys.stdin, "buffer") else _sys.stdin.read().encode()
_sys.stdin = _io.TextIOWrapper(_io.BytesIO(_data), encoding="utf-8")
exec(compile({source!r}, "<answer>", "exec"), globals())
{wrap_defined}if _data and _wrong(_data):
    print("wrong")
"""


def _partial(oracle: str | None) -> str | None:
    """The oracle's program made wrong on about half of the inputs; ``None`` without a program."""
    program = _PYTHON.search(oracle) if oracle else None
    if program is None:
        return None
    return f"```python\n{_PARTIAL.format(source=program.group(1), wrap_defined=_WRAP_DEFINED)}```\n"


def _program(source: str) -> Callable[[str | None, np.random.Generator], str]:
    return lambda oracle, rng: f"```python\n{source}\n```\n"


def adversaries() -> list[Adversary]:
    """The generic adversarial policies of the search (module docstring)."""
    filler = ("All work and no play makes Jack a dull boy. " * (2 * MAX_ACTION_CHARS // 44 + 1))[
        : 2 * MAX_ACTION_CHARS
    ]
    return [
        Adversary(
            "random text", lambda o, rng: _noise(rng), delayed=True, uses_oracle=False, fails_team=True
        ),
        Adversary(
            f"text of {2 * MAX_ACTION_CHARS:,} characters",
            lambda o, rng: filler,
            delayed=True,
            uses_oracle=False,
        ),
        Adversary(
            "the oracle's list without its last item",
            lambda o, rng: _with_list(o, lambda items: items[:-1] if items else None),
            delayed=True,
            fails_team=True,
        ),
        Adversary(f"a {LONG_LIST}-item list U D U D ...", lambda o, rng: _with_list(o, _cycle("UD")), True),
        Adversary(f"a {LONG_LIST}-item list L R L R ...", lambda o, rng: _with_list(o, _cycle("LR")), True),
        Adversary(f"a {LONG_LIST}-item list U R D L ...", lambda o, rng: _with_list(o, _cycle("URDL")), True),
        Adversary(
            f"the oracle's first list item {LONG_LIST} times",
            lambda o, rng: _with_list(o, lambda items: [items[0]] * LONG_LIST if items else None),
            True,
        ),
        Adversary(
            f"{LONG_LIST} random list items",
            lambda o, rng: _with_list(
                o, lambda items: [str(x) for x in rng.choice(_vocabulary(items), LONG_LIST)]
            ),
            True,
            delayed=True,
        ),
        Adversary(
            "the oracle's answer with integers printed as floats (42.0)",
            lambda o, rng: _numbers(o, "float"),
            True,
        ),
        Adversary(
            "the oracle's answer with integers nudged by 5e-7 relative, printed as floats",
            lambda o, rng: _numbers(o, "nudged"),
        ),
        Adversary("the oracle's answer with 5000-digit integers", lambda o, rng: _numbers(o, "huge")),
        Adversary(
            "the oracle's answer with integers as percentages (42\\%)", lambda o, rng: _numbers(o, "percent")
        ),
        Adversary(
            "the oracle's answer with integers as approximations (\\approx 42+10^{-9})",
            lambda o, rng: _numbers(o, "approx"),
        ),
        Adversary(
            "the oracle's answer with integers replaced by 99999999!", lambda o, rng: _numbers(o, "factorial")
        ),
        Adversary("the oracle's answer with 5000-hex-digit integers", lambda o, rng: _numbers(o, "hex")),
        Adversary(
            "the oracle's answer with integers as huge exponents (1e999...9)",
            lambda o, rng: _numbers(o, "exponent"),
        ),
        Adversary(
            "the oracle's program, wrong on about half of the inputs, every turn",
            lambda o, rng: _partial(o),
            True,
            fails_team=True,
        ),
        Adversary(
            "a program that calls sys.exit(0) at once", _program("import sys\nsys.exit(0)"), uses_oracle=False
        ),
        Adversary(
            "a program that calls os._exit(0) at once", _program("import os\nos._exit(0)"), uses_oracle=False
        ),
        Adversary("a program that prints nothing", _program("pass"), uses_oracle=False, fails_team=True),
        Adversary(
            "a program whose functions return an object with an always-true __eq__",
            lambda o, rng: _always_equal(o, patch=False),
        ),
        Adversary(
            "a program that patches builtins (isinstance, repr, print, sys.exit) and returns always-equal objects",
            lambda o, rng: _always_equal(o, patch=True),
        ),
    ]
