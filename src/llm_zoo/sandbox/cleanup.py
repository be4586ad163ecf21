"""Removing what a run left behind, in bounded time (standard library only; runs in the server).

A program can leave a directory tree of any shape: a chain thousands of levels deep (which broke
the recursion of ``shutil.rmtree``), or a hundred thousand directories and hard links (seconds to
remove). :func:`remove_tree` therefore keeps its own stack instead of recursing, never follows a
symbolic link, makes a directory the program locked itself out of writable again, and stops at a
deadline, saying whether it finished. What it could not remove in time is left for a cheaper
remedy: the server retires and its private ``/tmp`` (a tmpfs) goes with its namespaces, or, where
there is none, the host removes the rest in the background.
"""

from __future__ import annotations

import contextlib
import os
import stat
import time

BUDGET_S = 0.25  # what cleaning up after one run may take before a cheaper remedy is used


def remove_tree(path: str, deadline: float | None = None) -> bool:
    """Remove ``path`` (a file, a link or a whole tree) without recursion; False if out of time.

    ``deadline`` is a ``time.monotonic()`` value; ``None`` means no limit. The walk holds one
    directory descriptor at a time and a stack of names (a path thousands of levels deep is
    longer than the kernel accepts). Call it only when nothing else can change the tree (every
    process of the run is gone). False also when something cannot be removed (a mount point).
    """
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return True
    except OSError:
        return False
    if not stat.S_ISDIR(info.st_mode):
        return _unlink(path)
    try:
        os.chmod(path, 0o700)  # a directory the program made unreadable or unwritable
        current = os.open(path, _DIRECTORY_FLAGS)
    except OSError:
        return False
    names: list[str] = []  # the way down from ``path`` to ``current``
    try:
        pending = [_unlink_files(current, deadline)]  # per level: the subdirectories still to remove
        while True:
            if deadline is not None and time.monotonic() > deadline:
                return False
            if pending[-1]:
                below = pending[-1].pop()
                with contextlib.suppress(OSError):
                    os.chmod(below, 0o700, dir_fd=current)  # a directory, not a link: it was checked
                child = os.open(below, _DIRECTORY_FLAGS, dir_fd=current)
                os.close(current)
                current = child
                names.append(below)
                pending.append(_unlink_files(current, deadline))
                continue
            pending.pop()
            if not names:
                break
            parent = os.open("..", _DIRECTORY_FLAGS, dir_fd=current)
            os.close(current)
            current = parent
            os.rmdir(names.pop(), dir_fd=current)
    except (OSError, TimeoutError):
        return False
    finally:
        os.close(current)
    try:
        os.rmdir(path)
    except FileNotFoundError:
        pass
    except OSError:
        return False
    return True


_DIRECTORY_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _unlink_files(directory: int, deadline: float | None) -> list[str]:
    """Unlink everything but the subdirectories in ``directory``; the subdirectories' names.

    Raises:
        OSError: An entry cannot be removed.
        TimeoutError: Past ``deadline``.
    """
    subdirectories = []
    with os.scandir(directory) as entries:
        for count, entry in enumerate(entries):
            if entry.is_dir(follow_symlinks=False):
                subdirectories.append(entry.name)
            else:
                os.unlink(entry.name, dir_fd=directory)
            if count % 256 == 255 and deadline is not None and time.monotonic() > deadline:
                raise TimeoutError
    return subdirectories


def _unlink(path: str) -> bool:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    except OSError:
        return False
    return True


def remove_entries_of(uid: int, directories: tuple[str, ...], deadline: float | None = None) -> bool:
    """Remove what ``uid`` owns directly in ``directories`` (and below); False if out of time."""
    complete = True
    for directory in directories:
        with contextlib.suppress(OSError), os.scandir(directory) as entries:
            for entry in list(entries):
                with contextlib.suppress(OSError):
                    if entry.stat(follow_symlinks=False).st_uid == uid:
                        complete = remove_tree(entry.path, deadline) and complete
                if deadline is not None and time.monotonic() > deadline:
                    return False
    return complete
