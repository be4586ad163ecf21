"""A seccomp filter for programs: no kernel keyrings, no user namespaces (standard library only).

Kernel keyrings are not namespaced and outlive processes: a key a program adds to its uid's
keyring would be seen by the next program under that uid, and a dead key's description stays in
``/proc/keys`` until the kernel's garbage collector runs (tens of milliseconds). Programs have no
use for keyrings, so ``add_key``, ``request_key`` and ``keyctl`` fail with ``EPERM`` (as under
Docker's default profile). Creating a user namespace (``unshare``/``clone`` with
``CLONE_NEWUSER``) fails with ``EPERM`` too: it would give a program capabilities over new mount
and network namespaces, and bubblewrap's ``--disable-userns`` is not available without a user
namespace of its own (root). ``clone3``, whose flags a filter cannot read, fails with ``ENOSYS``,
so the C library falls back to ``clone``. System calls of another ABI (x32, i386) fail with
``ENOSYS``. The filter needs ``PR_SET_NO_NEW_PRIVS``, which the server sets.
"""

from __future__ import annotations

import ctypes
import platform

_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER = 22, 2
_RET_ALLOW, _RET_ERRNO = 0x7FFF0000, 0x00050000
_EPERM, _ENOSYS = 1, 38
_CLONE_NEWUSER = 0x10000000
_LD_ABS_W, _JEQ, _JGE, _JSET, _RET = 0x20, 0x15, 0x35, 0x45, 0x06
# machine: (audit arch, add_key, request_key, keyctl, unshare, clone, clone3)
_SYSCALLS = {
    "x86_64": (0xC000003E, 248, 249, 250, 272, 56, 435),
    "aarch64": (0xC00000B7, 217, 218, 219, 97, 220, 435),
}


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


def _build() -> tuple[_Program, ctypes.Array] | None:
    numbers = _SYSCALLS.get(platform.machine())
    if numbers is None:
        return None
    arch, add_key, request_key, keyctl, unshare, clone, clone3 = numbers
    lines = [
        (_LD_ABS_W, 4, None, None),  # seccomp_data.arch
        (_JEQ, arch, None, "nosys"),
        (_LD_ABS_W, 0, None, None),  # seccomp_data.nr
        (_JGE, 0x40000000, "nosys", None),  # the x32 ABI
        (_JEQ, add_key, "eperm", None),
        (_JEQ, request_key, "eperm", None),
        (_JEQ, keyctl, "eperm", None),
        (_JEQ, clone3, "nosys", None),
        (_JEQ, unshare, "flags", None),
        (_JEQ, clone, "flags", None),
        (_RET, _RET_ALLOW, None, None),
        ("flags",),
        (_LD_ABS_W, 16, None, None),  # the low half of the first argument: the clone flags
        (_JSET, _CLONE_NEWUSER, "eperm", None),
        (_RET, _RET_ALLOW, None, None),
        ("eperm",),
        (_RET, _RET_ERRNO | _EPERM, None, None),
        ("nosys",),
        (_RET, _RET_ERRNO | _ENOSYS, None, None),
    ]
    instructions = _assemble(lines)
    array = (_Instruction * len(instructions))(*instructions)
    return _Program(len(instructions), array), array


_FILTER = _build()  # built once, in the server: a child only installs it
_libc = ctypes.CDLL(None, use_errno=True)
AVAILABLE = _FILTER is not None


def install() -> None:
    """Install the filter on this process (and all it forks); a no-op where it is unavailable."""
    if _FILTER is None:
        return
    if _libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(_FILTER[0]), 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "could not install the seccomp filter")
