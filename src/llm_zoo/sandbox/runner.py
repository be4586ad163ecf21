"""A program's own process: set up by the zygote's fresh child, then the program as ``__main__``.

The child gets five descriptors from the server, and nothing else of any other job: memory files
for stdin, stdout and stderr, its job (limits and code) and, where a memory cgroup is used, the
run cgroup's ``cgroup.procs``. It enters that cgroup and a new session, sets its resource limits,
drops to the sandbox uid and every capability (inheritable and ambient ones included), installs
the seccomp filter (``seccomp``), and runs the program the way
``python -I -B main.py`` would (same exit status, traceback, ``atexit`` handlers, thread joins).
Standard library only.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import resource
import sys

from llm_zoo.sandbox import seccomp

SETUP_FAILED_EXIT = 125  # the child could not be set up; the program never ran
PR_SET_DUMPABLE, PR_SET_KEEPCAPS, PR_SET_CHILD_SUBREAPER, PR_SET_NO_NEW_PRIVS = 4, 8, 36, 38
_PR_SET_PDEATHSIG = 1
_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL = 47, 4
_CAP_DAC_READ_SEARCH = 2
CAP_SYS_ADMIN = 21
_LINUX_CAPABILITY_VERSION_3 = 0x20080522
libc = ctypes.CDLL(None, use_errno=True)


def prctl(option: int, value: int) -> None:
    if libc.prctl(option, ctypes.c_ulong(value), 0, 0, 0) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"prctl({option}, {value}): {os.strerror(errno)}")


def die_with_parent() -> None:
    """SIGKILL this process when the one that forked it dies."""
    prctl(_PR_SET_PDEATHSIG, 9)


class _CapabilityHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapabilityData(ctypes.Structure):
    _fields_ = [(name, ctypes.c_uint32) for name in ("effective", "permitted", "inheritable")]


def set_capabilities(keep_read_search: bool) -> None:
    """No capability left in any set (effective, permitted, inheritable, ambient), but
    CAP_DAC_READ_SEARCH (effective and permitted) when ``keep_read_search``.

    A ``setuid`` away from root clears the effective and permitted sets only: the inheritable set
    (the server's, e.g. bubblewrap's ``--cap-add`` list) would stay, and a server in a user
    namespace of its own hands its children every capability there.
    """

    with contextlib.suppress(OSError):  # kernels without ambient capabilities have none to clear
        prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL)
    bit = 1 << _CAP_DAC_READ_SEARCH if keep_read_search else 0
    data = (_CapabilityData * 2)(_CapabilityData(bit, bit, 0), _CapabilityData(0, 0, 0))
    if libc.capset(ctypes.byref(_CapabilityHeader(_LINUX_CAPABILITY_VERSION_3, 0)), data) != 0:
        raise OSError(ctypes.get_errno(), "capset failed")


def drop_capability(number: int) -> None:
    """Remove one capability from this process's effective, permitted and inheritable sets."""

    header, data = _CapabilityHeader(_LINUX_CAPABILITY_VERSION_3, 0), (_CapabilityData * 2)()
    if libc.capget(ctypes.byref(header), data) != 0:
        raise OSError(ctypes.get_errno(), "capget failed")
    word, bit = divmod(number, 32)
    for name in ("effective", "permitted", "inheritable"):
        setattr(data[word], name, getattr(data[word], name) & ~(1 << bit))
    if libc.capset(ctypes.byref(header), data) != 0:
        raise OSError(ctypes.get_errno(), "capset failed")


def drop_privileges(uid: int, keep_read_search: bool) -> None:
    """Become ``uid`` (gid and groups too) for good; optionally keep reading any file."""
    if keep_read_search:
        prctl(PR_SET_KEEPCAPS, 1)
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)
    set_capabilities(keep_read_search)
    if keep_read_search:
        prctl(PR_SET_KEEPCAPS, 0)
    if os.getresuid() != (uid, uid, uid):
        raise OSError(f"uid drop to {uid} failed")
    prctl(PR_SET_DUMPABLE, 1)  # setuid cleared it; a normal process is dumpable


#: Every program is the OOM killer's first choice, before anything of the host. Written while the
#: child may still hold CAP_SYS_RESOURCE (as root), it is also the floor the program cannot go below.
OOM_SCORE_ADJ = 1000


def _set_oom_score_adj() -> None:
    fd = os.open("/proc/self/oom_score_adj", os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, str(OOM_SCORE_ADJ).encode())
    finally:
        os.close(fd)


def _set_limits(limits: dict, nproc_base: int) -> None:
    cpu = max(1, int(limits["timeout"] + 0.999))
    memory = int(limits["memory_mb"]) << 20
    nproc = nproc_base + int(limits["max_processes"])
    fsize = int(limits["max_output_bytes"]) + 1  # one byte over the cap marks "truncated"
    for limit, value in (
        (resource.RLIMIT_CPU, (cpu, cpu + 1)),  # SIGXCPU at the soft limit, SIGKILL one second on
        (resource.RLIMIT_AS, (memory, memory)),
        (resource.RLIMIT_NPROC, (nproc, nproc)),
        (resource.RLIMIT_FSIZE, (fsize, fsize)),
        (resource.RLIMIT_NOFILE, (64, 64)),
        (resource.RLIMIT_CORE, (0, 0)),
        (resource.RLIMIT_MSGQUEUE, (0, 0)),  # POSIX message queues outlive processes: none at all
    ):
        resource.setrlimit(limit, value)


class StdioConfig:
    """How this interpreter opened its standard streams, to reopen them the same way in a child."""

    def __init__(self) -> None:
        self.streams = [  # (fd, mode, buffering: stderr is line-buffered, encoding, errors)
            (0, "r", -1, sys.stdin.encoding, sys.stdin.errors),
            (1, "w", -1, sys.stdout.encoding, sys.stdout.errors),
            (2, "w", 1, sys.stderr.encoding, sys.stderr.errors),
        ]

    def install(self) -> None:
        opened = [
            open(fd, mode, buffering, encoding=encoding, errors=errors, newline="\n", closefd=False)  # noqa: SIM115
            for fd, mode, buffering, encoding, errors in self.streams
        ]
        sys.stdin, sys.stdout, sys.stderr = opened  # type: ignore[assignment]
        sys.__stdin__, sys.__stdout__, sys.__stderr__ = opened  # type: ignore[misc, assignment]


def _exit_status(exc: SystemExit) -> int:
    """The status ``python main.py`` exits with for an uncaught ``SystemExit``."""
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code & 0xFF
    print(exc.code, file=sys.stderr)
    return 1


def _run_program(path: str, source: bytes) -> int:
    """Run ``source`` as ``__main__`` and go through the interpreter's exit steps; the status."""
    import atexit
    import builtins
    import threading
    import types

    main = types.ModuleType("__main__")
    main.__file__ = path
    main.__builtins__ = builtins  # type: ignore[attr-defined]
    sys.modules["__main__"] = main
    sys.argv[:] = [path]
    try:
        exec(compile(source, path, "exec"), main.__dict__)
        status = 0
    except SystemExit as exc:
        status = _exit_status(exc)
    except BaseException as exc:
        frames = exc.__traceback__
        exc.__traceback__ = frames.tb_next if frames is not None else None  # hide this frame
        sys.excepthook(type(exc), exc, exc.__traceback__)
        status = 1
    with contextlib.suppress(BaseException):
        threading._shutdown()  # type: ignore[attr-defined]  # join non-daemon threads, as at exit
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None and not stream.closed:
                stream.flush()
        except BaseException:
            status = 120 if stream is sys.stdout else status  # CPython's status for this case
    return status


#: ``random``'s seed in every program: the same program given the same input prints the same, so a
#: training run's rewards do not depend on the draws of a program that uses ``random``.
PROGRAM_RANDOM_SEED = 0


def _seed_random() -> None:
    import random

    random.seed(PROGRAM_RANDOM_SEED)


def _read_all(fd: int) -> bytes:
    chunks, offset = [], 0
    while chunk := os.pread(fd, 1 << 20, offset):
        chunks.append(chunk)
        offset += len(chunk)
    return b"".join(chunks)


def run_child(fds: list[int], config) -> None:  # type: ignore[no-untyped-def]  # server's ServerConfig
    """Set up this fresh child from its own descriptors and run its program; never returns.

    ``fds``: stdin, stdout, stderr, the job (a JSON line of limits, then the code) and, when the
    server has a memory cgroup, that cgroup's ``cgroup.procs``.
    """
    try:
        os.setsid()
        if len(fds) > 4:
            os.write(fds[4], b"0")  # into the run's memory cgroup, before anything is allocated
        job = _read_all(fds[3])
        head, _, source = job.partition(b"\n")
        limits = json.loads(head)
        for target, fd in enumerate(fds[:3]):
            os.dup2(fd, target)
        os.closerange(3, os.sysconf("SC_OPEN_MAX"))
        _set_oom_score_adj()
        _set_limits(limits, config.nproc_base)
        if config.uid is not None:
            drop_privileges(config.uid, config.keep_read_search)
        else:
            set_capabilities(keep_read_search=False)
        seccomp.install()  # see seccomp for what it refuses
        os.chdir(config.workdir)
        os.environ.clear()
        os.environ.update(
            {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": config.workdir, "TMPDIR": config.workdir,
             "LANG": "C.UTF-8"}
        )  # fmt: skip
        config.stdio.install()
        _seed_random()
    except BaseException as exc:
        os.write(2, f"sandbox: could not set up the program's process: {exc!r}\n".encode())
        os._exit(SETUP_FAILED_EXIT)
    try:
        status = _run_program(os.path.join(config.workdir, "main.py"), source)
    except BaseException:
        status = 1
    os._exit(status)
