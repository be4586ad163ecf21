"""The math-verify worker program run by :class:`llm_zoo.checkers.math_check.AnswerChecker`.

It runs in a fresh interpreter (``python -c <exec this file> PATH MEMORY_MB``), never imported by
the host. Protocol: one JSON object per line on stdin, one per line on stdout. Request
``{"gold", "pred", "timeout"}``; reply ``{"correct", "method", "detail"}``. The first line it
writes is ``{"ready": true}``, once math-verify is imported and warmed up. It exits when its stdin
closes (the host closed it, or died).

Inside, math-verify runs on the main thread, so its own ``SIGALRM`` timeouts work; each check also
gets a CPU-time limit (``RLIMIT_CPU``, a guard for a worker whose host died mid-check) and the
process an address-space limit. This file imports only the standard library and math-verify.
"""

from __future__ import annotations

import json
import logging
import os
import resource
import signal
import sys
from functools import lru_cache
from typing import Any


class _TimeoutFlag(logging.Handler):
    """Notes math-verify's "Timeout during ..." log lines: it returns a plain False on timeout."""

    hit = False

    def emit(self, record: logging.LogRecord) -> None:
        if "timeout" in record.getMessage().lower():
            _TimeoutFlag.hit = True


def _setup(memory_mb: int) -> Any:
    """Limits, signals, logging; returns the protocol stream (the original stdout)."""
    paths = json.loads(os.environ.pop("LLM_ZOO_SYS_PATH", "[]"))
    if paths:
        sys.path[:] = paths  # import exactly what the host can import
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal ^C is the host's business
    memory = int(memory_mb) << 20
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    protocol = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)  # stray prints from libraries must not corrupt the protocol
    flag = _TimeoutFlag()
    for name in ("math_verify", "math_verify.grader", "math_verify.parser"):
        logger = logging.getLogger(name)
        logger.addHandler(flag)
        logger.propagate = False
        logger.setLevel(logging.WARNING)
    return protocol


def _limit_cpu(seconds: int) -> None:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    soft = int(usage.ru_utime + usage.ru_stime) + seconds
    hard = resource.getrlimit(resource.RLIMIT_CPU)[1]
    resource.setrlimit(resource.RLIMIT_CPU, (soft if hard < 0 else min(soft, hard), hard))


def main() -> None:
    protocol = _setup(int(sys.argv[2]))
    from math_verify import parse, verify

    @lru_cache(maxsize=512)
    def parse_gold(text: str, timeout: int) -> Any:
        return parse("\\boxed{" + text + "}", parsing_timeout=timeout)

    def check(gold: str, pred: str, timeout: float) -> tuple[bool, str, str]:
        # math-verify's own limits are whole seconds, per parse and per comparison; the host's
        # hard timeout bounds the total.
        inner = max(1, int(timeout / 4))
        _limit_cpu(int(timeout) + 2)
        _TimeoutFlag.hit = False
        gold_parsed = parse_gold(gold, inner)
        if not gold_parsed:
            return (
                False,
                ("timeout" if _TimeoutFlag.hit else "math_verify"),
                "gold answer could not be parsed",
            )
        pred_parsed = parse("\\boxed{" + pred + "}", parsing_timeout=inner)
        if not pred_parsed:
            return False, ("timeout" if _TimeoutFlag.hit else "math_verify"), "answer could not be parsed"
        correct = bool(verify(gold_parsed, pred_parsed, timeout_seconds=inner))
        if _TimeoutFlag.hit and not correct:
            return False, "timeout", "math-verify timed out"
        return correct, "math_verify", "equivalent" if correct else "not equivalent"

    check("1/2", "0.5", 5)  # warm up: the first check imports much of sympy
    protocol.write('{"ready": true}\n')
    protocol.flush()
    for line in sys.stdin:
        try:
            request = json.loads(line)
            correct, method, detail = check(
                str(request["gold"]), str(request["pred"]), float(request["timeout"])
            )
        except MemoryError:
            correct, method, detail = False, "error", "out of memory"
        except Exception as error:
            correct, method, detail = False, "error", f"{type(error).__name__}: {error}"[:200]
        protocol.write(json.dumps({"correct": correct, "method": method, "detail": detail}) + "\n")
        protocol.flush()


if __name__ == "__main__":
    main()
