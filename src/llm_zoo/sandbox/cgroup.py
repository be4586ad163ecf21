"""Memory cgroups: one per sandbox server, holding the processes of its current run.

``RLIMIT_AS`` caps each process's address space, but neither memfd pages nor System V shared
memory count against it. A memory cgroup counts every page a run's processes are charged for,
those included, over all its processes together. :func:`find_memory_hierarchy` finds where this
process may create cgroups with the memory controller (cgroup v2 ``memory.max``, or a v1 memory
hierarchy's ``memory.limit_in_bytes``, below this process's own cgroup); :class:`RunCgroup` makes
one for a server. The server writes the run's ``memory_mb`` to its limit files before each run,
and each program's process moves itself into it before it allocates anything. Swap is not
allowed (v2 ``memory.swap.max`` 0; v1 ``memsw`` equal to the limit). When the limit is reached the
kernel's OOM killer kills a process of the run (``exit_code`` -9).
"""

from __future__ import annotations

import contextlib
import itertools
import os
import time

_counter = itertools.count()


def _own_cgroups() -> dict[str, str]:
    """Controller (or ``""`` for cgroup v2) -> this process's cgroup path."""
    paths = {}
    with open("/proc/self/cgroup") as handle:
        for line in handle:
            _, controllers, path = line.rstrip("\n").split(":", 2)
            for controller in controllers.split(",") if controllers else [""]:
                paths[controller] = path
    return paths


def _mounts() -> list[tuple[str, str, str, set[str]]]:
    """(fstype, mount point, root within the hierarchy, super options) of every cgroup mount."""
    found = []
    with open("/proc/self/mountinfo") as handle:
        for line in handle:
            left, _, right = line.rstrip("\n").partition(" - ")
            fields, (fstype, _source, options) = left.split(), right.split(" ", 2)
            if fstype in ("cgroup", "cgroup2"):
                found.append((fstype, fields[4], fields[3], set(options.split(","))))
    return found


def _under(mount_point: str, root: str, path: str) -> str | None:
    if root != "/" and not (path == root or path.startswith(root + "/")):
        return None
    relative = path[len(root) :] if root != "/" else path
    return os.path.join(mount_point, relative.lstrip("/"))


def find_memory_hierarchy() -> tuple[str, str] | str:
    """(``"v2"``/``"v1"``, the directory to create run cgroups in), or why there is none."""
    try:
        own, mounts = _own_cgroups(), _mounts()
    except OSError as exc:
        return f"cannot read this process's cgroups: {exc}"
    reasons = []
    for fstype, mount_point, root, options in mounts:
        if fstype == "cgroup2" and "" in own:
            directory = _under(mount_point, root, own[""])
            if directory is None:
                continue
            try:
                with open(os.path.join(directory, "cgroup.controllers")) as handle:
                    if "memory" not in handle.read().split():
                        reasons.append("cgroup v2 without the memory controller")
                        continue
                with open(os.path.join(directory, "cgroup.subtree_control")) as handle:
                    enabled = "memory" in handle.read().split()
                if not enabled:  # refused (EBUSY) while this cgroup holds processes, unless it is the root
                    with open(os.path.join(directory, "cgroup.subtree_control"), "w") as handle:
                        handle.write("+memory")
            except OSError as exc:
                reasons.append(f"cgroup v2 memory controller not delegated here ({exc.strerror})")
                continue
            if os.access(directory, os.W_OK):
                return "v2", directory
            reasons.append(f"cgroup v2 directory {directory} is not writable")
        elif fstype == "cgroup" and "memory" in options and "memory" in own:
            directory = _under(mount_point, root, own["memory"])
            if directory is not None and os.access(directory, os.W_OK):
                return "v1", directory
            reasons.append(f"cgroup v1 memory directory {directory} is not writable")
    return "; ".join(reasons) or "no cgroup memory controller is mounted"


class RunCgroup:
    """A memory cgroup for one server's runs, and the descriptors the server needs to use it.

    Attributes:
        procs_fd: ``cgroup.procs``, opened for writing: a program's process writes ``0`` to it.
        limit_fds: The limit files, in the order to write them when lowering the limit.
        events_fd: The file counting OOM kills (v1 ``memory.oom_control``, v2 ``memory.events``:
            their ``oom_kill`` line), opened for reading.
        usage_fds: The cgroup's usage (v1 ``memory.usage_in_bytes``, v2 ``memory.current``) and
            its ``memory.stat``, opened for reading: after a run the server reads what is still
            charged once every process of the run is gone (see :func:`unreclaimable_bytes`).
    """

    def __init__(self, version: str, parent: str) -> None:
        self.version = version
        self.procs_fd, self.events_fd, self.limit_fds, self.usage_fds = -1, -1, [], []
        self.path = os.path.join(parent, f"llm_zoo_sandbox_{os.getpid()}_{next(_counter)}")
        os.mkdir(self.path, 0o755)
        try:
            if version == "v2":
                with contextlib.suppress(FileNotFoundError):  # no swap accounting: no swap to use
                    self._write("memory.swap.max", "0")
                with contextlib.suppress(FileNotFoundError):
                    self._write("memory.oom.group", "0")
                limits = ["memory.max"]
            else:
                limits = ["memory.limit_in_bytes"]
                if os.path.exists(os.path.join(self.path, "memory.memsw.limit_in_bytes")):
                    limits.append("memory.memsw.limit_in_bytes")
                self._write("memory.swappiness", "0")
            self.procs_fd = os.open(os.path.join(self.path, "cgroup.procs"), os.O_WRONLY | os.O_CLOEXEC)
            events = "memory.events" if version == "v2" else "memory.oom_control"
            self.events_fd = os.open(os.path.join(self.path, events), os.O_RDONLY | os.O_CLOEXEC)
            self.limit_fds = [
                os.open(os.path.join(self.path, name), os.O_WRONLY | os.O_CLOEXEC) for name in limits
            ]
            usage = "memory.current" if version == "v2" else "memory.usage_in_bytes"
            self.usage_fds = [
                os.open(os.path.join(self.path, name), os.O_RDONLY | os.O_CLOEXEC)
                for name in (usage, "memory.stat")
            ]
        except BaseException:
            self.remove()
            raise

    def _write(self, name: str, value: str) -> None:
        with open(os.path.join(self.path, name), "w") as handle:
            handle.write(value)

    @property
    def fds(self) -> list[int]:
        return [self.procs_fd, self.events_fd, *self.limit_fds, *self.usage_fds]

    def peak_bytes(self) -> int | None:
        """The most memory the cgroup's processes held together since it was made (if known)."""
        name = "memory.max_usage_in_bytes" if self.version == "v1" else "memory.peak"
        try:
            with open(os.path.join(self.path, name)) as handle:
                return int(handle.read())
        except (OSError, ValueError):
            return None

    def remove(self, wait_s: float = 5.0) -> None:
        """Close the descriptors and remove the cgroup (once the last process in it is reaped)."""
        for fd in self.fds:
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self.procs_fd, self.events_fd, self.limit_fds, self.usage_fds = -1, -1, [], []
        deadline = time.monotonic() + wait_s
        while True:
            try:
                os.rmdir(self.path)
                return
            except FileNotFoundError:
                return
            except OSError:
                if time.monotonic() > deadline:
                    return
                time.sleep(0.01)


# memory.stat lines of page cache: charged to the cgroup, but the kernel reclaims them before it
# would refuse a run memory (v1 counts the whole hierarchy under ``total_``).
_RECLAIMABLE = {
    "v1": ("total_inactive_file", "total_active_file"),
    "v2": ("inactive_file", "active_file", "slab_reclaimable"),
}


def unreclaimable_bytes(version: str, usage_fd: int, stat_fd: int) -> int:
    """What the cgroup holds that its next run could not get back: its usage less page cache.

    Read once the run's processes are gone, this is memory the run left charged: in flight
    (descriptors of pipes, memory files and sockets sent over a Unix socket and never received,
    freed only by the kernel's garbage collection of such sockets), or kernel objects.
    """
    usage = int(os.pread(usage_fd, 64, 0))
    stat = {}
    for line in os.pread(stat_fd, 16384, 0).decode().splitlines():
        name, _, value = line.partition(" ")
        stat[name] = value
    reclaimable = sum(int(stat.get(name, 0)) for name in _RECLAIMABLE[version])
    return max(0, usage - reclaimable)


def remove_stale_cgroups(parent: str) -> None:
    """Remove run cgroups that hosts which are no longer alive left behind."""
    with contextlib.suppress(OSError):
        for entry in os.listdir(parent):
            if entry.startswith("llm_zoo_sandbox_"):
                host = entry.split("_")[3]
                if host.isdigit() and not os.path.exists(f"/proc/{host}"):
                    with contextlib.suppress(OSError):
                        os.rmdir(os.path.join(parent, entry))
