"""The fork server behind :mod:`llm_zoo.sandbox`. Runs as its own process; standard library only.

The host does not run this file from the package: it sends the source of the server's modules on
the command line (``python -I -S -B -c ...``, see ``_sandbox_worker.server_command``), so the
sandbox never needs to see the package directory, which holds the envs' hidden data.

A server is started once (inside bubblewrap as its pid 1, or, in the fallback, after entering
namespaces of its own with ``_sandbox_jail``), pre-imports the modules programs commonly use, forks
its *zygote* (``_sandbox_zygote``) before it reads any job, says hello, then serves one request at
a time on its stdin/stdout pipe. For each job of a request it:

1. creates a fresh work dir (owned by the sandbox uid when the server runs as root) holding the
   program as ``main.py``, and memory files for the job, stdin, stdout and stderr;
2. sets the memory limit of the run's cgroup (where one is used) and hands the memory files to
   the zygote, which forks the program's process from its clean image (``_sandbox_runner``);
3. waits for the program with the wall-clock timeout (a pidfd from the zygote, and ``poll``) and
   kills it when the time is up, or when the host goes away (end of file on the request pipe);
4. gets the zygote's answer once everything of the run is killed and reaped, removes the work dir
   and answers with the exit status, times and capped output.

A request holds a chunk of jobs (run one after the other, answered together, which saves two
process wake-ups per job); the answer holds one result per job run. Messages are the frames of
``_sandbox_protocol``. If the zygote dies, the server exits: the host replaces it and reruns the
job once; as pid 1 of its namespace, its death takes every process of the sandbox with it.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import select
import signal
import socket
import stat
import sys
import time
from collections.abc import Sequence

from llm_zoo import _sandbox_jail as jail
from llm_zoo import _sandbox_runner as runner
from llm_zoo import _sandbox_zygote as zygote
from llm_zoo._sandbox_protocol import read_frame, write_frame

# Modules imported once here so that programs find them loaded: each saves its import time in
# every run, but every module also makes each fork and exit slower (more memory to map and unmap),
# so only what contest programs commonly import (dataclasses, decimal, fractions, statistics,
# each rare, would add 1.7 MB to every child).
PRELOADED_MODULES = (
    "array", "atexit", "bisect", "collections", "copy", "functools", "heapq", "io", "itertools",
    "json", "linecache", "math", "operator", "random", "re", "string", "threading", "traceback",
    "types", "typing",
)  # fmt: skip
_ANSWER_GRACE_S = zygote.REAP_DEADLINE_S + 5.0


class ServerConfig:
    """What the host told the server at start-up (one JSON argument; see the worker)."""

    def __init__(self, options: dict) -> None:
        self.uid: int | None = options["uid"] if options["uid"] >= 0 else None
        self.keep_read_search: bool = options["keep_read_search"]
        self.cleanup: str = options["cleanup"]
        if self.cleanup not in ("pidns", "uid", "tree"):
            raise SystemExit(f"sandbox server: cleanup must be pidns, uid or tree, not {self.cleanup!r}")
        self.workdir = os.path.join(options["scratch"], "work")
        self.jail: dict | None = options.get("jail")
        self.private_files = self.cleanup == "pidns"  # /tmp, /dev/shm: the sandbox's own
        self.cgroup_procs_fd: int | None = options.get("cgroup_procs_fd")
        self.memory_fds: list[int] = options.get("memory_fds", [])  # limit files, in write order
        if options.get("memory_events_fd") is not None:
            self.memory_fds.append(options["memory_events_fd"])  # the last one: read, not written
        self.nproc_base = 0
        self.stdio = runner.StdioConfig()

    def count_processes(self) -> None:
        """Processes already counted against RLIMIT_NPROC for the uid the programs run as."""
        if self.uid is not None:
            self.nproc_base = 0  # a uid of its own: only the run counts
        elif self.cleanup == "pidns":
            self.nproc_base = 2  # a user namespace of its own: this server and its zygote count too
        else:  # shared with everything this user runs (approx.)
            self.nproc_base = sum(
                _owned_by(entry, os.getuid()) for entry in os.listdir("/proc") if entry.isdigit()
            )


def _owned_by(pid: str, uid: int) -> bool:
    try:
        return os.stat(f"/proc/{pid}").st_uid == uid
    except OSError:
        return False


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
    dir, and in their namespace's ``/dev/shm``: those are emptied too, so nothing passes from one
    run to the next.
    """
    if config.uid is None:
        shared = [os.path.dirname(config.workdir)] + (["/dev/shm"] if config.private_files else [])
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


class MemoryLimit:
    """The run cgroup's files, opened by the host: its limit files (cgroup v1 ``limit_in_bytes``
    then ``memsw``, or v2 ``memory.max``), written before a run when the limit changes, and last
    the file whose ``oom_kill`` line counts the processes the OOM killer stopped."""

    def __init__(self, fds: list[int]) -> None:
        self.fds, self.events = fds[:-1], (fds[-1] if fds else None)
        self.current: int | None = None

    def set(self, limit: int) -> None:
        if not self.fds or limit == self.current:
            return
        # cgroup v1 wants memsw >= limit at all times: lower the limit first, raise it last.
        lowering = self.current is None or limit < self.current
        for fd in self.fds if lowering else self.fds[::-1]:
            os.pwrite(fd, str(limit).encode(), 0)
        self.current = limit

    def oom_kills(self) -> int:
        if self.events is None:
            return 0
        for line in os.pread(self.events, 4096, 0).decode().splitlines():
            if line.startswith("oom_kill "):
                return int(line.split()[1])
        return 0


def serve_one(request: dict, source: bytes, stdin: bytes, config: ServerConfig, channel: int,
              births: socket.socket, memory: MemoryLimit) -> dict:  # fmt: skip
    """Run one program; the reply header plus its stdout and stderr."""
    _prepare_workdir(config, source)
    memory.set(int(request["memory_mb"]) << 20)
    job = _memory_file("job", json.dumps(request).encode() + b"\n" + source)
    fds = [_memory_file("stdin", stdin), _memory_file("stdout"), _memory_file("stderr"), job]
    if config.cgroup_procs_fd is not None:
        fds.append(config.cgroup_procs_fd)
    oom_kills = memory.oom_kills()
    start = time.monotonic()
    socket.send_fds(births, [b"r"], fds)
    for fd in (fds[0], job):
        os.close(fd)
    _, received, _, _ = socket.recv_fds(births, 16, 1)
    if not received:
        raise SystemExit("sandbox server: the zygote is gone")
    pidfd = received[0]
    host_gone = timed_out = False
    poller = select.poll()
    poller.register(pidfd, select.POLLIN)
    poller.register(channel, select.POLLIN)  # the host sends nothing during a run: EOF = gone
    poller.register(births, select.POLLIN)  # the zygote answers only after the child exited
    deadline = start + float(request["timeout"])
    while True:
        remaining = deadline - time.monotonic()
        events = dict(poller.poll(max(0.0, remaining) * 1000)) if remaining > 0 else {}
        if pidfd in events:
            break
        if births.fileno() in events:  # the zygote died: the run cannot be cleaned up
            with contextlib.suppress(OSError):
                signal.pidfd_send_signal(pidfd, signal.SIGKILL)
            raise SystemExit("sandbox server: the zygote died during a run")
        if channel in events:
            host_gone = True
        if host_gone or remaining <= 0:
            timed_out = not host_gone
            with contextlib.suppress(OSError):
                signal.pidfd_send_signal(pidfd, signal.SIGKILL)
            break
    os.close(pidfd)
    answer = _read_answer(births)
    duration = time.monotonic() - start
    exit_code = os.waitstatus_to_exitcode(answer["status"])
    cpu = float(answer["cpu_s"])
    cpu_limit = max(1, int(float(request["timeout"]) + 0.999))
    if exit_code == -signal.SIGXCPU or (exit_code == -signal.SIGKILL and cpu >= cpu_limit):
        timed_out = True  # the CPU-time limit is a time limit too
    cap = int(request["max_output_bytes"])
    stdout, out_cut = _read_capped(fds[1], cap)
    stderr, err_cut = _read_capped(fds[2], cap)
    for fd in fds[1:3]:
        os.close(fd)
    _reset_workdir(config)  # files a program leaves go now, not at the next run
    header = {
        "exit_code": exit_code,
        "timed_out": timed_out,
        "duration_s": duration,
        "cpu_s": cpu,
        "output_truncated": out_cut or err_cut,
        "memory_exceeded": memory.oom_kills() > oom_kills,
        "error": None if answer["clean"] else "processes of the run survived SIGKILL; server retiring",
        "host_gone": host_gone,
        "retire": not answer["clean"],
    }
    return {"header": header, "blobs": [stdout, stderr]}


def _read_answer(births: socket.socket) -> dict:
    births.settimeout(_ANSWER_GRACE_S)
    try:
        data = births.recv(4096)
        if not data:
            raise SystemExit("sandbox server: the zygote is gone")
    except TimeoutError:
        raise SystemExit("sandbox server: the zygote did not answer") from None
    finally:
        births.settimeout(None)
    return json.loads(data)


def _start_zygote(config: ServerConfig, private_fds: Sequence[int]) -> socket.socket:
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    pid = os.fork()
    if pid == 0:
        try:
            ours.close()
            for fd in private_fds:  # the host's pipe and the limit files are the server's alone
                os.close(fd)
            zygote.serve(theirs, config)
        finally:
            os._exit(0)
    theirs.close()
    return ours


def main(argv: Sequence[str] | None = None) -> int:
    arguments = list(sys.argv[1:] if argv is None else argv)
    if len(arguments) != 2 or arguments[0] != "--config":
        raise SystemExit("sandbox server: usage: --config JSON")
    config = ServerConfig(json.loads(arguments[1]))
    if config.jail is not None:
        kept = [
            0,
            1,
            *([config.cgroup_procs_fd] if config.cgroup_procs_fd is not None else []),
            *config.memory_fds,
        ]
        jail.enter(config.jail["ops"], config.jail["mountpoint"], config.jail["info_fd"], kept)
    # The protocol owns private copies of fds 0 and 1; a stray print can no longer corrupt it.
    channel_in, channel_out = os.dup(0), os.dup(1)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(2, 1)
    os.close(null)
    runner.prctl(runner.PR_SET_NO_NEW_PRIVS, 1)  # no setuid binary or file capability can raise a program
    runner.prctl(runner.PR_SET_CHILD_SUBREAPER, 1)  # a run's orphans, should the zygote die first
    config.count_processes()
    for name in PRELOADED_MODULES:
        __import__(name)
    os.makedirs(os.path.dirname(config.workdir), exist_ok=True)
    gc.collect()
    gc.freeze()  # children's collections then skip (and do not copy-on-write) the server's objects
    births = _start_zygote(
        config, [channel_in, channel_out, *config.memory_fds]
    )  # before any job is read: its image never holds one
    memory = MemoryLimit(config.memory_fds)
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
                reply = serve_one(
                    job, inputs[2 * index], inputs[2 * index + 1], config, channel_in, births, memory
                )
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
            os.rmdir(os.path.dirname(config.workdir))  # fails, harmlessly, on a private /tmp
