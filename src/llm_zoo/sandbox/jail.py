"""Namespaces without bubblewrap: what the fallback server does first (standard library only).

:func:`enter` moves the calling process into new mount, pid, network, IPC and UTS namespaces (and
a user namespace of one uid when not root), builds the file system view the host computed
(``view.file_system_view``) on an empty tmpfs, and ``pivot_root``\\ s into it. The caller
forks on the way: the process that returns is pid 1 of the new pid namespace, so when it dies the
kernel kills every process of the sandbox; the original process stays outside, writes the pid of
that init to the info fd (as bubblewrap's ``--info-fd`` does), waits for it and exits with its
status. The new network namespace has only a loopback, which is down: every connection fails.
"""

from __future__ import annotations

import ctypes
import json
import os
import platform
import signal
from collections.abc import Sequence

CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC = 0x00020000, 0x04000000, 0x08000000
CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x10000000, 0x20000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
MNT_DETACH = 2
_PR_SET_PDEATHSIG = 1
_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41, "riscv64": 41, "ppc64le": 203, "s390x": 217}
_DEVICES = ("null", "zero", "full", "random", "urandom", "tty")
_libc = ctypes.CDLL(None, use_errno=True)


def _check(result: int, what: str) -> None:
    if result != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{what}: {os.strerror(errno)}")


# Programs see only the processes of their own uid in /proc: not the server's or the zygote's,
# whose counters (CPU time and page faults of every run they reaped) carry bits from one run to
# the next. Where programs share the server's uid (no uid drop) it hides nothing.
PROC_OPTIONS = "hidepid=2"


def hide_other_processes() -> None:
    """Remount this namespace's ``/proc`` with :data:`PROC_OPTIONS` (bubblewrap mounts it plain)."""
    _mount(None, "/proc", None, MS_REMOUNT | MS_NOSUID | MS_NODEV | MS_NOEXEC, PROC_OPTIONS)


# Host-wide event counters a program can advance by exact amounts and a later program (of any
# server) reads back: /proc/stat's count of forks since boot carried 4 bits a run to an outside
# corpus (more with a larger modulus), /proc/vmstat counts pages and faults the same way. Programs
# cannot open them (EACCES: a device node on a nodev mount); the CPU count does not need them.
MASKED_HOST_COUNTERS = ("/proc/stat", "/proc/vmstat")


def mask_host_counters() -> None:
    """Bind ``/dev/null`` over :data:`MASKED_HOST_COUNTERS` in this mount namespace, read-only and
    ``nodev``: opening one fails with ``EACCES``.

    Best effort: where the kernel refuses, the files stay readable, the layer's probe sees it and
    ``isolation_info()`` states the channel open."""
    for path in MASKED_HOST_COUNTERS:
        try:
            _mount("/dev/null", path, None, MS_BIND)
            _mount(None, path, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC)
        except OSError:
            continue


#: Files (hard links included) a run may make in its own work dir: removing them all when the
#: run's last process exits is then bounded (a hundred thousand links would take the kernel
#: about a second), and no program of the kind run here makes more.
RUN_TMP_INODES = 16384


def mount_run_tmp(workdir: str, size_mb: int, uid: int | None, source: bytes) -> None:
    """A new tmpfs on ``workdir`` for one run, holding the program as ``main.py`` (read-only to it).

    Nothing of an earlier run can show through it: its inode numbers start afresh in every run
    (a shared ``/tmp`` counts every file every earlier run made: about 18 bits from run to run),
    and its free space is all the run's. :func:`unmount_run_tmp` ends it once the run's
    processes are gone. (A mount namespace per run would do the same at about 5 ms a run: the
    kernel tears each one down after an RCU grace period; a mount costs about 0.1 ms.)
    """
    owner = f",uid={uid},gid={uid}" if uid is not None else ""
    options = f"mode=0700,size={int(size_mb)}m,nr_inodes={RUN_TMP_INODES}{owner}"
    _mount("tmpfs", workdir, "tmpfs", MS_NOSUID | MS_NODEV, options)
    program = os.open(
        os.path.join(workdir, "main.py"), os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644
    )
    with os.fdopen(program, "wb") as handle:
        handle.write(source)


def unmount_run_tmp(workdir: str) -> None:
    """End a run's tmpfs: everything in it is freed (lazily, should anything still hold it)."""
    _check(_libc.umount2(workdir.encode(), MNT_DETACH), f"umount {workdir}")


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    encode = lambda text: text.encode() if text is not None else None  # noqa: E731
    _check(_libc.mount(encode(source), encode(target), encode(fstype), ctypes.c_ulong(flags), encode(data)),
           f"mount {source} on {target}")  # fmt: skip


def unshare_flags(root: bool) -> int:
    """The namespaces a fallback server gets."""
    flags = CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS
    return flags if root else flags | CLONE_NEWUSER


def enter(ops: Sequence[Sequence[str]], mountpoint: str, info_fd: int, keep_fds: Sequence[int]) -> None:
    """Enter new namespaces and the view ``ops`` built on ``mountpoint``; returns in the new init.

    ``keep_fds``: the descriptors the server goes on using (the outer process closes its copies,
    so that the host sees end of file as soon as the sandbox is gone).
    """
    uid, gid = os.getuid(), os.getgid()
    _check(_libc.unshare(unshare_flags(uid == 0)), "unshare")
    if uid != 0:  # a user namespace of one uid, the caller's own
        for name, content in (
            ("setgroups", "deny"),
            ("uid_map", f"{uid} {uid} 1"),
            ("gid_map", f"{gid} {gid} 1"),
        ):
            with open(f"/proc/self/{name}", "w") as handle:
                handle.write(content)
    read_end, write_end = os.pipe()
    child = os.fork()
    if child:
        os.close(read_end)
        for fd in keep_fds:
            os.close(fd)
        os.write(info_fd, json.dumps({"child-pid": child}).encode())
        os.close(info_fd)
        os.close(write_end)  # the init may start
        while True:
            try:
                _, status = os.waitpid(child, 0)
                break
            except InterruptedError:
                continue
        os._exit(os.waitstatus_to_exitcode(status) & 0xFF if os.WIFEXITED(status) else 1)
    os.close(info_fd)
    os.close(write_end)
    os.read(read_end, 1)  # the host knows our pid before we do anything
    os.close(read_end)
    _check(_libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "prctl(PDEATHSIG)")
    _build_root(ops, mountpoint)
    mask_host_counters()
    _check(_libc.sethostname(b"sandbox", 7), "sethostname")


def _build_root(ops: Sequence[Sequence[str]], root: str) -> None:
    _mount(None, "/", None, MS_REC | MS_PRIVATE)  # nothing we mount reaches the host
    _mount("tmpfs", root, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755,size=1m")
    for kind, source, destination in ops:
        target = root + destination
        if kind == "tmpfs":
            mode, size_mb = source.split(":")
            os.makedirs(target, 0o755, exist_ok=True)
            _mount("tmpfs", target, "tmpfs", MS_NOSUID | MS_NODEV, f"mode={mode},size={int(size_mb)}m")
        elif kind == "mask":
            os.makedirs(target, 0o755, exist_ok=True)
            _mount("tmpfs", target, "tmpfs", MS_NOSUID | MS_NODEV | MS_RDONLY, "mode=0555,size=4k")
        elif kind == "dir":
            os.makedirs(target, 0o755, exist_ok=True)
        elif kind == "symlink":
            os.symlink(source, target)
        elif kind in ("ro-bind", "ro-bind-try"):
            if os.path.exists(source):
                _bind(source, target, read_only=True)
            elif kind == "ro-bind":
                raise FileNotFoundError(source)
        elif kind == "proc":
            os.makedirs(target, 0o755, exist_ok=True)
            _mount("proc", target, "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, PROC_OPTIONS)
        elif kind == "dev":
            _build_dev(target)
        else:
            raise ValueError(f"unknown mount operation {kind!r}")
    _mount(None, root, None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV, "mode=0755")
    os.chdir(root)
    number = _PIVOT_ROOT.get(platform.machine())
    if number is None:
        raise OSError(f"pivot_root: unknown system call number on {platform.machine()}")
    _check(_libc.syscall(number, b".", b"."), "pivot_root")
    _check(_libc.umount2(b".", MNT_DETACH), "umount the host's root")
    os.chdir("/")


def _bind(source: str, target: str, read_only: bool) -> None:
    if os.path.isdir(source):
        os.makedirs(target, 0o755, exist_ok=True)
    else:
        os.makedirs(os.path.dirname(target), 0o755, exist_ok=True)
        if not os.path.exists(target):
            os.close(os.open(target, os.O_WRONLY | os.O_CREAT, 0o644))
    _mount(source, target, None, MS_BIND | MS_REC)
    if read_only:
        _mount(None, target, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)


def _build_dev(target: str) -> None:
    os.makedirs(target, 0o755, exist_ok=True)
    _mount("tmpfs", target, "tmpfs", MS_NOSUID | MS_NOEXEC, "mode=0755,size=64k")
    for name in _DEVICES:
        if os.path.exists(f"/dev/{name}"):
            _bind(f"/dev/{name}", f"{target}/{name}", read_only=False)
    for name, link in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"),
                       ("stdout", "/proc/self/fd/1"), ("stderr", "/proc/self/fd/2")):  # fmt: skip
        os.symlink(link, f"{target}/{name}")
    os.mkdir(f"{target}/shm", 0o755)  # not writable by programs: nothing is left in it
