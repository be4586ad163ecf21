"""The zygote: the process every program is forked from (standard library only).

The server forks its zygote right after start-up, before it reads any job, so the zygote's
memory never holds a job's code, input or output, and neither does any program forked from it.
For each run the server sends it the child's descriptors (memory files the zygote never reads)
over a Unix socket; the zygote forks, hands the server a pidfd of the child (the server enforces
the wall-clock timeout with it), waits for the child, kills and reaps everything the run left
(the zygote is a child subreaper: orphans, double-forked daemons included, come back to it),
removes the run's System V IPC objects (and, without namespaces, its files in the world-writable
directories), and answers with the exit status and CPU time.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import time

from llm_zoo.sandbox import cleanup, runner

REAP_DEADLINE_S = 5.0
_IPC_RMID = 0
_SYSV_IPC_KINDS = (("shm", "shmid"), ("msg", "msqid"), ("sem", "semid"))
_MAX_FDS = 8
SHARED_DIRECTORIES = ("/tmp", "/var/tmp", "/dev/shm")  # world-writable: cleaned without namespaces


# The pid namespace's last allocated pid, written before each program's fork: the program's pid (and
# its children's) is then the same in every run, whatever earlier runs forked (about 14 bits per
# run otherwise, measured: a run forks k processes, the next reads k from its own pid).
PROGRAM_PID_BEFORE = 2  # the server is 1, the zygote 2: every program is pid 3


def _open_last_pid(config) -> int | None:  # type: ignore[no-untyped-def]
    """``/proc/sys/kernel/ns_last_pid``, opened once, where a pid namespace is the sandbox's own
    and this process may write it (CAP_CHECKPOINT_RESTORE or CAP_SYS_ADMIN there)."""
    if config.cleanup != "pidns":
        return None
    try:
        fd = os.open("/proc/sys/kernel/ns_last_pid", os.O_WRONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        os.pwrite(fd, str(PROGRAM_PID_BEFORE).encode(), 0)
    except OSError:
        os.close(fd)
        return None
    return fd


def serve(channel: socket.socket, config) -> None:  # type: ignore[no-untyped-def]  # ServerConfig
    """The zygote's loop: one run per message, until the server goes away."""
    runner.die_with_parent()
    runner.prctl(runner.PR_SET_CHILD_SUBREAPER, 1)
    last_pid = _open_last_pid(config)
    with contextlib.suppress(OSError):  # the server mounts runs' work dirs; the zygote has no need of it
        runner.drop_capability(runner.CAP_SYS_ADMIN)
    while True:
        try:
            _, fds, _, _ = socket.recv_fds(channel, 16, _MAX_FDS)
        except OSError:
            return
        if not fds:
            return  # the server closed the socket
        if last_pid is not None:
            os.pwrite(last_pid, str(PROGRAM_PID_BEFORE).encode(), 0)
        pid = os.fork()
        if pid == 0:
            channel.close()
            if last_pid is not None:
                os.close(last_pid)
            runner.run_child(fds, config)
        for fd in fds:
            os.close(fd)
        pidfd = os.pidfd_open(pid)
        socket.send_fds(channel, [b"p"], [pidfd])
        os.close(pidfd)
        _, status, usage = os.wait4(pid, 0)
        clean = reap_everything(config)
        tidy = clean_kernel_state(config)
        answer = {"status": status, "cpu_s": usage.ru_utime + usage.ru_stime, "clean": clean, "tidy": tidy}
        channel.send(json.dumps(answer).encode())


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


def _as_uid(uid: int, action) -> None:  # type: ignore[no-untyped-def]
    """Run ``action`` in a helper process that has become ``uid``; wait for it."""
    helper = os.fork()
    if helper == 0:
        try:
            os.setgroups([])
            os.setresgid(uid, uid, uid)
            os.setresuid(uid, uid, uid)
            action()
        except BaseException as exc:  # the server's log shows it; the run's result does not depend on it
            os.write(2, f"sandbox: cleanup as uid {uid} failed: {exc!r}\n".encode())
        finally:
            os._exit(0)
    os.waitpid(helper, 0)


def kill_leftovers(config) -> None:  # type: ignore[no-untyped-def]
    """SIGKILL every process of the current run that is still alive (the zygote excepted)."""
    if config.cleanup == "pidns":  # in the server's pid namespace: all but its init and us
        with contextlib.suppress(ProcessLookupError):
            os.kill(-1, signal.SIGKILL)
    elif config.cleanup == "uid":  # a uid of our own: kill(-1) as that uid reaches exactly the run
        _as_uid(config.uid, lambda: os.kill(-1, signal.SIGKILL))
    else:  # same uid as us: kill our children, their orphans come back to us for the next round
        for child in _children_of(os.getpid()):
            for kill in (os.killpg, os.kill):
                with contextlib.suppress(OSError):
                    kill(child, signal.SIGKILL)


def reap_everything(config) -> bool:  # type: ignore[no-untyped-def]
    """Kill and reap until the zygote has no child left; False if some survive the deadline."""
    deadline = time.monotonic() + REAP_DEADLINE_S
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
            kill_leftovers(config)
            killed_at = now
        time.sleep(0.001)


def _ipc_objects(config) -> list[tuple[str, int]]:  # type: ignore[no-untyped-def]
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
    return found


def _remove_ipc(found: list[tuple[str, int]]) -> None:
    for kind, object_id in found:
        if kind == "sem":
            runner.libc.semctl(object_id, 0, _IPC_RMID)
        else:
            getattr(runner.libc, f"{kind}ctl")(object_id, _IPC_RMID, None)


def clean_kernel_state(config) -> bool:  # type: ignore[no-untyped-def]
    """Remove what a run leaves outside its processes: System V IPC objects and shared files.

    System V objects outlive processes (a segment keeps its memory until removed); found in
    ``/proc/sysvipc`` by owner: the program's uid, or, alone in an IPC namespace (bubblewrap,
    the fallback's namespaces), every object there. Under the host's own uid without namespaces
    they cannot be told apart from the user's own and are left alone. Removing needs the owner's
    uid (a server under bubblewrap keeps no CAP_IPC_OWNER), so a helper takes it. Without
    namespaces, what the program's uid left in ``/tmp``, ``/var/tmp`` and ``/dev/shm`` goes too,
    as root once every process of the run is gone (nothing can swap a path meanwhile), without
    recursion and within the cleanup budget. False if something is left: the server then retires,
    and the host removes the rest before another server may use the uid.
    """
    if config.uid is None and config.cleanup != "pidns":
        return True
    found = _ipc_objects(config)
    if found and config.uid is None:
        _remove_ipc(found)
    elif found:
        _as_uid(config.uid, lambda: _remove_ipc(found))
    if config.uid is not None and not config.private_files:
        deadline = time.monotonic() + config.cleanup_budget_s
        return cleanup.remove_entries_of(config.uid, SHARED_DIRECTORIES, deadline)
    return True
