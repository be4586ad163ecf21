"""The reward-hack search of :func:`llm_zoo.testing.check_env` (and so of ``llm-zoo check ID``).

An RL policy finds every way to earn reward without doing the task. This module plays an env as
such a policy would, through ``env.step`` only, with *generic* adversarial policies (written once,
for every env, plugins included) and checks the rule of ``DESIGN.md``: **rewards pay most for
solving**.

The policies (:func:`adversaries`), each played on every answer of an agent, or on its first
answer only and then the oracle's answer (*delayed*), or on every answer but those of the last
turn, where the oracle answers (*late*: a team that flounders and solves at the end):

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

The *oracle* is the env's own: a function ``oracle_action(env, agent) -> str`` in the env class's
module (or a method ``env.oracle_action(agent)``) giving a perfect answer for ``agent`` now. Without
one, only the policies that need no oracle are played, and the rule below has nothing to compare.

The invariants, checked per task (seed), for every agent's return (the sum of the rewards it
received on every step, its teammates' steps included, as a PettingZoo user sums ``env.last()``)
and for the team's (the sum of the global rewards of the episode's steps):

* **Solving pays most.** In each *group* of episodes - the oracle episode (every agent plays the
  oracle) plus the episodes in which one agent X deviates (plays a policy above) while the others
  play the oracle; or plus the episodes in which every agent plays the same policy (one shared
  model) - no episode that does not succeed earns any agent, or the team, as much as the lowest
  return of a succeeding episode of the group (a tie counts as a violation). Whatever one agent
  does while its teammates play well, failing never pays it, its teammates or the team as much
  as succeeding.
* **The team's outcome reaches every agent.** Holding an agent Y's own answers fixed (the texts
  it answered in the oracle episode, the last one repeated if the episode runs longer), it earns
  strictly more in the oracle episode, which succeeds, than in any episode where a teammate
  plays a policy that fails (random text, a program that prints nothing, the oracle's program
  wrong on half the inputs, the oracle's list one item short).

Besides, no episode in which every agent plays a policy that cannot be right (everything above
but the move lists and the ``42.0`` form) may succeed: that would be a wrong answer accepted.
And ``env.step`` must not raise, whatever the text. An episode still running after the search's
``max_steps`` is left out (it proves nothing either way).

:func:`search_reward_hacks` returns a :class:`HackReport`: the episodes, the violations described
in words (worst first), and per agent and the team the best return of a failing episode and the
worst return of a succeeding one.
"""

from __future__ import annotations

import copy
import hashlib
import json
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from llm_zoo.core import MAX_ACTION_CHARS, TextAECEnv

__all__ = ["Adversary", "Episode", "HackReport", "adversaries", "find_oracle", "search_reward_hacks"]

TEAM = "team"
#: Group name prefix of the episodes that hold one agent's answers fixed (then its name).
FIXED = "fixed:"
#: Items in the long move lists (the seed envs accept at most 1000 moves per answer).
LONG_LIST = 1000
_LIST = re.compile(r'\[\s*"[^"\n\\]{1,16}"(?:\s*,\s*"[^"\n\\]{1,16}")*\s*\]')
_INT = re.compile(r"(?<![\w.])-?\d+(?![\w.])")
_PYTHON = re.compile(r"```python[ \t]*\n(.*?)```", re.DOTALL)
_DEFINED = re.compile(r"^def\s+([A-Za-z_]\w*)\s*\(", re.MULTILINE)
_EPSILON = 1e-9

Oracle = Callable[[Any, str], str]


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


@dataclass
class Episode:
    """One played episode: who played what, the returns, whether it succeeded."""

    seed: int
    group: str
    plays: dict[str, str]
    returns: dict[str, float]
    success: bool
    all_adversarial: bool = False
    all_wrong: bool = False
    #: The agents that first acted when the episode had already succeeded.
    late: frozenset[str] = frozenset()
    #: Each agent's answers, in order (kept for the oracle episode only).
    answers: dict[str, tuple[str, ...]] = field(default_factory=dict)

    def describe(self) -> str:
        return "; ".join(f"{agent}: {play}" for agent, play in self.plays.items())


@dataclass
class HackReport:
    """What :func:`search_reward_hacks` found.

    Attributes:
        episodes: Every episode played.
        violations: ``(excess, sentence)`` per violation, worst (largest excess) first.
        best_failing: Per agent and ``"team"``: the highest return of an episode that did not
            succeed, in the group (and task) where it came closest to (or beyond) the lowest
            succeeding return of the group.
        worst_succeeding: Per agent and ``"team"``: that lowest succeeding return.
        has_oracle: Whether the env exposes an oracle.
    """

    episodes: list[Episode] = field(default_factory=list)
    violations: list[tuple[float, str]] = field(default_factory=list)
    best_failing: dict[str, float] = field(default_factory=dict)
    worst_succeeding: dict[str, float] = field(default_factory=dict)
    has_oracle: bool = False

    def summary(self) -> str:
        """One line per agent and the team: best failing return against worst succeeding one."""
        if not self.best_failing:
            return "no task had both succeeding and failing episodes to compare" + (
                "" if self.has_oracle else " (the env has no oracle_action)"
            )
        return "\n".join(
            f"{key}: best non-solving return {fail:+.3f}, worst solving return {self.worst_succeeding[key]:+.3f}"
            for key, fail in self.best_failing.items()
        )


# ---------------------------------------------------------------------------- the policies


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


# ---------------------------------------------------------------------------- playing


def find_oracle(env: Any) -> Oracle | None:
    """The env's oracle: ``oracle_action(env, agent)`` in its class's module (or a base class's),
    or an ``oracle_action(agent)`` method; ``None`` without one."""
    method = getattr(env, "oracle_action", None)
    if callable(method):
        return lambda env_, agent: method(agent)
    import sys

    for cls in type(env).__mro__:
        module = sys.modules.get(cls.__module__)
        function = getattr(module, "oracle_action", None) if module is not None else None
        if callable(function):
            return function
    return None


class _StepRaised(AssertionError):
    pass


def _ask_oracle(
    oracle: Oracle, env: Any, agent: str, history: str, memo: dict[tuple[str, str, str], str | None]
) -> str | None:
    """The oracle's answer for ``agent``, asked once per task, answers so far (``history``, a
    digest) and observation: the episodes of a task replay the same beginnings (the oracle's
    first answers) many times, and an env is deterministic (``check_env`` checks it)."""
    try:
        observation = env.observe(agent)
        seen = hashlib.sha256(repr(observation).encode("utf-8", "surrogatepass")).hexdigest()
    except Exception:
        seen = None
    key = (agent, history, seen) if seen is not None else None
    if key is not None and key in memo:
        return memo[key]
    try:
        answer = oracle(env, agent)
    except Exception:
        answer = None
    if key is not None:
        memo[key] = answer
    return answer


#: When a deviating agent plays its policy: on every answer (``False``), on its first answer only
#: (``True``, *delayed*), or on every answer but those of the last turn (``LATE``).
LATE = "late"
Mode = bool | str


def _on_last_turn(env: Any) -> bool:
    turn, max_turns = getattr(env, "turn", None), getattr(env, "max_turns", None)
    return isinstance(turn, int) and isinstance(max_turns, int) and turn >= max_turns - 1


def _describe_play(adversary: Adversary | None, mode: Mode) -> str:
    if adversary is None:
        return "the oracle"
    if mode == LATE:
        return f"{adversary.name} until the last turn, then the oracle"
    return f"{adversary.name} on its first answer, then the oracle" if mode else adversary.name


def _play(
    env: Any,
    seed: int,
    group: str,
    policies: dict[str, tuple[Adversary | None, Mode]],
    oracle: Oracle | None,
    rng: np.random.Generator,
    max_steps: int,
    memo: dict[tuple[str, str, str], str | None],
    snapshots: dict[str, tuple[Any, Any]],
) -> Episode | None:
    """One episode; ``policies[agent] = (adversary or None for the oracle, mode)``. ``None``
    when a policy does not apply (or the oracle fails) at some answer, or when the episode has not
    ended after ``max_steps`` steps. ``memo`` holds the
    oracle's answers of this task (see :func:`_ask_oracle`); ``snapshots`` a clone of the env
    after each sequence of answers played so far in this task, with the returns until then:
    episodes of a task share beginnings (an adversary's first answer, played alone, delayed and
    by every agent), and a clone fed the same answers stays identical to its original
    (``check_env`` checks it), so a shared beginning is played (a program run) once."""
    env.reset(seed=seed)
    history = hashlib.sha256()
    can_clone = isinstance(env, TextAECEnv)
    returns = {agent: 0.0 for agent in env.possible_agents}
    answered = dict.fromkeys(env.possible_agents, 0)
    success, team = False, 0.0
    late: set[str] = set()
    texts: dict[str, list[str]] = {agent: [] for agent in env.possible_agents}
    for _ in range(max_steps):
        if not env.agents:
            break
        agent = env.agent_selection
        if env.terminations[agent] or env.truncations[agent]:
            env.step(None)
            continue
        adversary, mode = policies[agent]
        use_oracle = (
            adversary is None
            or (mode is True and answered[agent] >= 1)
            or (mode == LATE and _on_last_turn(env))
        )
        oracle_text = None
        if adversary is not None and adversary.script and not use_oracle:
            text: str | None = adversary.script[min(answered[agent], len(adversary.script) - 1)]
        else:
            if oracle is not None and (use_oracle or (adversary is not None and adversary.uses_oracle)):
                oracle_text = _ask_oracle(oracle, env, agent, history.hexdigest(), memo)
            if use_oracle:
                text = oracle_text
            else:
                assert adversary is not None
                text = adversary.answer(oracle_text, rng)
        if text is None:
            return None
        history.update(f"{agent}\0{len(text)}\0".encode() + text.encode("utf-8", "surrogatepass"))
        saved = snapshots.get(history.hexdigest()) if can_clone else None
        if saved is not None:
            env = saved[0].clone()
            returns, answered, success, team, late, texts = copy.deepcopy(saved[1])
            continue
        try:
            env.step(text)
        except Exception as error:
            play = "the oracle" if use_oracle else adversary.name if adversary else "?"
            raise _StepRaised(
                f"env.step raised {type(error).__name__}: {str(error)[:200]} on {agent}'s answer "
                f"({play}, {len(text):,} characters) in seed {seed}"
            ) from error
        if not answered[agent] and success:
            late.add(agent)
        answered[agent] += 1
        texts[agent].append(text)
        for name, reward in env.rewards.items():
            returns[name] = returns.get(name, 0.0) + float(reward)
        info = env.infos.get(agent, {})
        success = bool(info.get("success", success))
        team += float(info.get("global_reward", 0.0))
        if can_clone:
            snapshots[history.hexdigest()] = (
                env.clone(),
                copy.deepcopy((returns, answered, success, team, late, texts)),
            )
    if env.agents:
        return None  # still running after max_steps: an unfinished episode proves nothing
    returns[TEAM] = team
    plays = {agent: _describe_play(adversary, mode) for agent, (adversary, mode) in policies.items()}
    wrong = all(a is not None and not a.can_be_right and not a.script and not m for a, m in policies.values())
    adversarial = all(a is not None for a, _ in policies.values())
    answers = {agent: tuple(t) for agent, t in texts.items()} if group == "oracle" else {}
    return Episode(seed, group, plays, returns, success, adversarial, wrong, frozenset(late), answers)


def search_reward_hacks(
    env_fn: Callable[[], Any],
    *,
    seeds: Iterable[int] = (0,),
    policies: Sequence[Adversary] | None = None,
    max_steps: int = 200,
) -> HackReport:
    """Play the search's episodes on fresh copies of ``env_fn()`` and check the invariant of the
    module docstring. Raises ``AssertionError`` if ``env.step`` raises; never for a violation
    (they are in the report)."""
    pool = list(policies) if policies is not None else adversaries()
    env = env_fn()
    report = HackReport()
    tightest: dict[str, tuple[float, float, float]] = {}
    try:
        oracle = find_oracle(env)
        report.has_oracle = oracle is not None
        agents = list(env.possible_agents)
        for seed in seeds:
            rng = np.random.default_rng(seed)
            episodes: list[Episode] = []
            memo: dict[tuple[str, str, str], str | None] = {}
            snapshots: dict[str, tuple[Any, Any]] = {}

            def play(
                group: str,
                chosen: dict[str, tuple[Adversary | None, Mode]],
                seed: int = seed,
                rng: np.random.Generator = rng,
                episodes: list[Episode] = episodes,
                memo: dict[tuple[str, str, str], str | None] = memo,
                snapshots: dict[str, tuple[Any, Any]] = snapshots,
            ) -> None:
                episode = _play(env, seed, group, chosen, oracle, rng, max_steps, memo, snapshots)
                if episode is not None:
                    episodes.append(episode)

            if oracle is not None:
                play("oracle", dict.fromkeys(agents, (None, False)))
                # success is sticky in a TextAECEnv: an agent that first acts after the oracle
                # team has succeeded cannot make the episode fail, so its group compares nothing
                late = episodes[0].late if episodes and isinstance(env, TextAECEnv) else frozenset()
                deviators = [agent for agent in agents if agent not in late]
                for deviating in deviators:
                    for adversary in pool:
                        modes: tuple[Mode, ...] = (False, True, LATE) if adversary.delayed else (False,)
                        for mode in modes:
                            chosen: dict[str, tuple[Adversary | None, Mode]] = dict.fromkeys(
                                agents, (None, False)
                            )
                            chosen[deviating] = (adversary, mode)
                            play(deviating, chosen)
                # each agent's own oracle answers held fixed while a teammate makes the task fail
                own = episodes[0].answers if episodes and episodes[0].success else {}
                for holder in [agent for agent in agents if own.get(agent)]:
                    script = Adversary(f"its own oracle-episode answers, {len(own[holder])} of them",
                                       lambda o, rng: None, script=own[holder])  # fmt: skip
                    for deviating in [agent for agent in deviators if agent != holder]:
                        for adversary in [a for a in pool if a.fails_team]:
                            chosen = dict.fromkeys(agents, (None, False))
                            chosen[holder], chosen[deviating] = (script, False), (adversary, False)
                            play(f"{FIXED}{holder}", chosen)
            if len(agents) > 1 or oracle is None:
                for adversary in pool:
                    play("all", dict.fromkeys(agents, (adversary, False)))
            report.episodes += episodes
            report.violations += _violations(episodes, agents, tightest)
            for clone, _ in snapshots.values():
                clone.close()  # gives back what the clones hold (a math checker's lease)
    finally:
        close = getattr(env, "close", None)
        if callable(close):
            close()
    report.violations.sort(key=lambda item: -item[0])
    for key, (_, failing, succeeding) in tightest.items():
        report.best_failing[key], report.worst_succeeding[key] = failing, succeeding
    return report


def _violations(
    episodes: list[Episode], agents: list[str], tightest: dict[str, tuple[float, float, float]]
) -> list[tuple[float, str]]:
    """The violations among one task's episodes; ``tightest[key]`` is updated with the group of
    smallest margin: ``(margin, best failing return, worst succeeding return)``."""
    found: list[tuple[float, str]] = []
    for episode in episodes:
        if episode.success and episode.all_wrong:
            found.append(
                (
                    float("inf"),
                    f"seed {episode.seed}: an episode succeeded although every agent played an answer "
                    f"that cannot be right ({episode.describe()})",
                )
            )
    oracle_runs = [e for e in episodes if e.group == "oracle"]
    for group in sorted({e.group for e in episodes} - {"oracle"}):
        members = oracle_runs + [e for e in episodes if e.group == group]
        # every agent and the team; for a group holding one agent's answers fixed, that agent
        for key in [group[len(FIXED) :]] if group.startswith(FIXED) else [*agents, TEAM]:
            succeeding = [e for e in members if e.success]
            failing = [e for e in members if not e.success]
            if not succeeding or not failing:
                continue
            floor = min(succeeding, key=lambda e: e.returns[key])
            top = max(failing, key=lambda e: e.returns[key])
            margin = floor.returns[key] - top.returns[key]
            if key not in tightest or margin < tightest[key][0]:
                tightest[key] = (margin, top.returns[key], floor.returns[key])
            for episode in failing:
                excess = episode.returns[key] - floor.returns[key]
                if excess > -_EPSILON:  # a tie is a violation too: solving must pay strictly more
                    who = "the team" if key == TEAM else key
                    than = "more than" if excess > _EPSILON else "as much as"
                    found.append(
                        (
                            excess,
                            f"seed {episode.seed}: {who} earned {episode.returns[key]:+.3f} in an episode "
                            f"that did not succeed ({episode.describe()}), {than} the lowest return of "
                            f"a succeeding episode, {floor.returns[key]:+.3f} ({floor.describe()})",
                        )
                    )
    return found
