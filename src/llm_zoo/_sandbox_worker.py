"""Isolation layers and the host side of one fork server (see :mod:`llm_zoo.sandbox`).

:func:`layer_plan` decides, once per process and layer, how servers are started: the bubblewrap
command line (namespaces, the read-only file system view, the private ``/tmp``), whether programs
run under a uid of their own, and how a server finds and kills what a run leaves behind. Each plan
is checked by starting a real server and running a probe program in it before it is used.

:class:`Worker` starts one server under a plan and runs programs through it; :class:`UidLease`
gives each server a uid no other server on the machine uses at the same time.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import functools
import json
import os
import select
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from llm_zoo import _sandbox_server as server

LAYERS = ("bubblewrap", "rlimits")
LAYER_ENV_VAR = "LLM_ZOO_SANDBOX_LAYER"
UID_BASE_ENV_VAR = "LLM_ZOO_SANDBOX_UID_BASE"
DEFAULT_UID_BASE = 2_000_000_000  # above the ranges distributions, systemd and containers hand out
UID_COUNT = 65_536
UID_LOCK_DIR = "/tmp/llm_zoo_sandbox_uids"  # fixed, not $TMPDIR: every process must agree on it
STARTUP_TIMEOUT_S = 30.0
ANSWER_GRACE_S = 10.0  # beyond a program's timeout, how long the host waits for its server
SERVER_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"}
SERVER_SCRIPT = str(Path(server.__file__).resolve())
# What a root server inside bubblewrap keeps: set up and drop to the program's uid, kill its
# processes, and remove its files; every other capability is dropped.
_BWRAP_CAPABILITIES = ("CAP_SETUID", "CAP_SETGID", "CAP_CHOWN", "CAP_KILL", "CAP_DAC_OVERRIDE", "CAP_FOWNER")
_ETC_FILES = (
    "ld.so.cache", "ld.so.conf", "ld.so.conf.d", "localtime", "timezone", "passwd", "group",
    "nsswitch.conf", "hosts", "alternatives",
)  # fmt: skip


class SandboxError(RuntimeError):
    """The sandbox itself failed: a layer is unavailable, or a server could not be started."""


class WorkerDied(SandboxError):
    """A server stopped answering: it exited, or (``missed_deadline``) did not answer in time."""

    def __init__(self, message: str, *, missed_deadline: bool = False) -> None:
        super().__init__(message)
        self.missed_deadline = missed_deadline


@dataclasses.dataclass(frozen=True)
class LayerPlan:
    """How servers of one isolation layer are started and how they contain a run.

    Attributes:
        name: ``"bubblewrap"`` or ``"rlimits"``.
        uid_drop: Programs run under a uid leased for their server (only possible as root).
        keep_read_search: Programs keep CAP_DAC_READ_SEARCH after the uid drop because the Python
            installation is not readable by other users (e.g. under a 0700 ``/root``).
        cleanup: How leftovers are found: ``"pidns"`` (everything in the server's pid namespace),
            ``"uid"`` (everything running as the leased uid) or ``"tree"`` (the server's children,
            round after round; programs run under the host's own uid).
        bwrap_args: The bubblewrap command line before the server command (empty: no bubblewrap).
        notes: What was checked and decided, for :func:`llm_zoo.sandbox.isolation_info`.
    """

    name: str
    uid_drop: bool
    keep_read_search: bool
    cleanup: str
    bwrap_args: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()

    def server_argv(self, uid: int | None, scratch: str, info_fd: int | None) -> list[str]:
        argv = list(self.bwrap_args)
        if info_fd is not None:
            argv[1:1] = ["--info-fd", str(info_fd)]
        argv += [sys.executable, "-I", "-B", SERVER_SCRIPT, "--cleanup", self.cleanup, "--scratch", scratch]
        argv += ["--uid", str(uid if uid is not None else -1)]
        return argv + (["--keep-read-search"] if self.keep_read_search else [])


def requested_layer(layer: str | None) -> str:
    """The layer asked for: the argument, else ``$LLM_ZOO_SANDBOX_LAYER``, else ``"auto"``."""
    choice = (layer or os.environ.get(LAYER_ENV_VAR) or "auto").strip().lower()
    if choice not in (*LAYERS, "auto"):
        raise ValueError(f"unknown sandbox layer {choice!r}; choose one of {', '.join((*LAYERS, 'auto'))}")
    return choice


_plan_lock = threading.Lock()
_plans: dict[str, LayerPlan | SandboxError] = {}


def layer_plan(layer: str | None = None) -> LayerPlan:
    """The checked plan for ``layer`` (``None``/``"auto"``: the strongest that works here).

    Raises:
        SandboxError: A layer asked for by name cannot be used here; the message says why.
    """
    choice = requested_layer(layer)
    if choice == "auto":
        try:
            return layer_plan("bubblewrap")
        except SandboxError:
            return layer_plan("rlimits")
    with _plan_lock:
        if choice not in _plans:
            try:
                _plans[choice] = _make_plan(choice)
            except SandboxError as exc:
                _plans[choice] = exc
        plan = _plans[choice]
    if isinstance(plan, SandboxError):
        raise SandboxError(str(plan))
    return plan


def _make_plan(name: str) -> LayerPlan:
    root = os.geteuid() == 0
    if name == "bubblewrap":
        bwrap = shutil.which("bwrap")
        if bwrap is None:
            raise SandboxError("bubblewrap is not installed (Debian/Ubuntu: apt-get install -y bubblewrap)")
        plan = LayerPlan(name, uid_drop=root, keep_read_search=False, cleanup="pidns",
                         bwrap_args=tuple(_bwrap_args(bwrap, root)))  # fmt: skip
    else:
        plan = LayerPlan(name, uid_drop=root, keep_read_search=False, cleanup="uid" if root else "tree")
    report = _probe(plan)
    if plan.uid_drop and report.get("stdlib_import") is not True:
        # The sandbox uid cannot read the Python installation: let it read (not write) any file.
        plan = dataclasses.replace(plan, keep_read_search=True)
        report = _probe(plan)
    problems = _probe_problems(plan, report)
    if problems:
        raise SandboxError(f"the {name} layer does not work here: {'; '.join(problems)}")
    notes = [f"probe: {json.dumps(report, sort_keys=True)}"]
    if plan.keep_read_search:
        notes.append("programs keep CAP_DAC_READ_SEARCH: the Python installation is not world-readable")
    return dataclasses.replace(plan, notes=tuple(notes))


_PROBE_PROGRAM = r"""
import json, os, socket, sys
report = {"uid": os.getuid(), "pid": os.getpid()}
try:
    import calendar  # not preloaded: needs the standard library to be readable
    report["stdlib_import"] = True
except Exception as exc:
    report["stdlib_import"] = repr(exc)
try:
    with open(os.path.join(sys.prefix, ".llm_zoo_sandbox_probe"), "w"):
        pass
    os.unlink(os.path.join(sys.prefix, ".llm_zoo_sandbox_probe"))
    report["prefix_writable"] = True
except OSError:
    report["prefix_writable"] = False
if CHECK_NETWORK:
    try:
        socket.create_connection(("192.0.2.1", 9), timeout=1).close()
        report["network"] = "connected"
    except OSError as exc:
        report["network"] = exc.strerror or repr(exc)
print(json.dumps(report))
"""


def _probe(plan: LayerPlan) -> dict:
    """Run the probe program through a real server of ``plan``; its report (or the failure)."""
    code = f"CHECK_NETWORK = {bool(plan.bwrap_args)}\n{_PROBE_PROGRAM}"  # cut only by bubblewrap
    try:
        worker = Worker(plan)
    except SandboxError as exc:
        return {"start": str(exc)}
    try:
        [(header, stdout, stderr)] = worker.execute(
            [
                (
                    {"timeout": 10.0, "memory_mb": 512, "max_output_bytes": 1 << 16, "max_processes": 8},
                    code.encode(),
                    b"",
                )
            ]
        )
    except SandboxError as exc:
        return {"start": str(exc)}
    finally:
        worker.close()
    try:
        return dict(json.loads(stdout), exit_code=header["exit_code"])
    except ValueError:
        return {"exit_code": header["exit_code"], "stderr": stderr.decode(errors="replace")[-500:]}


def _probe_problems(plan: LayerPlan, report: dict) -> list[str]:
    if "start" in report:
        return [f"the server did not start: {report['start']}"]
    if report.get("exit_code") != 0:
        return [f"the probe program failed: {report}"]
    problems = []
    if report.get("stdlib_import") is not True:
        problems.append(f"programs cannot import the standard library ({report.get('stdlib_import')})")
    if plan.uid_drop and report.get("uid") == 0:
        problems.append("programs still run as root")
    if plan.bwrap_args:
        if report.get("prefix_writable"):
            problems.append("the Python installation is writable inside the sandbox")
        if report.get("network") == "connected":
            problems.append("the network is reachable inside the sandbox")
    return problems


@functools.lru_cache(maxsize=1)
def _python_paths() -> tuple[str, ...]:
    """Directories the server's interpreter needs: its prefixes and its ``sys.path`` under ``-I``."""
    result = subprocess.run(
        [sys.executable, "-I", "-c", "import json, sys; print(json.dumps(sys.path))"],
        capture_output=True, text=True, timeout=60, env=SERVER_ENV, check=True,
    )  # fmt: skip
    paths = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix}
    paths.update(json.loads(result.stdout))
    paths.add(str(Path(sys.executable).resolve().parent.parent))
    paths.add(str(Path(SERVER_SCRIPT).parent))
    return tuple(sorted(os.path.realpath(p) for p in paths if p and os.path.exists(p)))


def _bwrap_args(bwrap: str, root: bool) -> list[str]:
    """bubblewrap options: no network, own pid/ipc/uts namespaces, a minimal read-only view."""
    if root:  # no user namespace: programs get real (leased) uids, the server a few capabilities
        args = [bwrap, "--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts"]
        args += ["--unshare-cgroup-try", "--cap-drop", "ALL"]
        for capability in _BWRAP_CAPABILITIES:
            args += ["--cap-add", capability]
    else:
        args = [bwrap, "--unshare-all"]
    args += ["--new-session", "--hostname", "sandbox"]
    # The private /tmp first: the interpreter's directories bound below may live under /tmp (a
    # virtualenv in a CI checkout there), and a later tmpfs would hide them.
    args += ["--perms", "0755", "--tmpfs", "/tmp"]
    visible = ["/usr"]  # then the interpreter's directories that /usr does not already hold
    for path in _python_paths():
        if not any(path == seen or path.startswith(seen.rstrip("/") + "/") for seen in visible):
            visible.append(path)
    made: set[str] = set()
    for path in visible:  # mount points are created world-traversable, whatever the host's modes
        for parent in reversed(Path(path).parents):
            if str(parent) != "/" and str(parent) not in made:
                made.add(str(parent))
                args += ["--perms", "0755", "--dir", str(parent)]
    for path in visible:
        args += ["--ro-bind", path, path]
    for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        if os.path.islink(top):
            args += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            args += ["--ro-bind", top, top]
    args += ["--perms", "0755", "--dir", "/etc"]
    for name in _ETC_FILES:
        args += ["--ro-bind-try", f"/etc/{name}", f"/etc/{name}"]
    args += ["--proc", "/proc", "--dev", "/dev"]
    return [*args, "--chdir", "/tmp"]


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
    """

    def __init__(self, plan: LayerPlan, disk_mb: int = 256) -> None:
        self.plan = plan
        self.lease = UidLease() if plan.uid_drop else None
        self.init_pid: int | None = None  # bubblewrap's init in the server's pid namespace
        self._scratch: str | None = None
        self._log = tempfile.TemporaryFile()  # noqa: SIM115  # the server's stderr, shown if it fails
        info_read = info_write = None
        try:
            if plan.bwrap_args:
                scratch = "/tmp"
                info_read, info_write = os.pipe()
            else:
                self._scratch = scratch = tempfile.mkdtemp(prefix="llm_zoo_sandbox_")
                os.chmod(scratch, 0o711)  # the program's uid must reach its work dir inside
            argv = self.plan.server_argv(self.lease.uid if self.lease else None, scratch, info_write)
            if plan.bwrap_args:
                index = argv.index("--tmpfs")
                argv[index:index] = ["--size", str(int(disk_mb) << 20)]
            self.process = subprocess.Popen(
                argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log, env=SERVER_ENV,
                start_new_session=True, pass_fds=() if info_write is None else (info_write,), bufsize=0,
            )  # fmt: skip
            if info_write is not None:
                os.close(info_write)
                info_write = None
            deadline = time.monotonic() + STARTUP_TIMEOUT_S
            if info_read is not None:
                self.init_pid = _read_child_pid(info_read, deadline)
            hello = server.read_frame(self._out, deadline)
            if hello is None or not hello[0].get("ready"):
                raise SandboxError(f"the sandbox server did not start: {self._server_log()}")
        except BaseException as exc:
            self.kill()
            if isinstance(exc, (OSError, TimeoutError, ValueError)):
                raise SandboxError(f"the sandbox server did not start: {exc}; {self._server_log()}") from exc
            raise
        finally:
            for fd in (info_read, info_write):
                if fd is not None:
                    os.close(fd)

    @property
    def _out(self) -> int:
        return self.process.stdout.fileno()  # type: ignore[union-attr]

    def execute(self, jobs: Sequence[tuple[dict, bytes, bytes]]) -> list[tuple[dict, bytes, bytes]]:
        """Run a chunk of programs, given as (limits, code, stdin); (header, stdout, stderr) each.

        The answer is shorter than ``jobs`` when the server retired after one of them (its header
        says ``"retire"``): the rest were not run.

        Raises:
            WorkerDied: The server exited, or missed the chunk's deadline (the sum of its
                timeouts plus ``ANSWER_GRACE_S``); either way it is unusable.
        """
        blobs = [blob for _, code, stdin in jobs for blob in (code, stdin)]
        deadline = time.monotonic() + ANSWER_GRACE_S + sum(float(job["timeout"]) + 0.5 for job, _, _ in jobs)
        try:
            server.write_frame(self.process.stdin.fileno(), {"jobs": [job for job, _, _ in jobs]}, blobs)  # type: ignore[union-attr]
            frame = server.read_frame(self._out, deadline)
        except TimeoutError as exc:
            raise WorkerDied(
                f"the sandbox server did not answer in time; {self._server_log()}", missed_deadline=True
            ) from exc
        except (OSError, ValueError) as exc:
            raise WorkerDied(f"the sandbox server failed: {exc!r}; {self._server_log()}") from exc
        if frame is None:
            raise WorkerDied(f"the sandbox server exited: {self._server_log()}")
        header, outputs = frame
        results = header["results"]
        if not 0 < len(results) <= len(jobs) or len(outputs) != 2 * len(results):
            raise WorkerDied(f"the sandbox server answered {len(results)} results for {len(jobs)} jobs")
        return [(result, outputs[2 * i], outputs[2 * i + 1]) for i, result in enumerate(results)]

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

    def kill(self) -> None:
        """Kill the server and everything of its runs, release its uid and files."""
        process = getattr(self, "process", None)
        if process is not None and process.poll() is None:
            if self.init_pid is not None:  # killing bubblewrap's init tears the namespace down
                with contextlib.suppress(OSError):
                    os.kill(self.init_pid, signal.SIGKILL)
            with contextlib.suppress(OSError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        if process is not None:
            for pipe in (process.stdin, process.stdout):
                with contextlib.suppress(OSError):
                    pipe.close()  # type: ignore[union-attr]
        if self.lease is not None:
            kill_processes_of_uid(self.lease.uid)
            self.lease.release()
        if self._scratch is not None:
            shutil.rmtree(self._scratch, ignore_errors=True)
            self._scratch = None
        self._log.close()

    def abandon(self) -> None:
        """In a forked copy of the host: drop this worker without touching the parent's server."""
        for pipe in (self.process.stdin, self.process.stdout):
            with contextlib.suppress(OSError):
                pipe.close()  # type: ignore[union-attr]
        self.process.returncode = 0  # not ours to wait for
        if self.lease is not None:
            self.lease.release()  # closes our copy only: the parent keeps the lock
        self._scratch = None
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
