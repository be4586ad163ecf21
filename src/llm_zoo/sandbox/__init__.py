"""Running untrusted, model-written Python programs.

Entry points: :func:`run_python` (one program), :func:`run_tests` (one program against many
standard inputs), :func:`run_many` (any batch of :class:`Job`), or a :class:`Sandbox` of your own.
Each run gives a :class:`RunResult`. Model text is never evaluated in the host process.

How a run works
---------------
A :class:`Sandbox` keeps a pool of *fork servers*: Python processes started once with the base
interpreter as ``python -s -S -B -P /proc/self/fd/N`` (standard library only; the server's code and
configuration are in that memory file, so nothing of the package directory is needed inside the
sandbox, and no command line, which ``ps`` shows to everyone, holds them; bubblewrap too reads its
options from a memory file, ``--args``). Each server pre-imports common modules, then forks a
*zygote* before it reads any job. For each run the server writes the program as ``main.py`` in a
new, empty work dir (also ``$HOME`` and ``$TMPDIR``) that no earlier run had: nothing an earlier
run left on its directory (files, extended attributes, a default ACL, timestamps, the memory they
are charged to) carries over. It hands the zygote memory files for the job, stdin, stdout and
stderr; the zygote
forks a child that gets those and nothing else, so a program's memory never holds another job's
code, input or output, not even freed. The child enters a new session and the run's memory
cgroup, sets its limits, drops to the server's sandbox uid, installs a seccomp filter and runs the
program as ``__main__`` the way ``python -I -B main.py`` would (same stdout, stderr, exit status,
tracebacks, ``atexit`` handlers, thread joins; ``random`` is reseeded per run). No interpreter
starts per run. Batches go to the servers in parallel (one per usable CPU by default) in chunks
of up to ``MAX_CHUNK`` jobs; each job is still its own child, run after the previous one was
cleaned up. Pools are thread-safe, closed at interpreter exit, and start afresh in a forked host.

After each run the work dir is removed without recursion (a chain thousands of directories deep
is fine) and within ``cleanup_bound_s`` (0.25 s) of the run's end. A run that left more (say a
hundred thousand hard links) makes its server retire after answering: its private ``/tmp``, a
tmpfs, goes with its namespaces (without namespaces the host removes the rest in the background,
before the uid is leased again), so the host pays at most that bound and the next run a new
server's start (about 0.1 s), never seconds of removal.

A server (or zygote) that dies loses only the job it was running (a progress pipe tells the host
which): the other unfinished jobs of its chunk go to a new server. The job that was running reruns
once, *alone*, after them: a death can be the program's doing or the sandbox's own (killed from
outside, a bug), and the rerun tells them apart. If its server dies again, the program gets a
result with ``error`` ("... died twice ...") and is not run a third time; if not, the rerun's
result stands. A job whose server missed its deadline is not rerun (it would cost the whole
timeout again): its result is ``timed_out`` with ``error`` set. Two servers in a row that die
before starting any job mean the sandbox itself fails: the chunk's jobs then carry ``error``.

Isolation layers
----------------
The layer is chosen once per process, the strongest that works (each is checked by a probe
program through a real server before first use), reported by :func:`isolation_layer` and
:func:`isolation_info` (which lists what holds and, under ``not_isolated``, what does not), and
can be forced with ``layer=`` or ``$LLM_ZOO_SANDBOX_LAYER`` (``bubblewrap``, ``rlimits`` or
``auto``; asking for one that does not work raises :class:`SandboxError` saying why).

Always, in both layers:

* Limits per run: CPU seconds (``ceil(timeout)``: SIGXCPU, SIGKILL a second later; reported as
  ``timed_out``), address space per process (``memory_mb``), processes and threads
  (``max_processes``), file size (``max_output_bytes``, also the cap on stdout and stderr),
  64 open files, no core dumps, no POSIX message queues. ``PR_SET_NO_NEW_PRIVS``.
* ``memory_mb`` over all of a run's processes, memfd and System V shared memory included, where
  this process may create memory cgroups (cgroup v2 ``memory.max`` with no swap, or a v1 memory
  hierarchy; as root on most machines): the OOM killer then stops the run (``exit_code`` -9).
  Without one, only the per-process address-space limit holds (warned about once).
* A seccomp filter (``llm_zoo.sandbox.seccomp``): no kernel keyrings (they are not namespaced
  and outlive processes), no user namespaces; sockets of the families ``AF_UNIX`` only, plus
  ``AF_INET``/``AF_INET6`` where a network namespace cuts the network (so ``AF_VSOCK``, a virtual
  machine's ports to its host, netlink and packet sockets are refused everywhere, and without
  namespaces the network is cut by this filter); ``io_uring``, ``perf_event_open``,
  ``userfaultfd``, ``bpf`` and ``memfd_secret`` refused (no program of this kind needs them).
* No capabilities in any set (effective, permitted, inheritable, ambient), except
  ``CAP_DAC_READ_SEARCH`` where the Python installation is not world-readable (``keep_read_search``).
* The wall-clock ``timeout``, after which the program is killed.
* Every program starts with ``oom_score_adj`` 1000: the OOM killer's first choice. It cannot go
  below the floor of the process that started the sandbox (below 1000 only where the program's
  process was set up holding CAP_SYS_RESOURCE, as root outside containers that drop it).
* No System V IPC (seccomp: ``ENOSYS``): its id sequence would carry bits from run to run.
* No memory outlives its run: after each run the server sets off the kernel's collection of
  in-flight Unix sockets (descriptors a program sent and never received, which nothing else
  frees: pipes, memory files, socket buffers), then reads what is still charged to its memory
  cgroup; above 4 MiB (page cache aside) the server retires, and the run's result says so in
  ``left_behind``: the next run, possibly another episode's, never starts with part of its
  ``memory_mb`` taken. A server whose cgroup refuses the next job's limit retires before that job
  starts, so the job runs elsewhere and is not blamed.
* Nothing outlives a run: the zygote is a child subreaper; after the program exits or is killed,
  every process of the run is SIGKILLed and reaped, its System V IPC objects (where seccomp cannot
  refuse them) removed and its work dir removed (see above).
* As root, programs run under a uid of their own, leased per server (``2000000000 + n``, an
  exclusive ``flock`` in ``/tmp/llm_zoo_sandbox_uids``): ``RLIMIT_NPROC`` then bounds fork bombs,
  and programs cannot signal or ptrace the host, read other processes' environments or write
  root-owned files. The host's environment variables never reach a program.
* Programs are as reproducible as Python allows: the hash seed is 0 (sets of strings iterate in
  the same order in every run) and ``random`` is seeded with 0 before each program, so the same
  program given the same input prints the same output and a training run's rewards do not
  depend on a program's draws. What reads the clock or ``os.urandom``, or prints a memory
  address (``<function f at 0x7f...>``, ``id(x)``: address-space randomisation and the fork
  server's heap), still differs, and a program near its ``timeout`` may pass on an idle machine
  and be killed on a busy one.

With namespaces (layer ``"bubblewrap"``, and the ``"rlimits"`` fallback wherever this process
may create namespaces: as root, or with unprivileged user namespaces), each server runs as pid 1
of its own pid, mount, network, IPC and UTS namespaces (when it dies, everything in them dies):

* no network: only a loopback, down or unreachable (connections fail); seccomp still refuses
  every socket family but ``AF_UNIX``, ``AF_INET`` and ``AF_INET6``;
* as root, ``/proc`` shows a program only its own processes (``hidepid=2``): not the server or
  the zygote, whose counters (page faults and CPU time of every run reaped) would carry bits
  from run to run; and every program is pid 3, whatever earlier runs forked (the zygote sets the
  pid namespace's next pid before each fork, where the kernel lets it: CAP_CHECKPOINT_RESTORE);
* a minimal read-only file system: ``/usr``, ``/bin``, ``/lib*``, a few ``/etc`` files, the
  interpreter and its standard library, fresh ``/proc`` (only the sandbox's processes) and
  ``/dev``, and a private ``/tmp`` tmpfs of ``disk_mb`` MiB holding the work dir. Every
  ``site-packages``/``dist-packages`` directory and the package's own directory are covered by an
  empty tmpfs, so the envs' hidden tests, reference solutions and gold answers, the project and
  any dataset file outside ``/usr`` are not there. Programs can write only their work dir.

Bubblewrap (Debian package ``bubblewrap``) runs with ``--as-pid-1 --die-with-parent``; as root
without a user namespace, the server keeping only the capabilities to set up and clean up runs;
as a normal user with ``--disable-userns`` where bubblewrap supports it. The fallback builds the
same view itself (``unshare`` and ``pivot_root``, see ``llm_zoo.sandbox.jail``).

Without namespaces (the plain ``"rlimits"`` fallback; a :class:`SandboxWarning` names what is
not isolated), programs read every file their uid may read (with
``CAP_DAC_READ_SEARCH`` when the Python installation is not world-readable: then every file, the
envs' hidden data included) and see the host's processes in ``/proc``; work dirs are made under
``/dev/shm`` where it is a tmpfs (a new directory per run costs milliseconds on a disk); as root, what the
program's uid leaves in ``/tmp``, ``/var/tmp`` and ``/dev/shm`` is removed after each run. As a
normal user without namespaces, programs run under your uid: they can signal your processes and
read or write your files, and their leftover files and IPC objects are not removed.

What a program can still learn about the host, with namespaces: ``/proc/1/cmdline`` is the
interpreter's path, ``-I -S -B`` and ``/proc/self/fd/N``; ``/proc/self/mountinfo`` lists the
bound paths (the interpreter, its standard library, ``/usr``, a few ``/etc`` files, each at the
host path it has inside), the host's disk device and its mount options, and, under bubblewrap,
its staging directory ``/newroot``; nothing of the project, the envs' data or the host's scratch
directories. What a program can learn of *earlier runs* on its server is listed, with bits per
run, under ``isolation_info()["channels_between_runs"]``. With namespaces as root every channel of
one server is closed; two host-wide ones stay open between any two programs on the host, runs of
other servers included: the page cache of the shared read-only files (16 bits a run measured) and
socket inode numbers (under 1.1 bits); ``/proc/stat`` and ``/proc/vmstat``, whose fork and page
counters carried 4 bits a run, cannot be opened. Each run gets a new tmpfs as its work dir (``disk_mb``, at most 16384
files; inode numbers and free space start afresh: a shared ``/tmp`` carried about 18 bits a run),
unmounted once the run's processes are gone, so the server removes nothing file by file. It costs
0.1 ms a run on an idle 2-core Xeon (a trivial program 2.84 -> 2.93 ms) and about 6 ms under load
(the unmount waits for an RCU grace period); ``LLM_ZOO_SANDBOX_RUN_TMP=0`` trades the channel for it.
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

from llm_zoo.sandbox.cancel import CANCELLED, cancel_when, current_cancel_event
from llm_zoo.sandbox.layers import (
    LAYER_ENV_VAR,
    LAYERS,
    SandboxWarning,
    describe,
    layer_plan,
    requested_layer,
)
from llm_zoo.sandbox.worker import SandboxError, Worker, WorkerDied, join_reapers

__all__ = [
    "CANCELLED",
    "DEFAULT_MAX_OUTPUT_BYTES",
    "DEFAULT_MAX_PROCESSES",
    "DEFAULT_MEMORY_MB",
    "DEFAULT_TIMEOUT_S",
    "LAYERS",
    "LAYER_ENV_VAR",
    "Job",
    "RunResult",
    "Sandbox",
    "SandboxError",
    "SandboxWarning",
    "cancel_when",
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
    """The layer programs run under: ``"bubblewrap"`` or ``"rlimits"`` (see the module docs)."""
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
