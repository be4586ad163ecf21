"""The fork server behind :mod:`llm_zoo.sandbox`. Runs as its own process; standard library only.

A server is started once (inside bubblewrap when that layer is active), pre-imports the modules
programs commonly use, says hello, then serves one request at a time on its stdin/stdout pipe:

1. it creates a fresh work dir (owned by the sandbox uid when the server runs as root) holding the
   program as ``main.py``, and memory files for stdin, stdout and stderr;
2. it forks a child that starts a new session, points fds 0-2 at those memory files, closes every
   other descriptor, sets the resource limits, drops to the sandbox uid, enters the work dir and
   runs the program as ``__main__`` the way ``python main.py`` would (same interpreter flags,
   exit status, traceback, atexit handlers and thread joins), so no interpreter start-up is paid;
3. it waits for the child with the wall-clock timeout (a pidfd and ``poll``) and kills it when
   the time is up, or when the host goes away (end of file on the request pipe);
4. it kills every process the run left behind and reaps them: the server is a child subreaper,
   so orphans, double-forked ``setsid`` daemons included, are reparented to it, and "the server
   has no children left" means "nothing of this run is left";
5. it removes the work dir and answers with the exit status, times and capped output.

A request holds a chunk of jobs (run one after the other, answered together, which saves two
process wake-ups per job); the answer holds one result per job run. Messages in both directions
are frames: a 4-byte big-endian length, a JSON header, then the raw byte blobs whose lengths the
header lists under ``"blobs"``. Nothing is pickled, so the host never deserialises code from this
side.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import json
import os
import resource
import select
import signal
import stat
import struct
import sys
import time
from collections.abc import Sequence

# Modules imported once here so that programs find them loaded: each saves its import time in
# every run, but every module also makes each fork and exit slower (more memory to map and unmap),
# so only what contest programs commonly import (dataclasses, decimal, fractions, statistics,
# each rare, would add 1.7 MB to every child).
PRELOADED_MODULES = (
    "array", "atexit", "bisect", "collections", "copy", "functools", "heapq", "io", "itertools",
    "json", "linecache", "math", "operator", "random", "re", "string", "threading", "traceback",
    "types", "typing",
)  # fmt: skip

SETUP_FAILED_EXIT = 125  # the child could not be set up; the program never ran
_MAX_HEADER_BYTES = 1 << 20
_PR_SET_DUMPABLE, _PR_SET_KEEPCAPS, _PR_SET_CHILD_SUBREAPER, _PR_SET_NO_NEW_PRIVS = 4, 8, 36, 38
_CAP_DAC_READ_SEARCH = 2
_LINUX_CAPABILITY_VERSION_3 = 0x20080522
_REAP_DEADLINE_S = 5.0


# ---------------------------------------------------------------------------------------- framing
def write_frame(fd: int, header: dict, blobs: Sequence[bytes] = ()) -> None:
    """Write one frame (header + blobs) to ``fd``, retrying partial writes."""
    head = json.dumps(dict(header, blobs=[len(blob) for blob in blobs])).encode()
    view = memoryview(b"".join([struct.pack(">I", len(head)), head, *blobs]))
    while view:
        view = view[os.write(fd, view) :]


def read_exact(fd: int, size: int, deadline: float | None = None) -> bytes | None:
    """Read exactly ``size`` bytes; ``None`` at end of file; ``TimeoutError`` past ``deadline``."""
    chunks, missing = [], size
    while missing:
        if deadline is not None:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not select.select([fd], [], [], remaining)[0]:
                raise TimeoutError("no answer before the deadline")
        chunk = os.read(fd, min(missing, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        missing -= len(chunk)
    return b"".join(chunks)


def read_frame(fd: int, deadline: float | None = None) -> tuple[dict, list[bytes]] | None:
    """Read one frame; ``None`` if the other side closed the pipe first."""
    size = read_exact(fd, 4, deadline)
    if size is None:
        return None
    (head_size,) = struct.unpack(">I", size)
    if head_size > _MAX_HEADER_BYTES:
        raise ValueError(f"frame header of {head_size} bytes")
    head = read_exact(fd, head_size, deadline)
    if head is None:
        return None
    header = json.loads(head)
    blobs = []
    for blob_size in header.pop("blobs"):
        blob = read_exact(fd, int(blob_size), deadline)
        if blob is None:
            return None
        blobs.append(blob)
    return header, blobs


# ------------------------------------------------------------------------------- process controls
_libc = ctypes.CDLL(None, use_errno=True)


def _prctl(option: int, value: int) -> None:
    if _libc.prctl(option, ctypes.c_ulong(value), 0, 0, 0) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"prctl({option}, {value}): {os.strerror(errno)}")


def _limit_capabilities_to_read_search() -> None:
    """Keep only CAP_DAC_READ_SEARCH (effective and permitted) after a ``setuid`` with KEEPCAPS."""

    class Header(ctypes.Structure):
        _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

    class Data(ctypes.Structure):
        _fields_ = [(name, ctypes.c_uint32) for name in ("effective", "permitted", "inheritable")]

    bit = 1 << _CAP_DAC_READ_SEARCH
    data = (Data * 2)(Data(bit, bit, 0), Data(0, 0, 0))
    if _libc.capset(ctypes.byref(Header(_LINUX_CAPABILITY_VERSION_3, 0)), data) != 0:
        raise OSError(ctypes.get_errno(), "capset failed")


def _drop_privileges(uid: int, keep_read_search: bool) -> None:
    """Become ``uid`` (gid and groups too) for good; optionally keep reading any file."""
    if keep_read_search:
        _prctl(_PR_SET_KEEPCAPS, 1)
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)
    if keep_read_search:
        _limit_capabilities_to_read_search()
        _prctl(_PR_SET_KEEPCAPS, 0)
    if os.getresuid() != (uid, uid, uid):
        raise OSError(f"uid drop to {uid} failed")
    _prctl(_PR_SET_DUMPABLE, 1)  # setuid cleared it; a normal process is dumpable


def _set_limits(request: dict, nproc_base: int) -> None:
    cpu = max(1, int(request["timeout"] + 0.999))
    memory = int(request["memory_mb"]) << 20
    nproc = nproc_base + int(request["max_processes"])
    fsize = int(request["max_output_bytes"]) + 1  # one byte over the cap marks "truncated"
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


# ------------------------------------------------------------------------------------- the child
class _StdioConfig:
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


def _child(request: dict, source: bytes, fds: Sequence[int], workdir: str, config: ServerConfig) -> None:
    """Set up the forked child and run the program in it; never returns."""
    try:
        os.setsid()
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
        os.closerange(3, os.sysconf("SC_OPEN_MAX"))
        _set_limits(request, config.nproc_base)
        if config.uid is not None:
            _drop_privileges(config.uid, config.keep_read_search)
        os.chdir(workdir)
        os.environ.clear()
        os.environ.update(
            {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": workdir, "TMPDIR": workdir, "LANG": "C.UTF-8"}
        )
        config.stdio.install()
    except BaseException as exc:
        os.write(2, f"sandbox: could not set up the program's process: {exc!r}\n".encode())
        os._exit(SETUP_FAILED_EXIT)
    try:
        status = _run_program(os.path.join(workdir, "main.py"), source)
    except BaseException:
        status = 1
    os._exit(status)


# ------------------------------------------------------------------------------------ the server
class ServerConfig:
    """What the host told the server at start-up (see ``main``'s arguments)."""

    def __init__(self, options: dict) -> None:
        self.uid: int | None = options["uid"] if options["uid"] >= 0 else None
        self.keep_read_search: bool = options["keep_read_search"]
        self.cleanup: str = options["cleanup"]
        self.workdir = os.path.join(options["scratch"], "work")
        self.nproc_base = self._nproc_base()
        self.stdio = _StdioConfig()

    def _nproc_base(self) -> int:
        """Processes already counted against RLIMIT_NPROC for the uid the programs run as."""
        if self.uid is not None:
            return 0  # a uid of its own: only the run counts
        if self.cleanup == "pidns":
            return 2  # a user namespace of its own: bubblewrap's init and this server count too
        return _count_processes_of(os.getuid())  # shared with everything this user runs (approx.)


def _count_processes_of(uid: int) -> int:
    count = 0
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError):
                count += os.stat(f"/proc/{entry}").st_uid == uid
    return count


def _children_of(pid: int) -> list[int]:
    children = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", "rb") as handle:
                    fields = handle.read()
            except OSError:
                continue
            if int(fields[fields.rindex(b")") + 2 :].split()[1]) == pid:
                children.append(int(entry))
    return children


def _kill_leftovers(config: ServerConfig) -> None:
    """SIGKILL every process of the current run that is still alive (the server excepted)."""
    if config.cleanup == "pidns":  # alone in a pid namespace: everything but init and us
        with contextlib.suppress(ProcessLookupError):
            os.kill(-1, signal.SIGKILL)
    elif config.cleanup == "uid":  # a uid of our own: kill(-1) as that uid reaches exactly the run
        helper = os.fork()
        if helper == 0:
            try:
                os.setresgid(config.uid, config.uid, config.uid)  # type: ignore[arg-type]
                os.setresuid(config.uid, config.uid, config.uid)  # type: ignore[arg-type]
                os.kill(-1, signal.SIGKILL)
            finally:
                os._exit(0)
    else:  # same uid as us: kill our children, their orphans come back to us for the next round
        for child in _children_of(os.getpid()):
            for kill in (os.killpg, os.kill):
                with contextlib.suppress(OSError):
                    kill(child, signal.SIGKILL)


_IPC_RMID = 0
_SYSV_IPC_KINDS = (("shm", "shmid"), ("msg", "msqid"), ("sem", "semid"))


def _remove_ipc_objects(config: ServerConfig) -> None:
    """Remove the System V shared memory, message queues and semaphores the run created.

    They outlive processes (a segment keeps its memory until removed), and no resource limit
    bounds them. Found in ``/proc/sysvipc`` by owner: the program's uid, or, alone in an IPC
    namespace of our own (bubblewrap), every object there. Under the host's own uid (no root,
    no bubblewrap) they cannot be told apart from the user's own and are left alone. Removing
    needs the owner's uid (the server keeps no CAP_SYS_ADMIN), so a helper takes it.
    """
    if config.uid is None and config.cleanup != "pidns":
        return
    found = []
    for kind, id_column in _SYSV_IPC_KINDS:
        try:
            with open(f"/proc/sysvipc/{kind}") as handle:
                header, *rows = handle.read().splitlines()
        except OSError:
            continue
        for row in rows:
            fields = dict(zip(header.split(), row.split(), strict=False))
            if config.uid is None or config.uid in (int(fields["uid"]), int(fields["cuid"])):
                found.append((kind, int(fields[id_column])))
    if not found:
        return
    helper = os.fork() if config.uid is not None else 0
    if helper:
        os.waitpid(helper, 0)
        return
    try:
        if config.uid is not None:
            os.setresgid(config.uid, config.uid, config.uid)
            os.setresuid(config.uid, config.uid, config.uid)
        for kind, object_id in found:
            if kind == "sem":
                _libc.semctl(object_id, 0, _IPC_RMID)
            else:
                getattr(_libc, f"{kind}ctl")(object_id, _IPC_RMID, None)
    finally:
        if config.uid is not None:
            os._exit(0)


def _reap_everything(config: ServerConfig) -> bool:
    """Kill and reap until the server has no child left; False if some survive the deadline."""
    deadline = time.monotonic() + _REAP_DEADLINE_S
    killed_at = None
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return True
        if pid:
            continue
        now = time.monotonic()
        if now > deadline:
            return False
        if killed_at is None or now - killed_at > 0.05:
            _kill_leftovers(config)
            killed_at = now
        time.sleep(0.001)


def _remove_tree(path: str) -> None:
    """Remove ``path`` whatever it is; symbolic links are removed, never followed."""

    def make_writable_and_retry(function, failed_path, _exc_info) -> None:  # type: ignore[no-untyped-def]
        os.chmod(os.path.dirname(failed_path), 0o700)  # a directory the program locked itself out of
        if os.path.isdir(failed_path) and not os.path.islink(failed_path):
            os.chmod(failed_path, 0o700)
        function(failed_path)

    if os.path.islink(path) or (os.path.lexists(path) and not os.path.isdir(path)):
        os.unlink(path)
    elif os.path.lexists(path):
        import shutil  # only when a program left files: the server stays small

        shutil.rmtree(path, onerror=make_writable_and_retry)


def _prepare_workdir(config: ServerConfig, source: bytes) -> None:
    """An empty work dir owned by the program's uid, then ``main.py`` (read-only to it) inside.

    The directory is kept from run to run when the last program left it exactly as it found it
    (creating a directory costs milliseconds on some file systems; a file, microseconds).
    """
    _reset_workdir(config)
    program = os.open(
        os.path.join(config.workdir, "main.py"), os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644
    )
    with os.fdopen(program, "wb") as handle:
        handle.write(source)


def _reset_workdir(config: ServerConfig) -> None:
    """Leave the work dir empty, owned by the program's uid, mode 0700.

    Programs running under the server's own uid (no root) could also write next to their work
    dir, and under bubblewrap in the sandbox's ``/dev/shm``: those are emptied too, so nothing
    passes from one run to the next.
    """
    if config.uid is None:
        shared = [os.path.dirname(config.workdir)] + (["/dev/shm"] if config.cleanup == "pidns" else [])
        for directory in shared:
            for entry in os.listdir(directory):
                if os.path.join(directory, entry) != config.workdir:
                    _remove_tree(os.path.join(directory, entry))
    if not _workdir_is_pristine(config):
        _remove_tree(config.workdir)
        os.mkdir(config.workdir, 0o700)
        if config.uid is not None:
            os.chown(config.workdir, config.uid, config.uid)


def _workdir_is_pristine(config: ServerConfig) -> bool:
    """The work dir exists with our owner and mode, holding nothing or only our ``main.py``."""
    try:
        info = os.lstat(config.workdir)
        entries = os.listdir(config.workdir)
    except OSError:
        return False
    owner = config.uid if config.uid is not None else os.getuid()
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != owner or stat.S_IMODE(info.st_mode) != 0o700:
        return False
    if entries == ["main.py"]:
        program = os.lstat(os.path.join(config.workdir, "main.py"))
        if not stat.S_ISREG(program.st_mode) or program.st_uid != os.getuid():
            return False
        os.unlink(os.path.join(config.workdir, "main.py"))
        return True
    return not entries


def _memory_file(name: str, content: bytes = b"") -> int:
    fd = os.memfd_create(name, os.MFD_CLOEXEC)
    view = memoryview(content)
    while view:
        view = view[os.write(fd, view) :]
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def _read_capped(fd: int, cap: int) -> tuple[bytes, bool]:
    data = os.pread(fd, cap + 1, 0)
    return data[:cap], len(data) > cap


def serve_one(request: dict, source: bytes, stdin: bytes, config: ServerConfig, channel: int) -> dict:
    """Run one program; the reply header plus its stdout and stderr."""
    _prepare_workdir(config, source)
    fds = [_memory_file("stdin", stdin), _memory_file("stdout"), _memory_file("stderr")]
    start = time.monotonic()
    pid = os.fork()
    if pid == 0:
        _child(request, source, fds, config.workdir, config)
    host_gone = timed_out = False
    with os.fdopen(os.pidfd_open(pid), "rb", buffering=0) as pidfd:
        poller = select.poll()
        poller.register(pidfd, select.POLLIN)
        poller.register(channel, select.POLLIN)  # the host sends nothing during a run: EOF = gone
        deadline = start + float(request["timeout"])
        while True:
            remaining = deadline - time.monotonic()
            events = dict(poller.poll(max(0.0, remaining) * 1000)) if remaining > 0 else {}
            if pidfd.fileno() in events:
                break
            if channel in events:
                host_gone = True
            if host_gone or remaining <= 0:
                timed_out = not host_gone
                for kill in (os.killpg, os.kill):
                    with contextlib.suppress(OSError):
                        kill(pid, signal.SIGKILL)
                break
    _, status, usage = os.wait4(pid, 0)
    duration = time.monotonic() - start
    exit_code = os.waitstatus_to_exitcode(status)
    cpu = usage.ru_utime + usage.ru_stime
    cpu_limit = max(1, int(float(request["timeout"]) + 0.999))
    if exit_code == -signal.SIGXCPU or (exit_code == -signal.SIGKILL and cpu >= cpu_limit):
        timed_out = True  # the CPU-time limit is a time limit too
    clean = _reap_everything(config)
    _remove_ipc_objects(config)
    cap = int(request["max_output_bytes"])
    stdout, out_cut = _read_capped(fds[1], cap)
    stderr, err_cut = _read_capped(fds[2], cap)
    for fd in fds:
        os.close(fd)
    _reset_workdir(config)  # files a program leaves go now, not at the next run
    header = {
        "exit_code": exit_code,
        "timed_out": timed_out,
        "duration_s": duration,
        "cpu_s": cpu,
        "output_truncated": out_cut or err_cut,
        "error": None if clean else "processes of the run survived SIGKILL; server retiring",
        "host_gone": host_gone,
        "retire": not clean,
    }
    return {"header": header, "blobs": [stdout, stderr]}


def _parse_args(argv: Sequence[str]) -> dict:
    """``--cleanup pidns|uid|tree --scratch DIR [--uid N] [--keep-read-search]`` (no argparse:
    every module the server imports is memory each fork copies)."""
    options: dict = {"uid": -1, "keep_read_search": False}
    arguments = list(argv)
    while arguments:
        flag = arguments.pop(0)
        if flag == "--keep-read-search":
            options["keep_read_search"] = True
        elif flag in ("--cleanup", "--scratch", "--uid") and arguments:
            options[flag[2:]] = arguments.pop(0)
        else:
            raise SystemExit(f"sandbox server: bad argument {flag!r}")
    if options.get("cleanup") not in ("pidns", "uid", "tree") or "scratch" not in options:
        raise SystemExit("sandbox server: --cleanup pidns|uid|tree and --scratch DIR are required")
    options["uid"] = int(options["uid"])
    return options


def main(argv: Sequence[str] | None = None) -> int:
    config = ServerConfig(_parse_args(sys.argv[1:] if argv is None else argv))
    # The protocol owns private copies of fds 0 and 1; a stray print can no longer corrupt it.
    channel_in, channel_out = os.dup(0), os.dup(1)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(2, 1)
    os.close(null)
    _prctl(_PR_SET_CHILD_SUBREAPER, 1)  # orphans of a run come back to us, to be killed
    _prctl(_PR_SET_NO_NEW_PRIVS, 1)  # no setuid binary or file capability can raise a program
    for name in PRELOADED_MODULES:
        __import__(name)
    gc.freeze()  # children's collections then skip (and do not copy-on-write) the server's objects
    write_frame(channel_out, {"ready": True, "pid": os.getpid(), "uid": config.uid})
    try:
        while True:  # a request is a chunk of jobs, run one after the other: one round trip each
            frame = read_frame(channel_in)
            if frame is None:
                return 0
            request, inputs = frame
            results: list[dict] = []
            outputs: list[bytes] = []
            for index, job in enumerate(request["jobs"]):
                reply = serve_one(job, inputs[2 * index], inputs[2 * index + 1], config, channel_in)
                if reply["header"]["host_gone"]:
                    return 0
                results.append(reply["header"])
                outputs += reply["blobs"]
                if reply["header"]["retire"]:
                    break  # the host runs the rest of the chunk elsewhere
            retire = bool(results) and results[-1]["retire"]
            write_frame(channel_out, {"results": results, "retire": retire}, outputs)
            if retire:
                return 1
    finally:  # the host removes them too, unless it died
        with contextlib.suppress(OSError):
            _remove_tree(config.workdir)
            os.rmdir(os.path.dirname(config.workdir))  # fails, harmlessly, on bubblewrap's /tmp


if __name__ == "__main__":
    sys.exit(main())
