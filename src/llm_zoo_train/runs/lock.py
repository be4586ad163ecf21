"""One live run per output directory: ``OUTPUT_DIR/.llm-zoo-train.lock``.

A run takes the lock before it changes anything in its output directory and releases it when it
ends (normally, with an error, or interrupted; at the latest when the process exits). The lock is
an exclusive ``flock`` on the lock file, held open for the whole run: the kernel gives it to one
process at a time, however many start in the same instant, and takes it back when the holder
dies (a run killed with -9 leaves no live lock). The file also holds the holder's PID, host name
and start time as JSON, written only once the ``flock`` is held, for the messages. A second run
into the same directory while the holder is alive is refused with a one-line
:class:`RunLockedError` naming it (or saying it is still starting, when the holder has not
written its name yet). A file whose ``flock`` is free is stale (its holder is gone): it is
reported and taken over, unless it names a live process of this host (a run of a version that
wrote the file without the ``flock``), which is refused, or a run on another host, whose
``flock`` may not reach this one over a network file system: that is refused too, and the message
says which file to delete once that run is known to be over.
"""

from __future__ import annotations

import atexit
import contextlib
import datetime
import fcntl
import json
import os
import socket
from pathlib import Path
from typing import Any

__all__ = ["LOCK_NAME", "RunLock", "RunLockedError"]

LOCK_NAME = ".llm-zoo-train.lock"


class RunLockedError(Exception):
    """Another live run holds the output directory; the message is one line naming it."""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: alive
        return True
    return True


def _describe(holder: dict[str, Any]) -> str:
    return f"pid {holder.get('pid')} on {holder.get('host')} since {holder.get('started')}"


#: The locks this process holds, by lock file: a later trainer of the same process takes over.
_HELD: dict[Path, RunLock] = {}


def _read_holder(descriptor: int) -> dict[str, Any] | None:
    """The JSON the lock file holds; ``{}`` for an empty file, ``None`` for one that is not a
    holder's JSON."""
    try:
        text = os.pread(descriptor, 65_536, 0).decode("utf-8")
        if not text.strip():
            return {}
        holder = json.loads(text)
    except (OSError, ValueError):
        return None
    return holder if isinstance(holder, dict) else None


class RunLock:
    """The lock of ``output_dir`` (see the module docstring).

    Args:
        output_dir: The run's output directory (created when missing).
    """

    def __init__(self, output_dir: str | Path):
        self.path = Path(output_dir) / LOCK_NAME
        self.held = False
        self._created_dir = False
        self._descriptor: int | None = None

    def acquire(self) -> str | None:
        """Take the lock; returns a note when a stale lock was taken over (else None).
        :class:`RunLockedError` when a live run holds it. A lock this process already holds (an
        earlier trainer of the same process) is taken over silently."""
        self._created_dir = not self.path.parent.exists()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        earlier = _HELD.get(self.path.resolve())
        if earlier is not None and earlier is not self:
            earlier.release()
        for _ in range(5):  # the holder may release (and remove the file) between two calls
            descriptor = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                holder = _read_holder(descriptor)
                os.close(descriptor)
                if holder:
                    raise RunLockedError(
                        f"{self.path.parent} is in use by a run still going ({_describe(holder)}): wait "
                        "for it to end or choose another training.output_dir"
                    ) from None
                raise RunLockedError(
                    f"{self.path.parent} is in use by a run still starting (it holds {self.path} and has "
                    "not written its name yet): wait for it to end or choose another training.output_dir"
                ) from None
            if not self._same_file(descriptor):  # released and removed since we opened it
                os.close(descriptor)
                continue
            try:
                note = self._judge_file(_read_holder(descriptor))
            except RunLockedError:
                os.close(descriptor)
                raise
            record = {
                "pid": os.getpid(),
                "host": socket.gethostname(),
                "started": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            }
            os.ftruncate(descriptor, 0)
            os.pwrite(descriptor, json.dumps(record).encode("utf-8"), 0)
            self._descriptor = descriptor
            self.held = True
            _HELD[self.path.resolve()] = self
            atexit.register(self.release)
            return note
        raise RunLockedError(f"could not take the lock {self.path}: another run keeps taking it")

    def _same_file(self, descriptor: int) -> bool:
        try:
            return os.stat(self.path).st_ino == os.fstat(descriptor).st_ino
        except FileNotFoundError:
            return False

    def _judge_file(self, holder: dict[str, Any] | None) -> str | None:
        """What the file says once its ``flock`` is ours: nothing (a new file), a stale holder (a
        note), or a run this ``flock`` cannot vouch for (:class:`RunLockedError`)."""
        if holder is None:
            return f"took over an unreadable lock file {self.path}"
        if not holder:
            return None
        if holder.get("host") != socket.gethostname():
            raise RunLockedError(
                f"{self.path.parent} is used by a run on another host ({_describe(holder)}); "
                f"if that run is over, delete {self.path}"
            )
        pid = holder.get("pid")
        if pid == os.getpid():
            return None
        if isinstance(pid, int) and _alive(pid):
            raise RunLockedError(
                f"{self.path.parent} is in use by a run still going ({_describe(holder)}): wait "
                "for it to end or choose another training.output_dir"
            )
        return f"took over the stale lock of a run that is gone ({_describe(holder)}) in {self.path.parent}"

    def release(self) -> None:
        """Remove the lock file and let the ``flock`` go (and remove the output directory, if
        taking the lock created it and nothing else was written); safe to call twice."""
        if not self.held:
            return
        self.held = False
        if _HELD.get(self.path.resolve()) is self:
            del _HELD[self.path.resolve()]
        descriptor, self._descriptor = self._descriptor, None
        with contextlib.suppress(OSError):
            if descriptor is not None and self._same_file(descriptor):
                self.path.unlink()  # while the flock is held: no one else's file is removed
        if descriptor is not None:
            with contextlib.suppress(OSError):
                os.close(descriptor)
        if self._created_dir:
            with contextlib.suppress(OSError):
                self.path.parent.rmdir()  # only when empty
        with contextlib.suppress(Exception):
            atexit.unregister(self.release)
