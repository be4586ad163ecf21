"""The seccomp filter every program runs under (standard library only).

What it refuses, and why:

* Kernel keyrings (``add_key``, ``request_key``, ``keyctl``: ``EPERM``, as under Docker's default
  profile): they are not namespaced and outlive processes, so a key one program adds to its uid's
  keyring would be seen by the next program under that uid.
* User namespaces (``unshare``/``clone`` with ``CLONE_NEWUSER``: ``EPERM``): one would give a
  program capabilities over new mount and network namespaces, and bubblewrap's
  ``--disable-userns`` is not available without a user namespace of its own (root). ``clone3``,
  whose flags a filter cannot read, fails with ``ENOSYS``, so the C library falls back to ``clone``.
* Sockets of any family but ``AF_UNIX``, plus ``AF_INET``/``AF_INET6`` where a network namespace
  of its own cuts the network (``socket``: ``EAFNOSUPPORT``; ``socketpair``: ``AF_UNIX`` only).
  Families that no namespace cuts stay closed that way: ``AF_VSOCK`` (a virtual machine's ports
  to its host), netlink, packet sockets; without namespaces, the network itself.
* ``io_uring_setup``/``_enter``/``_register`` (``ENOSYS``, as on a kernel without io_uring: the
  C library and Python fall back to ordinary calls), ``perf_event_open``, ``userfaultfd``, ``bpf``
  and ``memfd_secret`` (``EPERM``): no program of the kind run here needs them, and each is a
  large kernel interface with a record of exploitable bugs (``userfaultfd`` also stalls the
  kernel at will, ``memfd_secret`` memory is hidden from the kernel's own accounting views).
* System V IPC (``shmget``, ``msgget``, ``semget`` and every call on such objects: ``ENOSYS``, as
  on a kernel built without it): each new object's id comes from a sequence shared by every run
  of a server (a channel of about 19 bits from one run to the next, measured), its objects
  outlive processes, and no program of the kind run here uses it (Python's ``multiprocessing``
  and ``shared_memory`` use POSIX shared memory, files in ``/dev/shm``).
* System calls of another ABI (x32, i386): ``ENOSYS``.

The filter needs ``PR_SET_NO_NEW_PRIVS``, which the server sets. :func:`prepare` builds it once in
the server; each program's process only installs it (:func:`install`).
"""

from __future__ import annotations

import ctypes
import errno
import platform

_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER = 22, 2
_RET_ALLOW, _RET_ERRNO = 0x7FFF0000, 0x00050000
_CLONE_NEWUSER = 0x10000000
_AF_UNIX, _AF_INET, _AF_INET6 = 1, 2, 10
_LD_ABS_W, _JEQ, _JGE, _JSET, _RET = 0x20, 0x15, 0x35, 0x45, 0x06
# machine: audit arch, then system call numbers by name
_SYSCALLS = {
    "x86_64": {
        "arch": 0xC000003E, "add_key": 248, "request_key": 249, "keyctl": 250, "unshare": 272,
        "clone": 56, "clone3": 435, "socket": 41, "socketpair": 53, "io_uring_setup": 425,
        "io_uring_enter": 426, "io_uring_register": 427, "perf_event_open": 298, "userfaultfd": 323,
        "bpf": 321, "memfd_secret": 447, "shmget": 29, "shmat": 30, "shmctl": 31, "semget": 64,
        "semop": 65, "semctl": 66, "shmdt": 67, "msgget": 68, "msgsnd": 69, "msgrcv": 70, "msgctl": 71,
        "semtimedop": 220,
    },
    "aarch64": {
        "arch": 0xC00000B7, "add_key": 217, "request_key": 218, "keyctl": 219, "unshare": 97,
        "clone": 220, "clone3": 435, "socket": 198, "socketpair": 199, "io_uring_setup": 425,
        "io_uring_enter": 426, "io_uring_register": 427, "perf_event_open": 241, "userfaultfd": 282,
        "bpf": 280, "memfd_secret": 447, "msgget": 186, "msgctl": 187, "msgrcv": 188, "msgsnd": 189,
        "semget": 190, "semctl": 191, "semtimedop": 192, "semop": 193, "shmget": 194, "shmctl": 195,
        "shmat": 196, "shmdt": 197,
    },
}  # fmt: skip
SYSTEM_V_IPC = (
    "shmget", "shmat", "shmctl", "shmdt", "msgget", "msgsnd", "msgrcv", "msgctl", "semget", "semop",
    "semtimedop", "semctl",
)  # fmt: skip
REFUSED = {  # system call -> errno (see the module docs)
    "add_key": errno.EPERM, "request_key": errno.EPERM, "keyctl": errno.EPERM, "clone3": errno.ENOSYS,
    "io_uring_setup": errno.ENOSYS, "io_uring_enter": errno.ENOSYS, "io_uring_register": errno.ENOSYS,
    "perf_event_open": errno.EPERM, "userfaultfd": errno.EPERM, "bpf": errno.EPERM,
    "memfd_secret": errno.EPERM, **dict.fromkeys(SYSTEM_V_IPC, errno.ENOSYS),
}  # fmt: skip


def socket_families(allow_inet: bool) -> tuple[str, ...]:
    """The socket families programs may create."""
    return ("AF_UNIX", "AF_INET", "AF_INET6") if allow_inet else ("AF_UNIX",)


class _Instruction(ctypes.Structure):
    _fields_ = [
        ("code", ctypes.c_uint16),
        ("jt", ctypes.c_uint8),
        ("jf", ctypes.c_uint8),
        ("k", ctypes.c_uint32),
    ]


class _Program(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(_Instruction))]


def _assemble(lines: list[tuple]) -> list[_Instruction]:
    """``(label,)`` marks a position; ``(code, k, true_label, false_label)`` jumps by label."""
    positions, count = {}, 0
    for line in lines:
        if len(line) == 1:
            positions[line[0]] = count
        else:
            count += 1
    program: list[_Instruction] = []
    for line in lines:
        if len(line) == 1:
            continue
        code, k, true_label, false_label = line
        jumps = [positions[label] - len(program) - 1 if label else 0 for label in (true_label, false_label)]
        program.append(_Instruction(code, jumps[0], jumps[1], k))
    return program


def _build(allow_inet: bool) -> tuple[_Program, ctypes.Array] | None:
    numbers = _SYSCALLS.get(platform.machine())
    if numbers is None:
        return None
    lines: list[tuple] = [
        (_LD_ABS_W, 4, None, None),  # seccomp_data.arch
        (_JEQ, numbers["arch"], None, "nosys"),
        (_LD_ABS_W, 0, None, None),  # seccomp_data.nr
        (_JGE, 0x40000000, "nosys", None),  # the x32 ABI
    ]
    lines += [(_JEQ, numbers[name], f"errno{code}", None) for name, code in REFUSED.items()]
    lines += [
        (_JEQ, numbers["unshare"], "flags", None),
        (_JEQ, numbers["clone"], "flags", None),
        (_JEQ, numbers["socket"], "family", None),
        (_JEQ, numbers["socketpair"], "pair", None),
        (_RET, _RET_ALLOW, None, None),
        ("flags",),
        (_LD_ABS_W, 16, None, None),  # the low half of the first argument: the clone flags
        (_JSET, _CLONE_NEWUSER, f"errno{errno.EPERM}", "allow"),
        ("family",),
        (_LD_ABS_W, 16, None, None),  # the first argument: the address family
        *([(_JEQ, _AF_INET, "allow", None), (_JEQ, _AF_INET6, "allow", None)] if allow_inet else []),
        (_JEQ, _AF_UNIX, "allow", f"errno{errno.EAFNOSUPPORT}"),
        ("pair",),
        (_LD_ABS_W, 16, None, None),
        (_JEQ, _AF_UNIX, "allow", f"errno{errno.EAFNOSUPPORT}"),
        ("allow",),
        (_RET, _RET_ALLOW, None, None),
        ("nosys",),
        (_RET, _RET_ERRNO | errno.ENOSYS, None, None),
    ]
    for code in sorted({*REFUSED.values(), errno.EPERM, errno.EAFNOSUPPORT}):
        lines += [(f"errno{code}",), (_RET, _RET_ERRNO | code, None, None)]
    instructions = _assemble(lines)
    array = (_Instruction * len(instructions))(*instructions)
    return _Program(len(instructions), array), array


_libc = ctypes.CDLL(None, use_errno=True)
AVAILABLE = platform.machine() in _SYSCALLS
_filter: tuple[_Program, ctypes.Array] | None = None


def prepare(allow_inet: bool) -> None:
    """Build the filter (in the server, once): ``allow_inet`` where a namespace cuts the network."""
    global _filter
    _filter = _build(allow_inet)


def install() -> None:
    """Install the filter on this process (and all it forks); a no-op where it is unavailable."""
    if _filter is None:
        return
    if _libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(_filter[0]), 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "could not install the seccomp filter")
