"""Stopping the runs of a caller that no longer wants their results.

An env server plays each client's step on a thread of its own; a Code-v0 step runs the coder's
program once per test. When the client disconnects mid-step nobody will read those results, yet
the step went on starting programs until the end (an outside test saw sandboxed programs started
for 8 s after its client was gone). :func:`cancel_when` marks the calling thread with an event:
once the event is set, runs the thread starts (:meth:`llm_zoo.sandbox.Sandbox.run`,
``run_tests``, ``run_many``) start no program they have not yet sent to a server, and those jobs
get a result at once with ``error`` = :data:`CANCELLED`; jobs waiting for a free server stop
waiting, and a server running the thread's jobs is killed with its programs. Jobs cut short get
:data:`CANCELLED` too. (Programs left to run to their limits kept a client's abandoned Code-v0
steps busy for minutes: 64 spinning programs on 2 cores need 32x their CPU limit in wall time.)
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

__all__ = ["CANCELLED", "cancel_when", "current_cancel_event"]

#: The ``error`` of a job that was never started because its caller cancelled.
CANCELLED = "cancelled: its caller stopped waiting for the result before the program started"

_marks = threading.local()


@contextlib.contextmanager
def cancel_when(event: threading.Event) -> Iterator[None]:
    """Within the block, runs this thread starts stop starting programs once ``event`` is set."""
    outer = getattr(_marks, "event", None)
    _marks.event = event
    try:
        yield
    finally:
        _marks.event = outer


def current_cancel_event() -> threading.Event | None:
    """The event of the innermost :func:`cancel_when` block of this thread, if any."""
    return getattr(_marks, "event", None)
