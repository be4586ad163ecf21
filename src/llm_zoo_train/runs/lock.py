"""One live run per output directory: ``OUTPUT_DIR/.llm-zoo-train.lock``.

A run takes the lock before it changes anything in its output directory and releases it when it
ends (normally, with an error, or interrupted; at the latest when the process exits). The lock
file holds the holder's PID, host name and start time as JSON. A second run into the same
directory while the holder is alive is refused with a one-line :class:`RunLockedError` naming it.
A lock whose holder is gone - a PID that no longer runs on this host (the run was killed with -9,
or the machine rebooted), or an unreadable lock file - is stale: it is reported and taken over.
A lock held by another host cannot be checked from here and is refused; the message says which
file to delete once that run is known to be over.
"""

from __future__ import annotations

import atexit
import contextlib
import datetime
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


class RunLock:
    """The lock of ``output_dir`` (see the module docstring).

    Args:
        output_dir: The run's output directory (created when missing).
    """

    def __init__(self, output_dir: str | Path):
        self.path = Path(output_dir) / LOCK_NAME
        self.held = False
        self._created_dir = False

    def acquire(self) -> str | None:
        """Take the lock; returns a note when a stale lock was taken over (else None).
        :class:`RunLockedError` when a live run holds it. A lock this process already holds (an
        earlier trainer of the same process) is taken over silently."""
        self._created_dir = not self.path.parent.exists()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        note = None
        for _ in range(3):  # another run may create or remove the file between the two calls
            try:
                descriptor = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                holder = self._holder()
                if holder is None:
                    note = f"took over an unreadable lock file {self.path}"
                elif holder.get("host") != socket.gethostname():
                    raise RunLockedError(
                        f"{self.path.parent} is used by a run on another host ({_describe(holder)}); "
                        f"if that run is over, delete {self.path}"
                    ) from None
                elif holder.get("pid") == os.getpid():
                    note = None
                elif _alive(int(holder.get("pid", -1))):
                    raise RunLockedError(
                        f"{self.path.parent} is in use by a run still going ({_describe(holder)}): wait "
                        "for it to end or choose another training.output_dir"
                    ) from None
                else:
                    note = f"took over the stale lock of a run that is gone ({_describe(holder)}) in {self.path.parent}"
                with contextlib.suppress(FileNotFoundError):
                    self.path.unlink()
                continue
            with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
                json.dump(
                    {
                        "pid": os.getpid(),
                        "host": socket.gethostname(),
                        "started": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
                    },
                    handle,
                )
            self.held = True
            atexit.register(self.release)
            return note
        raise RunLockedError(f"could not take the lock {self.path}: another run keeps taking it")

    def _holder(self) -> dict[str, Any] | None:
        try:
            holder = json.loads(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return {"pid": os.getpid(), "host": socket.gethostname()}  # just released: retry
        except (OSError, ValueError):
            return None
        return holder if isinstance(holder, dict) else None

    def release(self) -> None:
        """Remove the lock file if this process holds it (and the output directory, if taking the
        lock created it and nothing else was written); safe to call twice."""
        if not self.held:
            return
        self.held = False
        with contextlib.suppress(OSError, ValueError):
            if json.loads(self.path.read_text(encoding="utf-8")).get("pid") == os.getpid():
                self.path.unlink()
        if self._created_dir:
            with contextlib.suppress(OSError):
                self.path.parent.rmdir()  # only when empty
        with contextlib.suppress(Exception):
            atexit.unregister(self.release)
