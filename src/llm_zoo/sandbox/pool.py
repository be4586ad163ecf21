"""The implementation of :mod:`llm_zoo.sandbox`'s public API: the :class:`Sandbox` pool of fork
servers, the :class:`Job` it runs and the :class:`RunResult` it gives, the shared default sandboxes
and the entry points :func:`run_python`, :func:`run_tests` and :func:`run_many`.

It lives apart from the package's ``__init__`` so that the package holds the sandbox's
documentation (how a run works, what each isolation layer contains) and its public names, and this
module the host side that hands jobs to the servers (:mod:`llm_zoo.sandbox.worker`), reruns the
job of a server that died and keeps the pool sound across threads, forks and interpreter exit.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import math
import os
import threading
import weakref
from collections.abc import Iterable, Sequence

from llm_zoo.sandbox.cancel import CANCELLED, current_cancel_event
from llm_zoo.sandbox.layers import describe, layer_plan, requested_layer
from llm_zoo.sandbox.worker import SandboxError, Worker, WorkerDied, join_reapers

__all__ = [
    "CANCEL_POLL_S",
    "DEFAULT_DISK_MB",
    "DEFAULT_MAX_OUTPUT_BYTES",
    "DEFAULT_MAX_PROCESSES",
    "DEFAULT_MEMORY_MB",
    "DEFAULT_TIMEOUT_S",
    "MAX_CHUNK",
    "Job",
    "RunResult",
    "Sandbox",
    "default_sandbox",
    "isolation_info",
    "isolation_layer",
    "run_many",
    "run_python",
    "run_tests",
]

DEFAULT_TIMEOUT_S = 5.0
DEFAULT_MEMORY_MB = 512
DEFAULT_MAX_OUTPUT_BYTES = 1 << 20
DEFAULT_MAX_PROCESSES = 64
DEFAULT_DISK_MB = 256
MAX_CHUNK = 8  # jobs per message to a server (fewer wake-ups; small enough to balance the load)


@dataclasses.dataclass
class RunResult:
    """The outcome of one sandboxed run.

    Attributes:
        stdout: What the program printed (decoded UTF-8, undecodable bytes replaced), at most
            the output cap.
        stderr: Its standard error, same cap.
        exit_code: The process exit status; negative for a signal (``-9`` for SIGKILL); ``None``
            if it never ran or the sandbox failed (see ``error``).
        timed_out: Stopped for exceeding its time: the wall-clock timeout, or the CPU-time limit.
        duration_s: Wall-clock seconds from start to exit.
        output_truncated: stdout or stderr reached the cap.
        cpu_s: CPU seconds the program's own process used (user + system).
        layer: The isolation layer it ran under (``"bubblewrap"`` or ``"rlimits"``).
        memory_exceeded: The OOM killer stopped a process of the run: together they reached
            ``memory_mb`` (only where a memory cgroup is in force, see :func:`isolation_info`).
        error: Set when the sandbox itself failed (the result says nothing about the program).
        left_behind: Set when the run left something that outlived all its processes (memory
            still charged to its server's cgroup, e.g. descriptors in flight on a Unix socket);
            its server retired so that no later run pays for it. The program is to blame: an env
            may penalise it. ``None`` for an ordinary run.
    """

    stdout: str
    stderr: str
    exit_code: int | None
    timed_out: bool
    duration_s: float
    output_truncated: bool = False
    cpu_s: float = 0.0
    layer: str = ""
    error: str | None = None
    memory_exceeded: bool = False
    left_behind: str | None = None

    @property
    def ok(self) -> bool:
        """Exited normally with status 0 within the time limit."""
        return self.exit_code == 0 and not self.timed_out and self.error is None


@dataclasses.dataclass(frozen=True)
class Job:
    """One program run: the program, its standard input and its limits.

    Attributes:
        code: Program source (untrusted).
        stdin: Text fed to its standard input.
        timeout: Wall-clock seconds before it is killed; its CPU time is limited to
            ``ceil(timeout)`` seconds too.
        memory_mb: Address-space limit in MiB.
        max_output_bytes: Cap on each of stdout and stderr, and on any file it writes.
        max_processes: Processes (and threads) it may have at once, itself included.
    """

    code: str
    stdin: str = ""
    timeout: float = DEFAULT_TIMEOUT_S
    memory_mb: int = DEFAULT_MEMORY_MB
    max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES
    max_processes: int = DEFAULT_MAX_PROCESSES

    def __post_init__(self) -> None:
        if not isinstance(self.code, str) or not isinstance(self.stdin, str):
            raise TypeError("Job.code and Job.stdin must be str")
        if not (isinstance(self.timeout, (int, float)) and math.isfinite(self.timeout) and self.timeout > 0):
            raise ValueError(f"timeout must be a positive number of seconds, got {self.timeout!r}")
        for name, minimum in (("memory_mb", 16), ("max_output_bytes", 0), ("max_processes", 1)):
            value = getattr(self, name)
            if not isinstance(value, int) or value < minimum:
                raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")

    def _request(self) -> dict:
        return {
            "timeout": float(self.timeout),
            "memory_mb": self.memory_mb,
            "max_output_bytes": self.max_output_bytes,
            "max_processes": self.max_processes,
        }


_live_sandboxes: weakref.WeakSet[Sandbox] = weakref.WeakSet()


#: How often a run that may be cancelled checks, while it waits for a free server.
CANCEL_POLL_S = 0.1


class _Cancelled(Exception):
    """The caller cancelled (``llm_zoo.sandbox.cancel``) while its jobs waited for a server."""


class Sandbox:
    """A pool of fork servers under one isolation layer; safe to share between threads.

    Servers start on demand, up to ``workers``, and are reused; one that dies is replaced. Close
    with :meth:`close` or a ``with`` block; any left open are closed at interpreter exit. In a
    process forked from the one that made it, a sandbox starts servers of its own.

    Args:
        layer: ``"bubblewrap"``, ``"rlimits"`` or ``"auto"``/``None`` (``$LLM_ZOO_SANDBOX_LAYER``,
            else the strongest that works). Asking for a layer that does not work here raises
            :class:`SandboxError` saying why.
        workers: Most runs at once (default: the CPUs this process may use).
        disk_mb: Size of each server's private ``/tmp`` under bubblewrap (bounds a run's files).
    """

    def __init__(
        self, layer: str | None = None, *, workers: int | None = None, disk_mb: int = DEFAULT_DISK_MB
    ):
        self._plan = layer_plan(layer)
        count = workers if workers is not None else len(os.sched_getaffinity(0))
        if not isinstance(count, int) or count < 1:
            raise ValueError(f"workers must be a positive int, got {workers!r}")
        self.workers = count
        self.disk_mb = int(disk_mb)
        self._reset_state()
        _live_sandboxes.add(self)

    def _reset_state(self) -> None:
        self._cond = threading.Condition()
        self._idle: list[Worker] = []
        self._workers: set[Worker] = set()  # idle and busy
        self._started = 0
        self._closed = False
        self._owner_pid = os.getpid()

    @property
    def layer(self) -> str:
        """The isolation layer its programs run under."""
        return self._plan.name

    def isolation_info(self) -> dict:
        """What this sandbox's layer protects (see :func:`isolation_info`)."""
        return describe(self._plan, self._plan.name)

    def run(
        self,
        code: str,
        *,
        stdin: str = "",
        timeout: float = DEFAULT_TIMEOUT_S,
        memory_mb: int = DEFAULT_MEMORY_MB,
        max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES,
        max_processes: int = DEFAULT_MAX_PROCESSES,
    ) -> RunResult:
        """Run one program (see :class:`Job` for the arguments)."""
        return self._run_job(Job(code, stdin, timeout, memory_mb, max_output_bytes, max_processes))

    def run_tests(self, code: str, stdins: Iterable[str], **limits: float) -> list[RunResult]:
        """Run one program once per standard input, in parallel; results in input order.

        ``limits`` are :class:`Job`'s ``timeout``, ``memory_mb``, ``max_output_bytes``,
        ``max_processes``, applied to every run.
        """
        return self.run_many([Job(code, stdin, **limits) for stdin in stdins])  # type: ignore[arg-type]

    def run_many(self, jobs: Iterable[Job]) -> list[RunResult]:
        """Run every job, up to ``workers`` at once; results in job order.

        Jobs travel to the servers in small chunks (one message each way per chunk, not per
        job). Chunks take every ``k``-th job, so the tests of one slow program are spread over
        the servers rather than queued behind each other.
        """
        jobs = list(jobs)
        for job in jobs:
            if not isinstance(job, Job):
                raise TypeError(f"run_many takes Job objects, got {type(job).__name__}")
        cancel = (
            current_cancel_event()
        )  # the caller's (llm_zoo.sandbox.cancel): the drains run on other threads
        chunk_size = max(1, min(MAX_CHUNK, len(jobs) // (2 * self.workers)))
        chunk_count = -(-len(jobs) // chunk_size)
        chunks = [list(range(first, len(jobs), chunk_count)) for first in range(chunk_count)]
        results: list[RunResult | None] = [None] * len(jobs)
        pending = iter(chunks)
        lock = threading.Lock()
        failures: list[BaseException] = []

        def drain() -> None:
            while not failures and not (cancel is not None and cancel.is_set()):
                with lock:
                    chunk = next(pending, None)
                if chunk is None:
                    return
                try:
                    chunk_results = self._run_chunk([jobs[i] for i in chunk], cancel)
                    for index, result in zip(chunk, chunk_results, strict=True):
                        results[index] = result
                except BaseException as exc:
                    failures.append(exc)

        threads = min(len(chunks), self.workers)
        if threads <= 1:
            drain()
        else:
            runners = [
                threading.Thread(target=drain, name=f"llm_zoo-sandbox-{i}", daemon=True)
                for i in range(threads)
            ]
            for runner in runners:
                runner.start()
            for runner in runners:
                runner.join()
        if failures:
            raise failures[0]
        return [self._failed(CANCELLED) if result is None else result for result in results]

    def close(self) -> None:
        """Stop every server (idle ones now; busy ones when their run ends)."""
        with self._cond:
            self._closed = True
            idle, self._idle = self._idle, []
            self._cond.notify_all()
        for worker in idle:
            worker.close()

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # ----------------------------------------------------------------------------------- internals
    def _run_job(self, job: Job) -> RunResult:
        cancel = current_cancel_event()
        if cancel is not None and cancel.is_set():
            return self._failed(CANCELLED)
        return self._run_chunk([job], cancel)[0]

    def _run_chunk(self, jobs: list[Job], cancel: threading.Event | None = None) -> list[RunResult]:
        """Run ``jobs`` on one server, one after the other; on others if servers die.

        A server that dies loses only the job it was running (its progress pipe says which): the
        chunk's other unfinished jobs go to a new server. The job that was running reruns once,
        alone, at the end: if its server dies again the program is the cause, and it gets a result
        with ``error`` set; if not, the first death was the sandbox's own, and its result stands.
        A job whose server missed its deadline is not rerun (a rerun would cost the whole timeout
        again): it is reported ``timed_out`` with ``error`` set. The rerun gets a server that has run
        nothing else (a server other jobs used may carry what they left), and a server that retires
        before a job (its cgroup refused the job's memory limit) costs that job nothing. Once
        ``cancel`` is set, jobs still waiting for a server get :data:`CANCELLED` instead.
        """
        payloads = [
            (
                job._request(),
                job.code.encode("utf-8", errors="surrogatepass"),
                job.stdin.encode("utf-8", errors="replace"),
            )
            for job in jobs
        ]
        results: list[RunResult | None] = [None] * len(jobs)
        todo = list(range(len(jobs)))
        suspects: list[int] = []
        barren = 0  # servers in a row that died before starting any job
        while todo:
            try:
                replies = self._execute([payloads[i] for i in todo], cancel=cancel)
            except _Cancelled:
                for index in todo + suspects:
                    results[index] = self._failed(CANCELLED)
                return results  # type: ignore[return-value]
            except WorkerDied as exc:
                if exc.started == 0:
                    barren += 1
                    if barren == 2:  # the sandbox itself is failing, not a program
                        for index in todo:
                            results[index] = self._failed(str(exc), exc.missed_deadline)
                        return results  # type: ignore[return-value]
                    continue
                barren = 0
                culprit = todo.pop(min(exc.started, len(todo)) - 1)
                if exc.missed_deadline:
                    results[culprit] = self._failed(str(exc), timed_out=True)
                else:
                    suspects.append(culprit)
                continue
            barren = 0
            for index, reply in zip(todo, replies, strict=False):
                results[index] = self._result(*reply)
            todo = todo[len(replies) :]
        for culprit in suspects:
            try:
                (reply,) = self._execute([payloads[culprit]], fresh=True, cancel=cancel)
            except _Cancelled:
                results[culprit] = self._failed(CANCELLED)
            except WorkerDied as exc:
                message = f"the program's sandbox server died twice while running it: {exc}"
                results[culprit] = self._failed(message, exc.missed_deadline)
            else:
                results[culprit] = self._result(*reply)
        return results  # type: ignore[return-value]

    def _execute(
        self,
        payloads: list[tuple[dict, bytes, bytes]],
        *,
        fresh: bool = False,
        cancel: threading.Event | None = None,
    ) -> list[tuple[dict, bytes, bytes]]:
        """Run ``payloads`` on an idle (or new; with ``fresh``, always new) server; a server that
        dies or retires is let go. Fewer replies than payloads: the server retired first; none:
        it retired before the first job (its cgroup refused the job's memory limit), which raises
        :class:`WorkerDied` with no job started, so the job is not blamed. ``cancel`` set while
        waiting for a server, or while it runs the payloads (the server and its programs are then
        killed), raises :class:`_Cancelled`."""
        worker = self._acquire(fresh=fresh, cancel=cancel)
        finished = threading.Event()
        if cancel is not None:
            threading.Thread(
                target=_kill_when_cancelled, args=(worker, cancel, finished), name="llm_zoo-sandbox-cancel",
                daemon=True,
            ).start()  # fmt: skip
        try:
            replies, retired = worker.execute(payloads)
        except BaseException:
            self._release(worker, broken=True)
            if cancel is not None and cancel.is_set():
                raise _Cancelled from None
            raise
        finally:
            finished.set()
        self._release(worker, broken=retired)
        if not replies:
            raise WorkerDied(f"the sandbox server retired before a run: {worker.refused}")
        return replies

    def _failed(self, message: str, timed_out: bool = False) -> RunResult:
        return RunResult("", "", None, timed_out, 0.0, layer=self.layer, error=message)

    def _result(self, header: dict, stdout: bytes, stderr: bytes) -> RunResult:
        return RunResult(
            stdout=stdout.decode("utf-8", errors="replace"),
            stderr=stderr.decode("utf-8", errors="replace"),
            exit_code=header["exit_code"],
            timed_out=bool(header["timed_out"]),
            duration_s=float(header["duration_s"]),
            output_truncated=bool(header["output_truncated"]),
            cpu_s=float(header["cpu_s"]),
            layer=self.layer,
            error=header.get("error"),
            memory_exceeded=bool(header.get("memory_exceeded")),
            left_behind=header.get("left_behind"),
        )

    def _acquire(self, *, fresh: bool = False, cancel: threading.Event | None = None) -> Worker:
        stale = None
        with self._cond:
            if self._owner_pid != os.getpid():
                self._forget_after_fork()
            while True:
                if self._closed:
                    raise SandboxError("this Sandbox is closed")
                if cancel is not None and cancel.is_set():
                    raise _Cancelled
                if self._idle and not fresh:
                    return self._idle.pop()
                if self._idle:  # its slot goes to a new server
                    stale = self._idle.pop()
                    self._workers.discard(stale)
                    break
                if self._started < self.workers:
                    self._started += 1
                    break
                # A cancelled caller must not wait its turn: a client that left 40 slow Code-v0
                # steps held its next make 157 s while their chunks queued for the servers.
                self._cond.wait(timeout=CANCEL_POLL_S if cancel is not None else None)
        if stale is not None:
            stale.close()
        try:
            worker = Worker(self._plan, self.disk_mb)  # started outside the lock: starts overlap
        except BaseException:
            with self._cond:
                self._started -= 1
                self._cond.notify()
            raise
        with self._cond:
            self._workers.add(worker)
        return worker

    def _release(self, worker: Worker, *, broken: bool = False) -> None:
        with self._cond:
            keep = not broken and not self._closed and worker.alive and self._owner_pid == os.getpid()
            if keep:
                self._idle.append(worker)
            elif worker in self._workers:
                self._workers.discard(worker)
                self._started -= 1
            self._cond.notify()
        if not keep:
            worker.kill(background=True) if broken else worker.close()

    def _forget_after_fork(self) -> None:
        """In a forked child: let go of the parent's servers (never kill them) and start afresh."""
        for worker in self._workers:
            worker.abandon()
        self._reset_state()


def _kill_when_cancelled(worker: Worker, cancel: threading.Event, finished: threading.Event) -> None:
    """Kill ``worker`` (the server and its running programs) if ``cancel`` is set before
    ``finished``: programs of a caller that left ran on to their limits, and under load (64 busy
    programs on 2 cores) those limits took minutes of wall time."""
    while not finished.is_set():
        if cancel.wait(CANCEL_POLL_S):
            if not finished.is_set():
                worker.kill(background=True)
            return


def _close_all_at_exit() -> None:
    for sandbox in list(_live_sandboxes):
        with contextlib.suppress(Exception):
            if sandbox._owner_pid == os.getpid():
                sandbox.close()
    join_reapers()


def _after_fork_in_child() -> None:
    global _default_lock
    _default_lock = threading.Lock()  # another thread may have held it at fork time
    for sandbox in list(_live_sandboxes):
        sandbox._forget_after_fork()


atexit.register(_close_all_at_exit)
os.register_at_fork(after_in_child=_after_fork_in_child)

_default_lock = threading.Lock()
_defaults: dict[str, Sandbox] = {}


def default_sandbox(layer: str | None = None) -> Sandbox:
    """The shared :class:`Sandbox` for ``layer`` (see :class:`Sandbox`), made on first use."""
    name = layer_plan(layer).name
    with _default_lock:
        sandbox = _defaults.get(name)
        if sandbox is None or sandbox._closed:
            sandbox = _defaults[name] = Sandbox(name)
        return sandbox


def isolation_layer(layer: str | None = None) -> str:
    """The layer programs run under: ``"bubblewrap"`` or ``"rlimits"`` (see :mod:`llm_zoo.sandbox`)."""
    return layer_plan(layer).name


def isolation_info(layer: str | None = None) -> dict:
    """What the active (or given) layer protects here, checked by its probe.

    Keys: ``layer``, ``requested``; ``namespaces`` (own pid, mount, network, IPC and UTS
    namespaces), ``network_cut`` (by a network namespace, or by seccomp's socket families),
    ``read_only_root`` and ``host_files_hidden`` (a minimal
    read-only view: the envs' hidden data and package directories are not in it),
    ``private_tmp`` (``/tmp``, ``/dev/shm`` of its own, nothing left between runs) and
    ``private_proc``; ``uid_drop``, ``keep_read_search``, ``leftover_cleanup``; ``memory_limit``
    (the mechanism that enforces ``memory_mb``) and ``memory_total`` (whether it bounds all of a
    run's processes, memfd and shared memory included); ``fresh_process_image`` (each program is
    forked from a zygote that never held a job); ``fresh_workdir`` (a work dir no earlier run
    had); ``cleanup_bound_s`` and ``cleanup`` (how long removing a run's leftovers may take, and
    what happens beyond); ``server_death`` (which jobs a dying server costs); ``socket_families``
    and ``syscalls_refused`` (the seccomp filter); ``capabilities`` (what programs hold);
    ``server_command_line`` (what ``ps`` shows of a server); ``keyrings``; ``userns_disabled``;
    ``channels_between_runs`` (what a program can read that earlier runs on its server changed,
    each closed or open with its bits per run); ``oom_score_adj`` (where programs stand for the
    OOM killer); ``not_isolated`` (what this layer leaves open; empty when nothing) and ``notes``.
    """
    return describe(layer_plan(layer), requested_layer(layer))


def run_python(
    code: str,
    *,
    stdin: str = "",
    timeout: float = DEFAULT_TIMEOUT_S,
    memory_mb: int = DEFAULT_MEMORY_MB,
    max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES,
    max_processes: int = DEFAULT_MAX_PROCESSES,
    layer: str | None = None,
) -> RunResult:
    """Run ``code`` as a Python program with ``stdin`` as its standard input.

    Args:
        code: Program source (untrusted).
        stdin: Text fed to its standard input.
        timeout: Wall-clock seconds before its whole session is killed. CPU time is limited to
            the same number of seconds (rounded up).
        memory_mb: Address-space limit in MiB.
        max_output_bytes: Cap on each of stdout and stderr (also the limit on any file written).
        max_processes: Processes it may have at once (RLIMIT_NPROC), containing fork bombs.
        layer: Isolation layer (default: ``$LLM_ZOO_SANDBOX_LAYER``, else the strongest here).
    """
    return default_sandbox(layer).run(
        code, stdin=stdin, timeout=timeout, memory_mb=memory_mb,
        max_output_bytes=max_output_bytes, max_processes=max_processes,
    )  # fmt: skip


def run_tests(
    code: str, stdins: Sequence[str], *, layer: str | None = None, **limits: float
) -> list[RunResult]:
    """Run one program against many standard inputs in parallel (see :meth:`Sandbox.run_tests`)."""
    return default_sandbox(layer).run_tests(code, stdins, **limits)


def run_many(jobs: Iterable[Job], *, layer: str | None = None) -> list[RunResult]:
    """Run a batch of jobs in parallel, results in order (see :meth:`Sandbox.run_many`)."""
    return default_sandbox(layer).run_many(jobs)
