"""The fork server behind :mod:`llm_zoo.sandbox`. Runs as its own process; standard library only.

The host does not run this file from the package: it writes the source of the server's modules and
the server's configuration into a memory file, and the interpreter runs that file
(``python -s -S -B -P /proc/self/fd/N``, see ``worker.server_command``). So the sandbox never
needs to see the package directory, which holds the envs' hidden data, and the command line that
``ps`` and ``/proc/*/cmdline`` show holds neither the source nor the configuration.

A server is started once (inside bubblewrap as its pid 1, or, in the fallback, after entering
namespaces of its own with ``jail``), pre-imports the modules programs commonly use, forks
its *zygote* (``zygote``) before it reads any job, says hello, then serves one request at
a time on its stdin/stdout pipe. For each job of a request it:

1. notes on its progress pipe that a job started (the host reads it only if the server dies, to
   know which job was running), creates a new work dir (owned by the sandbox uid when the server
   runs as root; never one an earlier run had) holding the program as ``main.py``, and memory
   files for the job, stdin, stdout and stderr;
2. sets the memory limit of the run's cgroup (where one is used) and hands the memory files to
   the zygote, which forks the program's process from its clean image (``runner``);
3. waits for the program with the wall-clock timeout (a pidfd from the zygote, and ``poll``) and
   kills it when the time is up, or when the host goes away (end of file on the request pipe);
4. gets the zygote's answer once everything of the run is killed and reaped, removes the work dir
   (without recursion, within ``CLEANUP_BUDGET_S``: a tree that takes longer makes the server
   retire after answering, see ``cleanup``) and answers with the exit status, times and
   capped output.

A request holds a chunk of jobs (run one after the other, answered together, which saves two
process wake-ups per job); the answer holds one result per job run. Messages are the frames of
``protocol``. If the zygote dies, the server exits: the host replaces it (see
``llm_zoo.sandbox`` for which jobs rerun); as pid 1 of its namespace, its death takes every process
of the sandbox with it.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import select
import signal
import socket
import time
from collections.abc import Sequence

from llm_zoo.sandbox import cgroup, cleanup, jail, runner, seccomp, zygote
from llm_zoo.sandbox.protocol import read_frame, write_frame

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
# How long removing what a run left may take; beyond it the server retires instead (its private
# /tmp, a tmpfs, goes with its namespaces; without namespaces the host removes the rest in the
# background), so a hostile tree never costs the next job more than this.
CLEANUP_BUDGET_S = cleanup.BUDGET_S
# What a run may leave charged to the server's memory cgroup once its processes are gone (page
# cache aside; an ordinary run leaves under 0.5 MiB of kernel objects), and how long the kernel's
# collection of in-flight Unix sockets gets to free more. Beyond that the server retires: the next
# run, possibly another episode's, would start with part of its memory_mb already taken.
LEFTOVER_BOUND_BYTES = 4 << 20
LEFTOVER_WAIT_S = 0.25


class ServerConfig:
    """What the host told the server at start-up (JSON in the memory file it runs from; see the
    worker)."""

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
        self.memory_usage_fds: list[int] = options.get("memory_usage_fds", [])  # usage, memory.stat
        self.memory_version: str | None = options.get("memory_version")
        self.progress_fd: int | None = options.get("progress_fd")  # one byte per job started
        self.allow_inet: bool = bool(options.get("allow_inet"))  # the network is cut by a namespace
        self.cleanup_budget_s = CLEANUP_BUDGET_S
        #: Each run gets a tmpfs work dir of its own (``jail.mount_run_tmp``), where this server may
        #: mount one (decided at start: ``_can_mount_run_tmp``).
        self.private_run_tmp = False
        self.run_tmp_mb: int = int(options.get("disk_mb", 256))
        self.run_tmp_wanted: bool = bool(options.get("run_tmp", True))
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


def _prepare_workdir(config: ServerConfig, source: bytes) -> None:
    """A new, empty work dir owned by the program's uid, then ``main.py`` (read-only to it) inside.

    Never reused: a directory a run has had carries what no listing shows (extended attributes,
    a default ACL, timestamps) and the memory those are charged to. The last run's is gone
    (:func:`_discard_workdir`); anything found under its name is not ours and is removed first.
    """
    if os.path.lexists(config.workdir) and not cleanup.remove_tree(config.workdir, _cleanup_deadline(config)):
        raise SystemExit("sandbox server: a stale work dir could not be removed")
    os.mkdir(config.workdir, 0o700)
    if config.uid is not None:
        os.chown(config.workdir, config.uid, config.uid)
    program = os.open(
        os.path.join(config.workdir, "main.py"), os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644
    )
    with os.fdopen(program, "wb") as handle:
        handle.write(source)


def _cleanup_deadline(config: ServerConfig) -> float:
    return time.monotonic() + config.cleanup_budget_s


def _discard_workdir(config: ServerConfig) -> bool:
    """Remove the run's work dir (unmount its own tmpfs, or remove the directory) and, when
    programs share our uid, whatever they left next to it and in ``/dev/shm``, within the cleanup
    budget; False if something is left (then retire)."""
    deadline = _cleanup_deadline(config)
    if config.private_run_tmp:  # everything in it goes at once
        jail.unmount_run_tmp(config.workdir)
        complete = True
    else:
        try:  # the common case, two system calls: the program left nothing but its main.py
            os.unlink(os.path.join(config.workdir, "main.py"))
            os.rmdir(config.workdir)
            complete = True
        except OSError:
            complete = cleanup.remove_tree(config.workdir, deadline)
    return _discard_shared_leftovers(config, deadline) and complete


def _discard_shared_leftovers(config: ServerConfig, deadline: float) -> bool:
    """When programs share our uid (no uid drop), they can write next to the work dir and in
    ``/dev/shm``: remove all of it, but the work dir's mount point (a run's own tmpfs goes there)."""
    if config.uid is not None:
        return True
    complete = True
    shared = [os.path.dirname(config.workdir)] + (["/dev/shm"] if config.private_files else [])
    for directory in shared:
        for entry in os.listdir(directory):
            path = os.path.join(directory, entry)
            if path != config.workdir:
                complete = cleanup.remove_tree(path, deadline) and complete
    return complete


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


class LimitRefused(Exception):
    """The run cgroup refused the next job's memory limit (cgroup v1 answers EBUSY when what is
    charged exceeds it): the server retires before starting the job, which runs elsewhere."""


class MemoryLimit:
    """The run cgroup's files, opened by the host: its limit files (cgroup v1 ``limit_in_bytes``
    then ``memsw``, or v2 ``memory.max``), written before a run when the limit changes; the file
    whose ``oom_kill`` line counts the processes the OOM killer stopped; its usage and
    ``memory.stat``, read after each run for what the run left charged."""

    def __init__(self, config: ServerConfig) -> None:
        fds = config.memory_fds
        self.fds, self.events = fds[:-1], (fds[-1] if fds else None)
        self.usage_fds, self.version = config.memory_usage_fds, config.memory_version
        self.current: int | None = None

    def set(self, limit: int) -> None:
        if not self.fds or limit == self.current:
            return
        # cgroup v1 wants memsw >= limit at all times: lower the limit first, raise it last.
        lowering = self.current is None or limit < self.current
        try:
            for fd in self.fds if lowering else self.fds[::-1]:
                os.pwrite(fd, str(limit).encode(), 0)
        except OSError as exc:
            self.current = None  # partly written: write every file next time
            raise LimitRefused(
                f"the run cgroup refused a limit of {limit >> 20} MiB: {exc.strerror}"
            ) from exc
        self.current = limit

    def oom_kills(self) -> int:
        if self.events is None:
            return 0
        for line in os.pread(self.events, 4096, 0).decode().splitlines():
            if line.startswith("oom_kill "):
                return int(line.split()[1])
        return 0

    def leftover(self) -> int:
        """Bytes a finished run left charged, after the kernel had a chance to free them.

        Descriptors sent over a Unix socket and never received (a socket in its own queue, with
        pipes, memory files or data beside it) outlive every process of the run until the kernel
        collects in-flight sockets, which only the closing of some Unix socket sets off. So one
        is closed here after every run, whatever its cgroup shows: memory that is not charged
        (socket buffers under cgroup v1) is the host's, and the uid's count of descriptors in
        flight, which bounds what the next run may send, goes back down too.
        """
        first, second = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        first.close()
        second.close()
        if not self.usage_fds or self.version is None:
            return 0
        deadline = time.monotonic() + LEFTOVER_WAIT_S
        while True:
            left = cgroup.unreclaimable_bytes(self.version, *self.usage_fds)
            if left <= LEFTOVER_BOUND_BYTES or time.monotonic() > deadline:
                return left
            time.sleep(0.005)  # the collection runs in a kernel worker


def serve_one(request: dict, source: bytes, stdin: bytes, config: ServerConfig, channel: int,
              births: socket.socket, memory: MemoryLimit) -> dict:  # fmt: skip
    """Run one program; the reply header plus its stdout and stderr.

    Raises:
        LimitRefused: Before the job started (nothing of it ran): the server must retire.
    """
    memory.set(int(request["memory_mb"]) << 20)  # a refusal is not this job's doing: it runs elsewhere
    if config.progress_fd is not None:  # read by the host only if this server dies: which job did it
        os.write(config.progress_fd, b".")
    if config.private_run_tmp:
        jail.mount_run_tmp(config.workdir, config.run_tmp_mb, config.uid, source)
    else:
        _prepare_workdir(config, source)
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
    tidy = _discard_workdir(config) and answer.get("tidy", True)  # files go now, not at the next run
    left = memory.leftover()
    left_behind = None
    if left > LEFTOVER_BOUND_BYTES:
        left_behind = (
            f"the run left {left / (1 << 20):.1f} MiB charged to its memory cgroup after all its processes "
            "ended (e.g. descriptors in flight on a Unix socket); its server retired"
        )
    header = {
        "exit_code": exit_code,
        "timed_out": timed_out,
        "duration_s": duration,
        "cpu_s": cpu,
        "output_truncated": out_cut or err_cut,
        "memory_exceeded": memory.oom_kills() > oom_kills,
        "error": None if answer["clean"] else "processes of the run survived SIGKILL; server retiring",
        "left_behind": left_behind,
        "host_gone": host_gone,
        "retire": not (answer["clean"] and tidy) or left_behind is not None,
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


def _can_mount_run_tmp(config: ServerConfig) -> bool:
    """Whether this server can give each run a tmpfs work dir of its own: in the sandbox's own
    namespaces, with CAP_SYS_ADMIN over them (tried once, at start)."""
    if config.cleanup != "pidns" or not config.run_tmp_wanted:
        return False
    try:
        jail.mount_run_tmp(config.workdir, 1, config.uid, b"")
        jail.unmount_run_tmp(config.workdir)
    except OSError:
        return False
    return True


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


def main(options: dict) -> int:
    """Serve requests on stdin/stdout; ``options`` is the configuration the host wrote into the
    memory file this server runs from (never its command line: ``ps`` shows that to everyone)."""
    config = ServerConfig(options)
    if config.jail is not None:
        kept = [
            0,
            1,
            *([config.cgroup_procs_fd] if config.cgroup_procs_fd is not None else []),
            *([config.progress_fd] if config.progress_fd is not None else []),
            *config.memory_fds,
            *config.memory_usage_fds,
        ]
        jail.enter(config.jail["ops"], config.jail["mountpoint"], config.jail["info_fd"], kept)
    elif config.cleanup == "pidns" and config.uid is not None:  # bubblewrap, as root
        jail.hide_other_processes()
        jail.mask_host_counters()
    # The protocol owns private copies of fds 0 and 1; a stray print can no longer corrupt it.
    channel_in, channel_out = os.dup(0), os.dup(1)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(2, 1)
    os.close(null)
    runner.prctl(runner.PR_SET_NO_NEW_PRIVS, 1)  # no setuid binary or file capability can raise a program
    runner.prctl(runner.PR_SET_CHILD_SUBREAPER, 1)  # a run's orphans, should the zygote die first
    config.count_processes()
    seccomp.prepare(allow_inet=config.allow_inet)  # built once here; each child only installs it
    for name in PRELOADED_MODULES:
        __import__(name)
    os.makedirs(os.path.dirname(config.workdir), exist_ok=True)
    if config.cleanup == "pidns" and not os.path.isdir(config.workdir):
        os.mkdir(config.workdir, 0o755)  # where each run's own tmpfs goes, if this server may mount one
    config.private_run_tmp = _can_mount_run_tmp(config)
    if (
        config.jail is None
        and config.cleanup == "pidns"
        and config.uid is not None
        and not config.private_run_tmp
    ):
        runner.drop_capability(runner.CAP_SYS_ADMIN)  # bubblewrap as root: held for the mounts alone
    gc.collect()
    gc.freeze()  # children's collections then skip (and do not copy-on-write) the server's objects
    private = [channel_in, channel_out, *config.memory_fds, *config.memory_usage_fds]
    births = _start_zygote(
        config, private + ([config.progress_fd] if config.progress_fd is not None else [])
    )  # before any job is read: its image never holds one
    memory = MemoryLimit(config)
    write_frame(channel_out, {"ready": True, "pid": os.getpid(), "uid": config.uid})
    while True:  # a request is a chunk of jobs, run one after the other: one round trip each
        frame = read_frame(channel_in)
        if frame is None:
            return 0
        request, inputs = frame
        results: list[dict] = []
        outputs: list[bytes] = []
        refused = None
        for index, job in enumerate(request["jobs"]):
            try:
                reply = serve_one(
                    job, inputs[2 * index], inputs[2 * index + 1], config, channel_in, births, memory
                )
            except LimitRefused as exc:
                refused = str(exc)
                break  # the host runs this job and the rest of the chunk elsewhere
            if reply["header"]["host_gone"]:
                return 0
            results.append(reply["header"])
            outputs += reply["blobs"]
            if reply["header"]["retire"]:
                break  # the host runs the rest of the chunk elsewhere
        retire = refused is not None or (bool(results) and results[-1]["retire"])
        write_frame(channel_out, {"results": results, "retire": retire, "refused": refused}, outputs)
        if retire:
            return 1
