"""Checking math answers safely with ``math-verify``.

:class:`AnswerChecker` decides whether a predicted answer is equivalent to a gold answer with
`math-verify <https://github.com/huggingface/Math-Verify>`_: ``verify(parse(gold), parse(pred))``,
gold first (the relation is asymmetric). Both sides are answer *strings* (the content of a
``\\boxed{}`` or a printed line, not a whole solution); each is parsed as ``\\boxed{<answer>}``,
so LaTeX (``\\frac{3}{4}``) and plain text (``3/4``, ``sqrt(2)``) both work.

Why not call math-verify directly: its timeouts use ``SIGALRM`` (they raise off the main thread),
and some inputs hang or explode inside C code that no signal interrupts (``9^{9^{9^{9}}}``, deep
nesting, megabyte answers). So:

* **Worker processes.** Checks run in a small pool (``max_workers``, default 1) of persistent
  worker processes (the program in ``llm_zoo/checkers/_math_worker.py``), each a fresh interpreter
  (``subprocess``, no ``fork`` of the caller, so it is safe from threaded parents and never
  re-imports the caller's ``__main__``). A worker starts on
  the first check that needs it (start-up ~0.5 s: import math-verify and warm it up) and is reused.
  Inside the worker math-verify's own timeouts are on (it runs on the worker's main thread), the
  address space is limited (``memory_mb``) and each check gets a CPU-time limit.
* **Hard timeout.** The caller waits at most ``timeout_s`` for an answer; a worker that does not
  answer in time is killed (its whole process group) and replaced on the next check, and the
  result is *not verified*: ``correct=False``, ``method="timeout"``.
* **Input cap.** Answers longer than ``max_answer_chars`` are not sent: ``correct=False``,
  ``method="too_long"``.
* **Normalisation.** Spellings math-verify misjudges are rewritten first
  (:func:`llm_zoo.checkers.math_normalize.normalize_pair`: ``4pi`` -> ``4\\pi``; an inequality compared
  with an interval becomes that interval).
* **Strict rules** (:mod:`llm_zoo.checkers.math_strict`, which says why). Without a worker, in
  microseconds: a percent sign or an approximation marker the gold lacks makes an answer wrong,
  and so does a value too large to evaluate (``99999999!``, ``9^{9^{9^{9}}}``; never a timeout).
  An answer that starts with a relation (``= 3744+10^{-9}``, of which math-verify read only
  ``3744``) is wrong too. When both answers are plain numbers, only exactly the gold's value is
  right (``0.5000001`` is wrong for ``\\frac{1}{2}``), except that a decimal of at least 6 significant digits within one unit of its
  last digit stands for a gold no decimal of its length can write (``0.333333`` for ``1/3``).
* **Fast path.** Identical answers are correct without a worker. When both are plain numbers
  (integers, ``a/b``, ``\\frac{a}{b}``, decimals), they are compared exactly with
  :class:`fractions.Fraction`, also without a worker, by the rules above.
* **Cache.** Results are kept in an LRU cache keyed by ``(gold, pred)`` (RL samples the same
  answers again and again). A timeout is cached the second time the same pair times out: a
  legitimate check that was merely slow on a loaded machine gets a second chance, and a
  pathological answer repeated by many samples costs two timeouts, not one per sample. Worker
  errors are never cached. :meth:`AnswerChecker.clear_cache` empties it.
* **Lifetime.** Thread-safe (a lock-protected pool and cache). Fork-safe: a forked child never
  uses or kills its parent's workers; it starts its own. Workers exit when the checker is closed,
  when the last :meth:`lease` is released (environments hold leases), when the caller's interpreter
  exits (``atexit``), or when their stdin closes (the caller died).

Every outcome is a :class:`CheckResult`; nothing here raises on bad answers.
"""

from __future__ import annotations

import atexit
import collections
import os
import re
import threading
import weakref
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from llm_zoo.checkers.math_normalize import normalize_pair
from llm_zoo.checkers.math_strict import marker_refusal, plain_verdict, size_refusal
from llm_zoo.checkers.math_workers import MathWorker, PoolState, WorkerDied, shutdown_pool

__all__ = [
    "AnswerChecker",
    "CheckResult",
    "CheckerLease",
    "check_answer",
    "default_checker",
    "exact_value",
]

DEFAULT_TIMEOUT_S = 8.0
DEFAULT_MAX_ANSWER_CHARS = 1000
DEFAULT_CACHE_SIZE = 8192
DEFAULT_MEMORY_MB = 2048


@dataclass(frozen=True)
class CheckResult:
    """The verdict on one ``(gold, pred)`` pair.

    Attributes:
        correct: ``pred`` is equivalent to ``gold``. Every failure mode below counts as wrong.
        method: How the verdict was reached: ``"exact"`` (fast path), ``"math_verify"``,
            ``"empty"`` (an answer was blank), ``"too_long"`` (over the length cap),
            ``"refused"`` (a percent or approximation marker the gold lacks, or a value too large
            to evaluate: :mod:`llm_zoo.checkers.math_strict`; ``detail`` says which),
            ``"timeout"`` (math-verify's own timeout or the hard timeout), ``"error"``
            (the worker died or could not start).
        detail: A short human-readable explanation (for logs, never shown to a model).
    """

    correct: bool
    method: str
    detail: str = ""


# ---------------------------------------------------------------------------- exact fast path

_INT = r"\d{1,60}"
_DEC = r"(?:\d{1,60}(?:\.\d{0,60})?|\.\d{1,60})"
_PLAIN_RATIONAL = re.compile(rf"^([+-]?)\s*({_DEC})(?:\s*/\s*({_INT}))?$")
_LATEX_FRAC = re.compile(rf"^([+-]?)\s*\\[dt]?frac\s*\{{\s*([+-]?)\s*({_INT})\s*\}}\s*\{{\s*({_INT})\s*\}}$")


def exact_value(answer: str) -> tuple[Fraction, bool] | None:
    """The exact value of a plain numeric answer, or ``None`` if it is anything else.

    Accepts integers, decimals, ``a/b`` and ``\\frac{a}{b}`` (``\\dfrac``, ``\\tfrac``), optionally
    signed and wrapped in ``$...$``. Returns ``(value, is_decimal)``; ``is_decimal`` is true when
    the text had a decimal point (a possibly rounded value).
    """
    text = answer.strip().strip("$").strip()
    match = _PLAIN_RATIONAL.match(text)
    try:
        if match:
            sign, numerator, denominator = match.groups()
            value = Fraction(numerator) / Fraction(int(denominator or 1))
            return (-value if sign == "-" else value), "." in numerator
        match = _LATEX_FRAC.match(text)
        if match:
            outer, inner, numerator, denominator = match.groups()
            value = Fraction(int(numerator), int(denominator))
            return (-value if (outer == "-") != (inner == "-") else value), False
    except (ZeroDivisionError, ValueError):
        return None
    return None


def _fast_verdict(gold: str, pred: str) -> CheckResult | None:
    if gold == pred:
        return CheckResult(True, "exact", "identical answers")
    refusal = (
        marker_refusal(gold, pred) or size_refusal(pred) or size_refusal(gold)
    )  # gold: an agent's answer when two agents' answers are compared
    if refusal is not None:
        return CheckResult(False, "refused", refusal)
    gold_value, pred_value = exact_value(gold), exact_value(pred)
    if gold_value is None or pred_value is None:
        return None
    correct, detail = plain_verdict(gold_value, pred_value)
    return CheckResult(correct, "exact", detail)


_LIVE_CHECKERS: weakref.WeakSet[AnswerChecker] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    global _DEFAULT_LOCK
    _DEFAULT_LOCK = threading.Lock()
    for checker in list(_LIVE_CHECKERS):
        checker._reset_after_fork()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


class AnswerChecker:
    """A thread-safe, fork-safe math answer checker with worker processes, a hard timeout, exact
    fast paths and an LRU cache (see the module docstring).

    Args:
        timeout_s: Hard limit in seconds on one math-verify check (worker start-up excluded).
        max_workers: Worker processes at most; checks beyond that wait their turn.
        max_answer_chars: Longer answers are judged wrong without being parsed.
        cache_size: Entries in the ``(gold, pred)`` LRU cache; 0 disables it.
        memory_mb: Address-space limit of each worker process.
    """

    def __init__(
        self,
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        max_workers: int = 1,
        max_answer_chars: int = DEFAULT_MAX_ANSWER_CHARS,
        cache_size: int = DEFAULT_CACHE_SIZE,
        memory_mb: int = DEFAULT_MEMORY_MB,
    ):
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s!r}")
        if max_workers < 1:
            raise ValueError(f"max_workers must be >= 1, got {max_workers!r}")
        self.timeout_s = float(timeout_s)
        self.max_workers = int(max_workers)
        self.max_answer_chars = int(max_answer_chars)
        self.cache_size = int(cache_size)
        self.memory_mb = int(memory_mb)
        self._cache: collections.OrderedDict[tuple[str, str], CheckResult] = collections.OrderedDict()
        self._timeouts: collections.OrderedDict[tuple[str, str], None] = collections.OrderedDict()
        self._cache_lock = threading.Lock()
        self._state = PoolState()
        self._finalizer = weakref.finalize(self, shutdown_pool, self._state)  # also runs at exit
        _LIVE_CHECKERS.add(self)

    # ------------------------------------------------------------------ public API

    def check(self, gold: str, pred: str) -> CheckResult:
        """Is ``pred`` equivalent to ``gold``? Never raises for any pair of strings."""
        gold, pred = str(gold).strip(), str(pred).strip()
        if not gold or not pred:
            return CheckResult(False, "empty", "an answer is empty")
        limit = self.max_answer_chars
        if len(gold) > limit or len(pred) > limit:
            return CheckResult(False, "too_long", f"answer longer than {limit} characters")
        gold, pred = normalize_pair(gold, pred)  # spellings math-verify misjudges (4pi, x <= 5)
        key = (gold, pred)
        cached = self._cache_get(key)
        if cached is not None:
            return cached
        result = _fast_verdict(gold, pred) or self._check_in_worker(gold, pred)
        self._cache_put(key, result)
        return result

    def is_correct(self, gold: str, pred: str) -> bool:
        """``check(gold, pred).correct``."""
        return self.check(gold, pred).correct

    def lease(self) -> CheckerLease:
        """A handle an owner (an env) holds while it may use this checker. When the last lease
        is released the workers are stopped (they restart on the next check)."""
        return CheckerLease(self)

    def worker_pids(self) -> list[int]:
        """Process ids of this checker's live workers (for tests and monitoring)."""
        state = self._state
        with state.condition:
            return sorted(w.pid for w in state.workers if w.alive())

    def shutdown_workers(self) -> None:
        """Stop every worker; the next check starts a new one. The cache is kept. A worker busy
        with another thread's check is stopped as soon as that check returns."""
        shutdown_pool(self._state, busy_too=False)

    def close(self) -> None:
        """Stop every worker. The checker remains usable (workers restart on demand)."""
        self.shutdown_workers()

    def clear_cache(self) -> None:
        """Forget every cached verdict (and every first timeout)."""
        with self._cache_lock:
            self._cache.clear()
            self._timeouts.clear()

    def __enter__(self) -> AnswerChecker:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # A checker is a shared service: copies of an env share it; a pickled one starts fresh.
    def __copy__(self) -> AnswerChecker:
        return self

    def __deepcopy__(self, memo: dict[int, Any]) -> AnswerChecker:
        return self

    def __reduce__(self) -> tuple[Any, ...]:
        if self is _DEFAULT:
            return (default_checker, ())  # the shared checker of the receiving process
        return (_rebuild_checker, (self.timeout_s, self.max_workers, self.max_answer_chars,
                                   self.cache_size, self.memory_mb))  # fmt: skip

    def __repr__(self) -> str:
        return (
            f"AnswerChecker(timeout_s={self.timeout_s}, max_workers={self.max_workers}, "
            f"max_answer_chars={self.max_answer_chars})"
        )

    # ------------------------------------------------------------------ internals

    def _check_in_worker(self, gold: str, pred: str) -> CheckResult:
        # One retry covers a worker that died while idle (killed from outside, CPU limit).
        for attempt in range(2):
            try:
                worker = self._acquire()
            except WorkerDied as error:
                return CheckResult(False, "error", str(error))
            reused = worker.used
            try:
                reply = worker.request(gold, pred, self.timeout_s)
            except WorkerDied as error:
                self._release(worker)
                if str(error) == "timeout":
                    return CheckResult(False, "timeout", f"no verdict within {self.timeout_s:g} s")
                if reused and attempt == 0:
                    continue
                return CheckResult(False, "error", str(error))
            worker.used = True
            self._release(worker)
            return CheckResult(
                bool(reply.get("correct")), str(reply.get("method", "error")), str(reply.get("detail", ""))
            )
        return CheckResult(False, "error", "no worker could check the answer")  # pragma: no cover

    def _acquire(self) -> MathWorker:
        state = self._state
        with state.condition:
            while True:
                while state.idle:
                    worker = state.idle.pop()
                    if worker.alive():
                        return worker
                    state.workers.discard(worker)
                    worker.kill()
                if len(state.workers) + state.starting < self.max_workers:
                    state.starting += 1
                    break
                state.condition.wait()
        try:
            worker = MathWorker(self.memory_mb)  # outside the lock: start-up takes a while
        except BaseException:
            with state.condition:
                state.starting -= 1
                state.condition.notify()
            raise
        with state.condition:
            state.starting -= 1
            state.workers.add(worker)
        return worker

    def _release(self, worker: MathWorker) -> None:
        state = self._state
        with state.condition:
            if worker in state.workers and worker.alive():
                state.idle.append(worker)
            else:
                state.workers.discard(worker)
                worker.kill()
            state.condition.notify()

    def _cache_get(self, key: tuple[str, str]) -> CheckResult | None:
        if self.cache_size <= 0:
            return None
        with self._cache_lock:
            result = self._cache.get(key)
            if result is not None:
                self._cache.move_to_end(key)
            return result

    def _cache_put(self, key: tuple[str, str], result: CheckResult) -> None:
        if self.cache_size <= 0 or result.method == "error":
            return
        with self._cache_lock:
            if result.method == "timeout":
                if key not in self._timeouts:
                    self._timeouts[key] = None  # first strike: remember, do not cache yet
                    while len(self._timeouts) > self.cache_size:
                        self._timeouts.popitem(last=False)
                    return
                del self._timeouts[key]
            self._cache[key] = result
            self._cache.move_to_end(key)
            while len(self._cache) > self.cache_size:
                self._cache.popitem(last=False)

    def _lease_changed(self, delta: int) -> None:
        state = self._state
        with state.condition:
            while state.released:
                state.leases -= state.released.popleft()
            state.leases += delta
            stop = state.leases <= 0
        if stop and delta < 0:
            shutdown_pool(state, busy_too=False)

    def _reset_after_fork(self) -> None:
        # Runs in the child only. The parent's workers are left alone (not killed, not used).
        self._cache_lock = threading.Lock()
        old = self._state
        self._state = PoolState()
        self._state.leases = old.leases
        self._finalizer.detach()
        self._finalizer = weakref.finalize(self, shutdown_pool, self._state)


def _rebuild_checker(*args: Any) -> AnswerChecker:
    timeout_s, max_workers, max_answer_chars, cache_size, memory_mb = args
    return AnswerChecker(
        timeout_s=timeout_s, max_workers=max_workers, max_answer_chars=max_answer_chars,
        cache_size=cache_size, memory_mb=memory_mb,
    )  # fmt: skip


class CheckerLease:
    """A claim on an :class:`AnswerChecker` held by one owner (an env and each of its clones).

    Copying a lease takes a new claim on the same checker. :meth:`release` gives it back (at most
    once); a lease dropped without release is given back when it is garbage-collected. The
    checker's workers stop when its last lease is given back.
    """

    def __init__(self, checker: AnswerChecker):
        self.checker = checker
        checker._lease_changed(+1)
        self._finalizer = weakref.finalize(self, _released_by_gc, checker)
        self._finalizer.atexit = False

    def release(self) -> None:
        if self._finalizer.detach() is not None:
            self.checker._lease_changed(-1)

    def __copy__(self) -> CheckerLease:
        return CheckerLease(self.checker)

    def __deepcopy__(self, memo: dict[int, Any]) -> CheckerLease:
        return CheckerLease(self.checker)

    def __reduce__(self) -> tuple[Any, ...]:
        if self is _DEFAULT:
            return (default_checker, ())  # the shared checker of the receiving process
        return (CheckerLease, (self.checker,))


def _released_by_gc(checker: AnswerChecker) -> None:
    # The GC may run this at any allocation, even inside the checker's lock: append only.
    checker._state.released.append(1)


_DEFAULT: AnswerChecker | None = None
_DEFAULT_LOCK = threading.Lock()


def default_checker() -> AnswerChecker:
    """The process-wide checker shared by every env that was not given one (created lazily)."""
    global _DEFAULT
    with _DEFAULT_LOCK:
        if _DEFAULT is None:
            _DEFAULT = AnswerChecker()
        return _DEFAULT


def check_answer(gold: str, pred: str) -> CheckResult:
    """Check one answer with :func:`default_checker`."""
    return default_checker().check(gold, pred)


@atexit.register
def _stop_all_workers() -> None:
    for checker in list(_LIVE_CHECKERS):
        shutdown_pool(checker._state, busy_too=True)
