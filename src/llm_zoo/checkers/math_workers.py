"""The math-verify worker processes behind :class:`llm_zoo.checkers.math_check.AnswerChecker`.

:class:`MathWorker` starts one worker (``_math_worker.py``, in its own session and with a memory
limit) and exchanges one JSON line per check with it over pipes, with a hard timeout: a worker that
times out, exits or writes garbage is killed and :class:`WorkerDied` is raised.
:class:`PoolState` holds one process's workers (a forked child replaces it wholesale) and
:func:`shutdown_pool` kills them. The checker owns the pool logic (how many, who waits).
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
from typing import Any

__all__ = ["WORKER_START_TIMEOUT_S", "MathWorker", "PoolState", "WorkerDied", "shutdown_pool"]

#: Seconds a new worker may take to import math-verify and say it is ready (generous: the
#: machine may be loaded). Not part of any check's timeout.
WORKER_START_TIMEOUT_S = 60.0

_WORKER_PROGRAM = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_math_worker.py")
# Run the worker file through ``-c`` so that its directory (ours) is not put on its sys.path.
_BOOTSTRAP = "import sys; p = sys.argv[1]; exec(compile(open(p).read(), p, 'exec'))"


class WorkerDied(Exception):
    """The worker process exited, timed out or wrote garbage; it has been killed."""


class MathWorker:
    """One worker process and its pipes. Used by one thread at a time (the pool sees to it)."""

    def __init__(self, memory_mb: int):
        # The worker imports exactly what the caller can import; relative entries made absolute.
        paths = [os.path.abspath(p) for p in sys.path if isinstance(p, str)]
        env = dict(os.environ, LLM_ZOO_SYS_PATH=json.dumps(paths))
        try:
            self.process = subprocess.Popen(
                [sys.executable, "-c", _BOOTSTRAP, _WORKER_PROGRAM, str(int(memory_mb))],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                env=env,
                cwd="/",
                start_new_session=True,  # own process group: killed as a whole, spared a terminal ^C
                close_fds=True,
            )
        except OSError as error:
            raise WorkerDied(f"the math-verify worker did not start ({error})") from None
        self._buffer = b""
        self.used = False  # has answered a check (a reused worker may have died while idle)
        try:
            reply = self._read_line(WORKER_START_TIMEOUT_S)
        except WorkerDied:
            raise WorkerDied("the math-verify worker did not start (is math-verify installed?)") from None
        if not reply.get("ready"):
            self.kill()
            raise WorkerDied(f"unexpected first message from the worker: {reply!r}")

    @property
    def pid(self) -> int:
        return self.process.pid

    def alive(self) -> bool:
        return self.process.poll() is None

    def request(self, gold: str, pred: str, timeout_s: float) -> dict[str, Any]:
        message = json.dumps({"gold": gold, "pred": pred, "timeout": timeout_s}) + "\n"
        try:
            assert self.process.stdin is not None
            self.process.stdin.write(message.encode("utf-8", errors="replace"))
            self.process.stdin.flush()
        except (BrokenPipeError, OSError):
            self.kill()
            raise WorkerDied("the worker had exited") from None
        return self._read_line(timeout_s)

    def _read_line(self, timeout_s: float) -> dict[str, Any]:
        assert self.process.stdout is not None
        stream = self.process.stdout.fileno()
        deadline = time.monotonic() + timeout_s
        while b"\n" not in self._buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                self.kill()
                raise WorkerDied("timeout")
            ready, _, _ = select.select([stream], [], [], remaining)
            if ready:
                chunk = os.read(stream, 65536)
                if not chunk:
                    self.kill()
                    raise WorkerDied("the worker exited")
                self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        try:
            reply = json.loads(line)
        except ValueError:
            self.kill()
            raise WorkerDied("the worker wrote a malformed reply") from None
        if not isinstance(reply, dict):
            self.kill()
            raise WorkerDied("the worker wrote a malformed reply")
        return reply

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, signal.SIGKILL)
        for stream in (self.process.stdin, self.process.stdout):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()
        with contextlib.suppress(subprocess.TimeoutExpired):  # SIGKILL does not fail; be safe
            self.process.wait(timeout=5)


class PoolState:
    """Everything that belongs to one process: a forked child replaces it wholesale."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.condition = threading.Condition()
        self.idle: list[MathWorker] = []
        self.workers: set[MathWorker] = set()  # idle and busy
        self.starting = 0  # workers being started (counted against max_workers)
        self.leases = 0
        self.released: collections.deque[int] = collections.deque()  # releases done by the GC


def shutdown_pool(state: PoolState, *, busy_too: bool = True) -> None:
    """Kill the workers of ``state``. With ``busy_too=False`` a worker in the middle of a check
    is only disowned: it is killed when that check returns it."""
    if state.pid != os.getpid():
        return  # inherited by a forked child: these are the parent's workers
    with state.condition:
        doomed = list(state.workers) if busy_too else list(state.idle)
        state.workers.clear()
        state.idle.clear()
    for worker in doomed:
        worker.kill()
