"""The file system a sandboxed program sees: the Python runtime, read-only, and nothing else.

:func:`file_system_view` lists mount operations (see :data:`MountOp`) that build the view from an
empty root: ``/usr``, ``/bin``/``/lib*``, a few ``/etc`` files, the interpreter and its standard
library, a private ``/tmp``, fresh ``/proc`` and ``/dev``. Every ``site-packages``/``dist-packages``
directory and the directory that holds ``llm_zoo`` itself are covered by an empty read-only tmpfs
wherever they would otherwise be visible: they hold the envs' hidden data (Code-v0 tests, gold
answers) and anything pip installed. The same list is turned into a bubblewrap command line
(:func:`bwrap_args`) or carried out by the server itself in the fallback (``jail``).

The server runs the base interpreter (never a virtualenv's) with ``-I -S -B``: its ``sys.path`` is
the standard library alone.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from pathlib import Path

# (kind, source, destination): "tmpfs" (source: mode as octal text), "ro-bind", "ro-bind-try",
# "dir", "symlink" (source: the link's target), "proc", "dev", "mask" (an empty read-only tmpfs).
MountOp = tuple[str, str, str]
#: The server's (and so every program's) interpreter environment. A fixed hash seed makes the
#: iteration order of sets of strings the same in every run, so the same program prints the same.
SERVER_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "PYTHONHASHSEED": "0"}
_ETC_FILES = (
    "ld.so.cache", "ld.so.conf", "ld.so.conf.d", "localtime", "timezone", "passwd", "group",
    "nsswitch.conf", "hosts", "alternatives",
)  # fmt: skip


def interpreter() -> str:
    """The real interpreter behind ``sys.executable`` (a virtualenv's link resolved)."""
    return os.path.realpath(sys.executable)


@functools.lru_cache(maxsize=1)
def runtime_paths() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(paths to show, directories to hide) for the interpreter run as ``python -I -S``.

    Shown: the interpreter binary, its ``libpython`` files and its standard library directories.
    Hidden: every package directory a ``site`` import could add, the user's site directory and
    the directories ``llm_zoo`` is imported from.
    """
    probe = (
        "import json, site, sys, sysconfig\n"
        "print(json.dumps({'path': sys.path, 'prefix': sys.base_prefix, 'libdir': sysconfig.get_config_var('LIBDIR'),"
        " 'site': site.getsitepackages() + [site.getusersitepackages()]}))"
    )
    found = json.loads(
        subprocess.run(
            [interpreter(), "-I", "-S", "-c", probe],
            capture_output=True,
            text=True,
            timeout=60,
            env=SERVER_ENV,
            check=True,
        ).stdout
    )
    shown = {interpreter(), *found["path"]}
    libdir = found["libdir"] or os.path.join(found["prefix"], "lib")
    if os.path.isdir(libdir):
        shown.update(str(p) for p in Path(libdir).glob("libpython*"))
    hidden = set(found["site"])
    for prefix in {sys.prefix, sys.base_prefix, found["prefix"], "/usr", "/usr/local"}:  # venv, base, system
        for lib in ("lib", "lib64", "local/lib"):
            for pattern in ("python3*/site-packages", "python3*/dist-packages", "python3/dist-packages"):
                hidden.update(str(p) for p in Path(prefix, lib).glob(pattern))
    hidden.update(str(p) for p in Path("/usr/lib/python3").glob("dist-packages"))
    package_dir = Path(__file__).resolve().parent
    hidden.update({str(package_dir), str(package_dir.parent)})
    real = lambda paths: tuple(sorted({os.path.realpath(p) for p in paths if p and os.path.exists(p)}))  # noqa: E731
    return real(shown), real(hidden)


def _inside(path: str, directory: str) -> bool:
    return path == directory or path.startswith(directory.rstrip("/") + "/")


def file_system_view(disk_mb: int) -> list[MountOp]:
    """Mount operations, in order, that build a program's file system on an empty root."""
    shown, hidden = runtime_paths()
    # The private /tmp first: the interpreter may live under the host's /tmp (a CI checkout's
    # Python), and a later tmpfs would hide it.
    ops: list[MountOp] = [("tmpfs", f"0755:{int(disk_mb)}", "/tmp")]
    visible = ["/usr"]
    for path in shown:
        if not any(_inside(path, seen) for seen in visible):
            visible.append(path)
    made: set[str] = set()
    for path in visible:  # mount points are created world-traversable, whatever the host's modes
        for parent in reversed(Path(path).parents):
            if str(parent) != "/" and str(parent) not in made:
                made.add(str(parent))
                ops.append(("dir", "", str(parent)))
    ops += [("ro-bind", path, path) for path in visible]
    for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        if os.path.islink(top):
            ops.append(("symlink", os.readlink(top), top))
        elif os.path.isdir(top):
            ops.append(("ro-bind", top, top))
    ops.append(("dir", "", "/etc"))
    ops += [("ro-bind-try", f"/etc/{name}", f"/etc/{name}") for name in _ETC_FILES]
    for path in hidden:  # only where a bound directory would show it, and not inside another
        shown_here = any(_inside(path, seen) for seen in visible) and os.path.isdir(path)
        if shown_here and not any(_inside(path, other) and other != path for other in hidden):
            ops.append(("mask", "", path))
    return [*ops, ("proc", "", "/proc"), ("dev", "", "/dev")]


def bwrap_args(ops: list[MountOp]) -> list[str]:
    """The bubblewrap options that carry out ``ops``."""
    args: list[str] = []
    for kind, source, destination in ops:
        if kind == "tmpfs":
            mode, size_mb = source.split(":")
            args += ["--perms", mode, "--size", str(int(size_mb) << 20), "--tmpfs", destination]
        elif kind == "mask":
            args += ["--perms", "0555", "--size", "4096", "--tmpfs", destination, "--remount-ro", destination]
        elif kind == "dir":
            args += ["--perms", "0755", "--dir", destination]
        elif kind == "symlink":
            args += ["--symlink", source, destination]
        elif kind in ("ro-bind", "ro-bind-try"):
            args += [f"--{kind}", source, destination]
        elif kind in ("proc", "dev"):
            args += [f"--{kind}", destination]
        else:
            raise ValueError(f"unknown mount operation {kind!r}")
    return args
