"""Running untrusted, model-written Python programs.

Entry points: :func:`run_python` (one program), :func:`run_tests` (one program against many
standard inputs), :func:`run_many` (any batch of :class:`Job`), or a :class:`Sandbox` of your own.
Each run gives a :class:`RunResult`. Model text is never evaluated in the host process.

How a run works
---------------
A :class:`Sandbox` keeps a pool of *fork servers* (``llm_zoo/_sandbox_server.py``): clean Python
processes started once (with ``python -I -B``), common modules pre-imported. For each run a server
forks a child that enters a new session, gets a fresh empty work dir (``main.py`` inside, also
``$HOME`` and ``$TMPDIR``), an environment of only ``PATH``, ``HOME``, ``TMPDIR``, ``LANG``,
stdin/stdout/stderr on private memory files, no other file descriptor, resource limits and the
server's sandbox uid, then runs the program as ``__main__`` the way ``python -I -B main.py`` would
(same stdout, stderr, exit status, tracebacks, ``atexit`` handlers, thread joins; ``random`` is
reseeded per run). No interpreter starts per run and no ``preexec_fn`` is used. Batches go to the
servers in parallel (one server per usable CPU by default), in chunks of up to ``MAX_CHUNK`` jobs
per message; every job is still its own child, run after the previous one of that server has been
cleaned up, so one run cannot disturb another. A server that dies is replaced and its unfinished
jobs rerun once; pools are thread-safe, closed at interpreter exit, and start afresh in a forked
copy of the host (the parent's servers are left to the parent).

Isolation layers
----------------
The layer is chosen once per process, the strongest that works (each is checked by a probe
program through a real server before first use), reported by :func:`isolation_layer` and
:func:`isolation_info`, and can be forced with ``layer=`` or ``$LLM_ZOO_SANDBOX_LAYER``
(``bubblewrap``, ``rlimits`` or ``auto``; asking for one that does not work raises
:class:`SandboxError` saying why).

Always, in both layers:

* Limits per run: CPU seconds (``ceil(timeout)``: SIGXCPU, SIGKILL a second later; reported as
  ``timed_out``), address space (``memory_mb``), processes and threads (``max_processes``), file
  size (``max_output_bytes``, also the cap on stdout and stderr: writes beyond it fail with
  ``EFBIG``), 64 open files, no core dumps, no POSIX message queues (``RLIMIT_MSGQUEUE`` 0).
  ``PR_SET_NO_NEW_PRIVS``: no setuid binary or file capability can raise a program's privileges.
* The wall-clock ``timeout``, after which the program is killed.
* Nothing outlives a run: the server is a child subreaper, so every descendant of the program,
  double-forked ``setsid`` daemons included, is reparented to it; after the program exits or is
  killed, the server SIGKILLs them all (``kill(-1)`` in its pid namespace or as the sandbox uid:
  atomic against forks) and reaps until it has no child left. System V shared memory, message
  queues and semaphores the run created are removed (they outlive processes and no limit bounds
  them), and the work dir is emptied.
* As root (CI and these machines), programs run under a uid of their own, leased per server
  (``2000000000 + n``, an exclusive ``flock`` in ``/tmp/llm_zoo_sandbox_uids``). This matters:
  the kernel does not enforce ``RLIMIT_NPROC`` for root, so without it a fork bomb is not bounded.
  The program cannot signal or ptrace the host, its server or other runs, cannot read
  ``/proc/<pid>/environ`` of other processes, and cannot write root-owned files. The host's
  environment variables never reach a program (servers start with an empty environment).

Layer ``"bubblewrap"`` (``bwrap`` installed and usable; Debian package ``bubblewrap``) starts each
server in its own bubblewrap sandbox (one per server, not per run: a run costs a fork, not a
bubblewrap start), which adds:

* no network: an own network namespace with only a loopback (connections fail);
* own pid, IPC, UTS and cgroup namespaces: a program sees only its server and its own processes;
* a minimal, read-only file system: ``/usr``, the Python installation and its ``sys.path``, a few
  ``/etc`` files (``ld.so.cache``, ``passwd``, ``group``, ``hosts``, ``localtime``, ...), fresh
  ``/proc`` and ``/dev``, and a private ``/tmp`` tmpfs of ``disk_mb`` MiB holding the work dir
  (so a run's files are bounded in total). Home directories, the project, the host's ``/tmp`` and
  all else do not exist there; writes anywhere but the work dir fail;
* as root, no user namespace: the server keeps only the capabilities to set up and clean up runs
  (setuid, setgid, chown, kill, dac_override, fowner); programs, under their own uid, have none.

As a normal user, bubblewrap uses a user namespace with one uid: programs share their server's uid
(they can signal it; it is then replaced), ``RLIMIT_NPROC`` counts per user namespace (Linux >=
5.14), and the server empties the sandbox's ``/tmp`` and ``/dev/shm`` after each run.

Layer ``"rlimits"`` (fallback) contains what "always" lists above. It does NOT contain:

* the network: programs can open any connection the host can;
* reading files: a program reads what its uid may read. When the Python installation is not
  readable by other users (e.g. pyenv under a 0700 ``/root``, as on these machines), programs
  keep ``CAP_DAC_READ_SEARCH`` so they can import the standard library, and can then read every
  file (but not write it, nor read other processes' environments);
* writing world-writable places (``/tmp``, ``/var/tmp``, ``/dev/shm``): files left there stay
  (owned by the sandbox uid);
* total disk use: each file is capped, the number of files only by the time limit;
* visibility: ``/proc`` shows the host's processes and their command lines.

Running as a normal user without bubblewrap is weaker still: programs run under your uid, so
``RLIMIT_NPROC`` counts all your processes (the limit is set above your current count), a program
can signal or ptrace your processes (its server, the host) and read or write your files, and
System V IPC objects cannot be told from yours (they are left). While its server lives, a run's
leftover processes are still killed; a program that kills its server gets an ``error`` result and
its orphans may survive.
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

from llm_zoo._sandbox_layers import (
    LAYER_ENV_VAR,
    LAYERS,
    SandboxWarning,
    layer_plan,
    not_isolated,
    requested_layer,
)
from llm_zoo._sandbox_worker import LayerPlan, SandboxError, Worker, WorkerDied, seccomp_available

__all__ = [
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
        error: Set when the sandbox itself failed (the result says nothing about the program).
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
        return _describe(self._plan, self._plan.name)

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
        chunk_size = max(1, min(MAX_CHUNK, len(jobs) // (2 * self.workers)))
        chunk_count = -(-len(jobs) // chunk_size)
        chunks = [list(range(first, len(jobs), chunk_count)) for first in range(chunk_count)]
        results: list[RunResult | None] = [None] * len(jobs)
        pending = iter(chunks)
        lock = threading.Lock()
        failures: list[BaseException] = []

        def drain() -> None:
            while not failures:
                with lock:
                    chunk = next(pending, None)
                if chunk is None:
                    return
                try:
                    for index, result in zip(chunk, self._run_chunk([jobs[i] for i in chunk]), strict=True):
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
        return results  # type: ignore[return-value]

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
        return self._run_chunk([job])[0]

    def _run_chunk(self, jobs: list[Job]) -> list[RunResult]:
        """Run ``jobs`` on one server, one after the other; on another if that server dies.

        A server that died under a chunk is replaced and the chunk's unfinished jobs retried once
        (so a program cannot be run more than twice); a server that missed its deadline is not
        retried, as the program may be why: the unfinished jobs then carry ``error``.
        """
        payloads = [
            (
                job._request(),
                job.code.encode("utf-8", errors="surrogatepass"),
                job.stdin.encode("utf-8", errors="replace"),
            )
            for job in jobs
        ]
        results: list[RunResult] = []
        failures = 0
        while len(results) < len(jobs):
            worker = self._acquire()
            try:
                replies = worker.execute(payloads[len(results) :])
            except WorkerDied as exc:
                self._release(worker, broken=True)
                failures += 1
                if failures == 2 or exc.missed_deadline:
                    failed = RunResult(
                        "", "", None, exc.missed_deadline, 0.0, layer=self.layer, error=str(exc)
                    )
                    return results + [dataclasses.replace(failed) for _ in jobs[len(results) :]]
                continue
            except BaseException:
                self._release(worker, broken=True)
                raise
            self._release(worker, broken=bool(replies[-1][0].get("retire")))
            results += [self._result(*reply) for reply in replies]
        return results

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
        )

    def _acquire(self) -> Worker:
        with self._cond:
            if self._owner_pid != os.getpid():
                self._forget_after_fork()
            while True:
                if self._closed:
                    raise SandboxError("this Sandbox is closed")
                if self._idle:
                    return self._idle.pop()
                if self._started < self.workers:
                    self._started += 1
                    break
                self._cond.wait()
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
            worker.kill() if broken else worker.close()

    def _forget_after_fork(self) -> None:
        """In a forked child: let go of the parent's servers (never kill them) and start afresh."""
        for worker in self._workers:
            worker.abandon()
        self._reset_state()


def _close_all_at_exit() -> None:
    for sandbox in list(_live_sandboxes):
        with contextlib.suppress(Exception):
            if sandbox._owner_pid == os.getpid():
                sandbox.close()


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
    """What the active (or given) layer protects here, checked by its probe (see :func:`describe`)."""
    return _describe(layer_plan(layer), requested_layer(layer))


def _describe(plan: LayerPlan, requested: str) -> dict:
    """What ``plan`` protects.

    Keys: ``layer``, ``requested``; ``namespaces`` (own pid, mount, network, IPC and UTS
    namespaces), ``network_cut``, ``read_only_root`` and ``host_files_hidden`` (a minimal
    read-only view: the envs' hidden data and package directories are not in it),
    ``private_tmp`` (``/tmp``, ``/dev/shm`` of its own, nothing left between runs) and
    ``private_proc``; ``uid_drop``, ``keep_read_search``, ``leftover_cleanup``; ``memory_limit``
    (the mechanism that enforces ``memory_mb``) and ``memory_total`` (whether it bounds all of a
    run's processes, memfd and shared memory included); ``fresh_process_image`` (each program is
    forked from a zygote that never held a job); ``keyrings``; ``userns_disabled``;
    ``not_isolated`` (what this layer leaves open; empty when nothing) and ``notes``.
    """
    if plan.memory:
        version = plan.memory[0]
        files = "memory.max, memory.swap.max 0" if version == "v2" else "memory.limit_in_bytes (+ memsw)"
        memory = f"cgroup {version} per server, limit set per run ({files}); RLIMIT_AS per process"
    else:
        memory = "RLIMIT_AS per process only"
    return {
        "layer": plan.name,
        "requested": requested,
        "namespaces": plan.namespaces,
        "network_cut": plan.namespaces,
        "read_only_root": plan.namespaces,
        "host_files_hidden": plan.namespaces,
        "private_tmp": plan.namespaces,
        "private_proc": plan.namespaces,
        "uid_drop": plan.uid_drop,
        "keep_read_search": plan.keep_read_search,
        "leftover_cleanup": plan.cleanup,
        "memory_limit": memory,
        "memory_total": bool(plan.memory),
        "fresh_process_image": True,
        "keyrings": "no access (seccomp: add_key, request_key and keyctl fail)"
        if seccomp_available()
        else "not filtered on this architecture",
        "userns_disabled": "--disable-userns" in plan.bwrap_args or seccomp_available(),
        "not_isolated": not_isolated(plan),
        "notes": list(plan.notes),
    }


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
