"""Ctrl-C and SIGTERM during training: stop cleanly with the last completed step saved.

While :meth:`~llm_zoo_train.trainer.Trainer.train` runs, :class:`InterruptGuard` turns SIGINT
(Ctrl-C) and SIGTERM (what a cluster scheduler sends before it kills a job) into
:class:`RunInterrupted`. When the signal arrives during a rollout or an evaluation, the adapters are
still those of the last completed step, so the run stops at once. During an update (from the
first adapter's update until the step is counted) the adapters are half-way between two steps:
the guard then lets the update finish, says so in one line, and stops right after. A second
signal stops at once. The trainer then saves a checkpoint of the last completed step (also with
``training.save_steps`` 0), so ``--resume`` continues the run.
"""

from __future__ import annotations

import signal
import sys
import threading
from types import FrameType
from typing import Any

__all__ = ["InterruptGuard", "RunInterrupted"]


class RunInterrupted(KeyboardInterrupt):
    """The run was stopped by a signal; ``signal_name`` is ``"SIGINT"`` or ``"SIGTERM"``."""

    def __init__(self, signal_name: str):
        super().__init__(signal_name)
        self.signal_name = signal_name
        #: The checkpoint saved on the way out (None: nothing saved).
        self.checkpoint: Any = None

    @property
    def exit_code(self) -> int:
        """The conventional exit status of a process stopped by the signal (128 + its number)."""
        return 128 + int(getattr(signal, self.signal_name, signal.SIGINT))


class InterruptGuard:
    """Handles SIGINT and SIGTERM between :meth:`~llm_zoo_train.runs.interrupts.InterruptGuard.install` and :meth:`~llm_zoo_train.runs.interrupts.InterruptGuard.uninstall`;
    :meth:`begin_update` ... :meth:`end_update` is the stretch during which a signal is deferred."""

    def __init__(self) -> None:
        self._deferring = False
        self._pending: str | None = None
        self._previous: dict[int, Any] = {}

    def install(self) -> None:
        """Handle SIGINT and SIGTERM from now on (main thread only; elsewhere nothing changes)."""
        self._deferring, self._pending = False, None
        if threading.current_thread() is threading.main_thread() and not self._previous:
            for number in (signal.SIGINT, signal.SIGTERM):
                self._previous[number] = signal.signal(number, self._handle)

    def uninstall(self) -> None:
        """Put the handlers back that were there before :meth:`~llm_zoo_train.runs.interrupts.InterruptGuard.install`."""
        for number, handler in self._previous.items():
            signal.signal(number, handler)
        self._previous.clear()
        self._deferring = False

    def _handle(self, number: int, frame: FrameType | None) -> None:
        name = signal.Signals(number).name
        if self._deferring and self._pending is None:
            self._pending = name
            print(
                f"llm-zoo-train: {name}: finishing this step's update, then saving a checkpoint "
                "(send it again to stop at once, without saving this step)",
                file=sys.stderr,
                flush=True,
            )
            return
        raise RunInterrupted(name)

    def begin_update(self) -> None:
        """From here until :meth:`end_update` a signal waits for the step to complete."""
        self._deferring = True

    def end_update(self) -> None:
        """The step is complete: raise a signal that arrived during the update."""
        self._deferring = False
        pending, self._pending = self._pending, None
        if pending is not None:
            raise RunInterrupted(pending)
