"""The host side of one fork server: how it is started, and how programs are run through it.

A :class:`LayerPlan` (chosen by ``layers``) says how servers of an isolation layer start:
the bubblewrap command line, or the fallback's own namespaces (``jail``), whether
programs run under a uid of their own, how a server finds and kills what a run leaves behind, and
whether runs get a memory cgroup. :class:`Worker` starts one server under a plan and runs programs
through it; :class:`UidLease` gives each server a uid no other server on the machine uses at the
same time.

The server's code and configuration reach it in a memory file that the interpreter runs
(:func:`server_command`): never read from the package directory, which the sandbox must not see
(it holds the envs' hidden data), and never on a command line, which ``ps`` shows to everyone.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import functools
import json
import os
import select
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from llm_zoo.sandbox.cgroup import RunCgroup
from llm_zoo.sandbox.cleanup import remove_entries_of, remove_tree
from llm_zoo.sandbox.protocol import read_frame, write_frame
from llm_zoo.sandbox.view import SERVER_ENV, bwrap_args, file_system_view, interpreter
from llm_zoo.sandbox.zygote import SHARED_DIRECTORIES

#: The server interpreter's options: no user site (-s), no site module (-S), no .pyc files (-B),
#: no script directory on sys.path (-P, Python 3.11+). Not ``-I``: it implies ``-E``, which ignores
#: SERVER_ENV's ``PYTHONHASHSEED``. The server's environment is SERVER_ENV alone, so no other
#: variable of the host reaches the interpreter either way.
SERVER_FLAGS = ("-s", "-S", "-B", *(("-P",) if sys.version_info >= (3, 11) else ()))

UID_BASE_ENV_VAR = "LLM_ZOO_SANDBOX_UID_BASE"
DEFAULT_UID_BASE = 2_000_000_000  # above the ranges distributions, systemd and containers hand out
UID_COUNT = 65_536
UID_LOCK_DIR = "/tmp/llm_zoo_sandbox_uids"  # fixed, not $TMPDIR: every process must agree on it
STARTUP_TIMEOUT_S = 30.0
ANSWER_GRACE_S = 10.0  # beyond a program's timeout, how long the host waits for its server
# The server's modules, in the order they are loaded (each imports only earlier ones).
#: "0": runs share their server's /tmp (a new directory each) instead of a tmpfs of their own each
#: (``jail.mount_run_tmp``, the default), which leaves a channel between runs open (inode numbers,
#: about 18 bits a run) to save its cost: 0.1 ms a run on an idle 2-core Xeon (a trivial program
#: 2.84 -> 2.93 ms), about 6 ms under load (the unmount waits for an RCU grace period).
RUN_TMP_ENV_VAR = "LLM_ZOO_SANDBOX_RUN_TMP"

SERVER_MODULES = (
    "protocol",
    "cgroup",
    "cleanup",
    "jail",
    "seccomp",
    "runner",
    "zygote",
    "server",
)
_BOOTSTRAP = """
import os, sys, types
os.close(SELF_FD)  # read: programs never find it open
root = types.ModuleType("llm_zoo")
package = types.ModuleType("llm_zoo.sandbox")  # without its __init__: the server needs none of it
root.__path__ = package.__path__ = []
root.sandbox = package
sys.modules.update({"llm_zoo": root, "llm_zoo.sandbox": package})
for name, source in SOURCES:
    module = types.ModuleType("llm_zoo.sandbox." + name)
    sys.modules[module.__name__] = module
    setattr(package, name, module)
    exec(compile(source, "<llm_zoo sandbox " + name + ">", "exec"), module.__dict__)
sys.exit(sys.modules["llm_zoo.sandbox.server"].main(CONFIG))
"""


_reapers: set[threading.Thread] = set()  # servers being killed in the background
_finish_lock = threading.Lock()


def join_reapers(timeout_s: float = 10.0) -> None:
    """Wait (up to ``timeout_s`` in all) for servers being killed in the background."""
    deadline = time.monotonic() + timeout_s
    for thread in list(_reapers):
        thread.join(max(0.0, deadline - time.monotonic()))


class SandboxError(RuntimeError):
    """The sandbox itself failed: a layer is unavailable, or a server could not be started."""


class WorkerDied(SandboxError):
    """A server stopped answering: it exited, or (``missed_deadline``) did not answer in time.

    ``started`` counts the jobs of the request it had begun: the last of them was running.
    """

    def __init__(self, message: str, *, missed_deadline: bool = False, started: int = 0) -> None:
        super().__init__(message)
        self.missed_deadline = missed_deadline
        self.started = started


@dataclasses.dataclass(frozen=True)
class LayerPlan:
    """How servers of one isolation layer are started and how they contain a run.

    Attributes:
        name: ``"bubblewrap"`` or ``"rlimits"``.
        uid_drop: Programs run under a uid leased for their server (only possible as root).
        keep_read_search: Programs keep CAP_DAC_READ_SEARCH after the uid drop because the Python
            installation is not readable by other users (e.g. under a 0700 ``/root``).
        cleanup: How leftovers are found: ``"pidns"`` (everything in the server's pid namespace),
            ``"uid"`` (everything running as the leased uid) or ``"tree"`` (the zygote's
            children, round after round; programs run under the host's own uid).
        bwrap_args: The bubblewrap options before the file system view (empty: no bubblewrap).
        jail: The fallback server enters namespaces of its own (``jail``).
        memory: ``("v1" | "v2", parent directory)`` of the run cgroups; empty: no memory cgroup.
        fixed_pids: Every program gets the same pid, whatever earlier runs forked (the probe saw
            it); set by the probe.
        hidden_servers: Programs do not see their server and zygote in ``/proc`` (the probe saw
            it); set by the probe.
        run_tmp: Every run is to get a tmpfs work dir of its own (unless ``$LLM_ZOO_SANDBOX_RUN_TMP``
            is 0).
        private_run_tmp: Every run has a tmpfs work dir of its own (the probe saw it); set by the
            probe.
        masked_host_counters: Programs cannot open ``/proc/stat`` and ``/proc/vmstat`` (the probe
            saw it); set by the probe.
        notes: What was checked and decided, for :func:`llm_zoo.sandbox.isolation_info`.
    """

    name: str
    uid_drop: bool
    keep_read_search: bool
    cleanup: str
    bwrap_args: tuple[str, ...] = ()
    jail: bool = False
    memory: tuple[str, ...] = ()
    fixed_pids: bool = False
    hidden_servers: bool = False
    run_tmp: bool = False
    private_run_tmp: bool = False
    masked_host_counters: bool = False
    notes: tuple[str, ...] = ()

    @property
    def namespaces(self) -> bool:
        """Programs run in namespaces of their own: no network, a minimal file system view."""
        return bool(self.bwrap_args) or self.jail


@functools.lru_cache(maxsize=1)
def _server_sources() -> str:
    here = Path(__file__).parent
    return repr([(name, (here / f"{name}.py").read_text(encoding="utf-8")) for name in SERVER_MODULES])


def server_program(options: dict, self_fd: int) -> bytes:
    """The program a server runs: its modules' source, its configuration, the bootstrap."""
    return f"SOURCES = {_server_sources()}\nCONFIG = {options!r}\nSELF_FD = {self_fd}\n{_BOOTSTRAP}".encode()


def server_command(
    plan: LayerPlan, options: dict, disk_mb: int, info_fd: int | None, program_fd: int, args_fd: int
) -> tuple[list[str], bytes]:
    """The command line that starts a server of ``plan``, and what the memory file ``args_fd``
    must hold: bubblewrap reads its options from there (``--args``: its command line would show
    some 2 KB of them), then runs the interpreter on the memory file ``program_fd`` (which
    :func:`server_program` fills).

    The fallback's options change: its namespaces' view goes into ``options``.
    """
    command = [interpreter(), *SERVER_FLAGS, f"/proc/self/fd/{program_fd}"]
    if plan.bwrap_args:
        bwrap, *settings = plan.bwrap_args
        settings += ["--info-fd", str(info_fd), *bwrap_args(file_system_view(disk_mb)), "--chdir", "/tmp"]
        return [bwrap, "--args", str(args_fd), *command], b"".join(arg.encode() + b"\0" for arg in settings)
    if plan.jail:
        options["jail"] = {
            "ops": file_system_view(disk_mb),
            "mountpoint": options["scratch"],
            "info_fd": info_fd,
        }
        options["scratch"] = "/tmp"
    return command, b""


@functools.lru_cache(maxsize=1)
def _memory_backed_directory() -> str | None:
    """``/dev/shm`` where it is a writable tmpfs, for work dirs without namespaces (else ``None``:
    the default temporary directory). Every run gets a new work dir, which on a disk file system
    costs milliseconds (about 3.7 ms measured on ext4, against 0.1 ms on a tmpfs)."""
    kind = None
    try:
        with open("/proc/self/mountinfo") as handle:
            for line in handle:
                fields, _, rest = line.partition(" - ")
                if fields.split()[4] == "/dev/shm":
                    kind = rest.split()[0]  # the last mount there is the one in use
    except (OSError, IndexError):
        return None
    return "/dev/shm" if kind == "tmpfs" and os.access("/dev/shm", os.W_OK) else None


def _memory_file(name: str) -> int:
    return os.memfd_create(name, os.MFD_CLOEXEC)


def _write_all(fd: int, content: bytes) -> None:
    view = memoryview(content)
    while view:
        view = view[os.write(fd, view) :]


class UidLease:
    """A uid in ``[base, base + 65536)`` that no other live lease on this machine holds.

    A lease is an exclusive ``flock`` on ``/tmp/llm_zoo_sandbox_uids/<uid>``; the kernel drops it
    when the holder exits, however it exits. A fresh lease first kills any process still running
    as its uid (left by a holder that crashed).
    """

    def __init__(self) -> None:
        base = int(os.environ.get(UID_BASE_ENV_VAR, DEFAULT_UID_BASE))
        directory = _lock_directory()
        for step in range(UID_COUNT):  # the lowest free one: lock files only for peak concurrency
            uid = base + step
            fd = os.open(os.path.join(directory, str(uid)), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            self.uid, self._fd = uid, fd
            kill_processes_of_uid(uid)
            return
        raise SandboxError(f"all {UID_COUNT} sandbox uids from {base} are leased")

    def release(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def _lock_directory() -> str:
    with contextlib.suppress(FileExistsError):
        os.mkdir(UID_LOCK_DIR, 0o700)
    info = os.lstat(UID_LOCK_DIR)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid() or info.st_mode & 0o022:
        raise SandboxError(
            f"{UID_LOCK_DIR} must be a directory owned by uid {os.geteuid()}, not group/other writable"
        )
    return UID_LOCK_DIR


def processes_of_uid(uid: int) -> list[int]:
    """Pids whose real, effective, saved or file-system uid is ``uid`` (from ``/proc/*/status``)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/status", "rb") as handle:
                for line in handle:
                    if line.startswith(b"Uid:"):
                        if str(uid).encode() in line.split()[1:]:
                            found.append(int(entry))
                        break
        except OSError:
            continue
    return found


def kill_processes_of_uid(uid: int, deadline_s: float = 5.0) -> bool:
    """SIGKILL every process of ``uid`` until none is left; False if some outlive the deadline."""
    deadline = time.monotonic() + deadline_s
    while pids := processes_of_uid(uid):
        if time.monotonic() > deadline:
            return False
        for pid in pids:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.01)
    return True


class Worker:
    """One fork server under a :class:`LayerPlan`, driven over its stdin/stdout pipes.

    Not thread-safe: one caller at a time (the pool in :mod:`llm_zoo.sandbox` sees to that).

    Attributes:
        server_pid: The server's pid in the host's pid namespace (under bubblewrap and the
            fallback's namespaces, the sandbox's pid 1: killing it ends every process inside).
    """

    def __init__(self, plan: LayerPlan, disk_mb: int = 256) -> None:
        self._finished = False
        self.refused: str | None = None  # why the server retired before a job, if it did
        self.plan = plan
        self.lease = UidLease() if plan.uid_drop else None
        self.init_pid: int | None = None
        self.cgroup: RunCgroup | None = None
        self._scratch: str | None = None
        self._log = tempfile.TemporaryFile()  # noqa: SIM115  # the server's stderr, shown if it fails
        # One byte per job the server starts, read only when it dies: which job it was running.
        self._progress, write_end = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        progress_write: int | None = write_end
        info_read = info_write = program = arguments = None
        try:
            options: dict = {"uid": self.lease.uid if self.lease else -1, "keep_read_search": plan.keep_read_search,
                             "cleanup": plan.cleanup, "scratch": "/tmp", "progress_fd": progress_write,
                             "allow_inet": plan.namespaces, "disk_mb": int(disk_mb),
                             "run_tmp": plan.run_tmp}  # fmt: skip
            if not plan.bwrap_args:
                self._scratch = options["scratch"] = tempfile.mkdtemp(
                    prefix="llm_zoo_sandbox_", dir=None if plan.namespaces else _memory_backed_directory()
                )
                os.chmod(self._scratch, 0o711)  # the program's uid must reach its work dir inside
            if plan.namespaces:
                info_read, info_write = os.pipe()
            passed = [write_end] + ([] if info_write is None else [info_write])
            if plan.memory:
                self.cgroup = RunCgroup(*plan.memory)
                options["cgroup_procs_fd"] = self.cgroup.procs_fd
                options["memory_fds"], options["memory_events_fd"] = (
                    self.cgroup.limit_fds,
                    self.cgroup.events_fd,
                )
                options["memory_usage_fds"] = self.cgroup.usage_fds
                options["memory_version"] = self.cgroup.version
                passed += self.cgroup.fds
            program, arguments = _memory_file("llm_zoo_sandbox_server"), _memory_file("llm_zoo_sandbox_args")
            argv, argument_bytes = server_command(plan, options, disk_mb, info_write, program, arguments)
            _write_all(program, server_program(options, program))
            _write_all(arguments, argument_bytes)
            os.lseek(arguments, 0, os.SEEK_SET)  # bubblewrap reads this very descriptor
            self.process = subprocess.Popen(
                argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log, env=SERVER_ENV,
                start_new_session=True, pass_fds=[*passed, program, arguments], bufsize=0,
            )  # fmt: skip
            for fd in (info_write, program, arguments, progress_write):
                if fd is not None:
                    os.close(fd)
            info_write = program = arguments = progress_write = None
            deadline = time.monotonic() + STARTUP_TIMEOUT_S
            if info_read is not None:
                self.init_pid = _read_child_pid(info_read, deadline)
            hello = read_frame(self._out, deadline)
            if hello is None or not hello[0].get("ready"):
                raise SandboxError(f"the sandbox server did not start: {self._server_log()}")
        except BaseException as exc:
            self.kill()
            if isinstance(exc, (OSError, TimeoutError, ValueError)):
                raise SandboxError(f"the sandbox server did not start: {exc}; {self._server_log()}") from exc
            raise
        finally:
            for fd in (info_read, info_write, program, arguments, progress_write):
                if fd is not None:
                    os.close(fd)

    @property
    def server_pid(self) -> int:
        return self.init_pid or self.process.pid

    @property
    def _out(self) -> int:
        return self.process.stdout.fileno()  # type: ignore[union-attr]

    def execute(
        self, jobs: Sequence[tuple[dict, bytes, bytes]]
    ) -> tuple[list[tuple[dict, bytes, bytes]], bool]:
        """Run a chunk of programs, given as (limits, code, stdin); (header, stdout, stderr) each,
        and whether the server retired.

        The answer is shorter than ``jobs`` when the server retired: after one of them (its header
        says ``"retire"``), or before starting the next, whose memory limit its cgroup refused
        (possibly before the first: then no result at all). The jobs without a result never ran.

        Raises:
            WorkerDied: The server exited, or missed the chunk's deadline (the sum of its
                timeouts plus ``ANSWER_GRACE_S``); either way it is unusable.
        """
        blobs = [blob for _, code, stdin in jobs for blob in (code, stdin)]
        deadline = time.monotonic() + ANSWER_GRACE_S + sum(float(job["timeout"]) + 0.5 for job, _, _ in jobs)
        self._jobs_started()  # what earlier requests left in the pipe
        try:
            write_frame(self.process.stdin.fileno(), {"jobs": [job for job, _, _ in jobs]}, blobs)  # type: ignore[union-attr]
            frame = read_frame(self._out, deadline)
        except TimeoutError as exc:
            raise WorkerDied(
                f"the sandbox server did not answer in time; {self._server_log()}", missed_deadline=True,
                started=self._jobs_started(),
            ) from exc  # fmt: skip
        except (OSError, ValueError) as exc:
            raise WorkerDied(
                f"the sandbox server failed: {exc!r}; {self._server_log()}", started=self._jobs_started()
            ) from exc
        if frame is None:
            raise WorkerDied(f"the sandbox server exited: {self._server_log()}", started=self._jobs_started())
        header, outputs = frame
        results, refused = header["results"], header.get("refused")
        least = 0 if refused else 1
        if not least <= len(results) <= len(jobs) or len(outputs) != 2 * len(results):
            raise WorkerDied(f"the sandbox server answered {len(results)} results for {len(jobs)} jobs",
                             started=self._jobs_started())  # fmt: skip
        if refused:
            self.refused = refused
        replies = [(result, outputs[2 * i], outputs[2 * i + 1]) for i, result in enumerate(results)]
        return replies, bool(header.get("retire"))

    def _jobs_started(self) -> int:
        """How many jobs the server started since the last call (its progress pipe, drained)."""
        count = 0
        with contextlib.suppress(BlockingIOError, OSError):
            while chunk := os.read(self._progress, 4096):
                count += len(chunk)
        return count

    @property
    def alive(self) -> bool:
        return self.process.poll() is None

    def close(self, wait_s: float = 2.0) -> None:
        """Ask the server to exit (end of file on its stdin); kill it if it does not."""
        with contextlib.suppress(OSError):
            self.process.stdin.close()  # type: ignore[union-attr]
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(wait_s)
        self.kill()

    def kill(self, background: bool = False) -> None:
        """Kill the server and everything of its runs, release its uid and files.

        ``background``: only the kill is done now; waiting for the server's end (a large private
        ``/tmp`` takes the kernel a while to free), removing its scratch dir and what its uid left,
        then releasing the uid and the cgroup, happen in a thread, off the caller's time.
        """
        process = getattr(self, "process", None)
        if process is not None and process.poll() is None:
            if self.init_pid is not None:  # killing bubblewrap's init tears the namespace down
                with contextlib.suppress(OSError):
                    os.kill(self.init_pid, signal.SIGKILL)
            with contextlib.suppress(OSError):
                os.killpg(process.pid, signal.SIGKILL)
        if background:
            thread = threading.Thread(target=self._finish_kill, name="llm_zoo-sandbox-reaper", daemon=True)
            _reapers.add(thread)
            thread.start()
        else:
            self._finish_kill()

    def _finish_kill(self) -> None:
        # Once only: a worker killed by hand and then found dead by the pool is killed twice, and a
        # second pass would close fd numbers (and kill the processes of a uid) that belong to
        # someone else by then.
        with _finish_lock:
            if self._finished:
                return
            self._finished = True
        process = getattr(self, "process", None)
        if process is not None:
            process.wait()
            for pipe in (process.stdin, process.stdout):
                with contextlib.suppress(OSError):
                    pipe.close()  # type: ignore[union-attr]
        if self.lease is not None:
            kill_processes_of_uid(self.lease.uid)
            if not self.plan.namespaces:  # what the uid left in the world-writable directories
                remove_entries_of(self.lease.uid, SHARED_DIRECTORIES)
            self.lease.release()  # only now may another server run programs under this uid
        if self.cgroup is not None:
            self.cgroup.remove()
            self.cgroup = None
        if self._scratch is not None:
            remove_tree(self._scratch)  # no recursion: a program's tree can be thousands deep
            self._scratch = None
        with contextlib.suppress(OSError):
            os.close(self._progress)
        self._progress = -1
        self._log.close()
        _reapers.discard(threading.current_thread())

    def abandon(self) -> None:
        """In a forked copy of the host: drop this worker without touching the parent's server."""
        for pipe in (self.process.stdin, self.process.stdout):
            with contextlib.suppress(OSError):
                pipe.close()  # type: ignore[union-attr]
        self.process.returncode = 0  # not ours to wait for
        if self.lease is not None:
            self.lease.release()  # closes our copy only: the parent keeps the lock
        if self.cgroup is not None:
            for fd in self.cgroup.fds:
                with contextlib.suppress(OSError):
                    os.close(fd)
            self.cgroup = None
        self._scratch = None
        with contextlib.suppress(OSError):
            os.close(self._progress)
        self._log.close()

    def _server_log(self) -> str:
        try:
            self._log.seek(0)
            text = self._log.read()[-2000:].decode(errors="replace").strip()
        except (OSError, ValueError):
            text = ""
        return f"server stderr: {text!r}" if text else "no server output"


def _read_child_pid(fd: int, deadline: float) -> int | None:
    """bubblewrap's ``--info-fd`` JSON holds the host pid of the namespace's init."""
    data = b""
    while time.monotonic() < deadline:
        if not select.select([fd], [], [], max(0.0, deadline - time.monotonic()))[0]:
            break
        chunk = os.read(fd, 4096)
        if not chunk:
            break
        data += chunk
        try:
            return int(json.loads(data)["child-pid"])
        except (ValueError, KeyError):
            continue
    return None
