"""The sessions an ``llm-zoo serve`` process holds: one env each, expiring when left idle.

A session belongs to the WebSocket connection that made (or attached to) it and is dropped when
that connection ends, however it ends. A clone starts *detached*: it waits for a connection to
``attach`` to it, and expires like any idle session if none does. Standard library only.
"""

from __future__ import annotations

import contextlib
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from llm_zoo.serve.protocol import ProtocolError

__all__ = ["DETACHED_TTL_S", "Session", "SessionStore"]

#: A clone nobody attaches to within this many seconds expires: a clone is made to be attached at
#: once, and one left waiting holds a slot others need.
DETACHED_TTL_S = 30.0


@dataclass
class Session:
    """One env held for a client.

    Attributes:
        id: The session's id (unguessable: it is the only key to a detached clone).
        env_id: The registered id the env was made from.
        env: The env itself.
        last_used: ``time.monotonic()`` of the last message that used it.
        attached: A connection owns it (false for a clone nobody attached to yet).
        busy: Calls running on it now; a busy session never expires.
        closed: Expired or removed; the env is closed.
        steps: ``step`` calls since the last reset (OpenEnv's ``step_count``).
        kwargs: The constructor arguments the env was made with.
        client: Who made it (:func:`llm_zoo.serve.auth.client_of`): the per-client limit counts
            a client's sessions, clones included.
        episode_id: The caller's id for the current episode (OpenEnv's ``reset(episode_id=...)``),
            if it gave one.
        last_reset: ``(episode_id, seed, options)`` of the last reset and the observation it
            answered: the same reset again, before any step, answers it again without a new
            episode (a client that retries a reset whose answer it lost gets the same episode).
        gone: Set when the client that owns it is gone: the sandboxed programs its running call
            has not started yet are not started (:func:`llm_zoo.sandbox.cancel_when`).
    """

    id: str
    env_id: str
    env: Any
    last_used: float
    attached: bool = True
    busy: int = 0
    closed: bool = False
    steps: int = 0
    kwargs: dict[str, Any] = field(default_factory=dict)
    client: str = "anyone"
    episode_id: str | None = None
    last_reset: tuple[str, Any] | None = None
    gone: threading.Event = field(default_factory=threading.Event)


class SessionStore:
    """The live sessions, bounded in number and idle time.

    Args:
        ttl_s: A session unused for this many seconds expires (its env is closed).
        max_sessions: More sessions than this are refused with ``CAPACITY_REACHED``.
        max_per_client: More sessions than this for one client are refused the same way
            (default: ``max_sessions``, no limit of its own).
        clock: The time source (tests pass a fake one).
    """

    def __init__(
        self,
        ttl_s: float,
        max_sessions: int,
        clock: Callable[[], float] = time.monotonic,
        max_per_client: int | None = None,
    ):
        if not ttl_s > 0:
            raise ValueError(f"session ttl must be > 0 seconds, got {ttl_s!r}")
        if int(max_sessions) < 1:
            raise ValueError(f"max_sessions must be >= 1, got {max_sessions!r}")
        self.ttl_s = float(ttl_s)
        self.max_sessions = int(max_sessions)
        self.max_per_client = min(self.max_sessions, int(max_per_client or max_sessions))
        if self.max_per_client < 1:
            raise ValueError(f"max_per_client must be >= 1, got {max_per_client!r}")
        self._clock = clock
        self._sessions: dict[str, Session] = {}
        #: Sessions made since the server started (clones included).
        self.created = 0

    def __len__(self) -> int:
        return len(self._sessions)

    def held_by(self, client: str) -> int:
        """Sessions ``client`` holds now, clones included."""
        return sum(s.client == client for s in self._sessions.values())

    def add(
        self,
        env_id: str,
        env: Any,
        *,
        attached: bool,
        kwargs: dict[str, Any] | None = None,
        client: str = "anyone",
    ) -> Session:
        """Hold ``env`` in a new session for ``client`` (closing ``env`` when the server, or that
        client's share of it, is full)."""
        refusal = None
        if len(self._sessions) >= self.max_sessions:
            refusal = (
                f"the server holds its maximum of {self.max_sessions} sessions; close one or retry later"
            )
        elif self.max_per_client < self.max_sessions and self.held_by(client) >= self.max_per_client:
            refusal = (
                f"this client ({client}) holds its maximum of {self.max_per_client} sessions, the server's "
                f"limit per client (of {self.max_sessions} in all); close one or retry later"
            )
        if refusal is not None:
            with contextlib.suppress(Exception):
                env.close()
            raise ProtocolError("CAPACITY_REACHED", refusal)
        session = Session(
            secrets.token_urlsafe(16),
            env_id,
            env,
            self._clock(),
            attached=attached,
            kwargs=dict(kwargs or {}),
            client=client,
        )
        self._sessions[session.id] = session
        self.created += 1
        return session

    def attach(self, session_id: Any) -> Session:
        """Hand a detached session (a clone) to the connection asking for it."""
        session = self._sessions.get(session_id) if isinstance(session_id, str) else None
        if session is None:
            raise ProtocolError(
                "SESSION_ERROR", f"no session {session_id!r}: it never existed, expired or was closed"
            )
        if session.attached:
            raise ProtocolError("SESSION_ERROR", f"session {session_id!r} already belongs to a connection")
        session.attached = True
        session.last_used = self._clock()
        return session

    def touch(self, session: Session) -> None:
        session.last_used = self._clock()

    def remove(self, session_id: str) -> None:
        """Close a session's env and forget it (no-op when it is already gone)."""
        session = self._sessions.pop(session_id, None)
        if session is not None:
            session.gone.set()
            session.closed = True
            with contextlib.suppress(Exception):  # a failing close must not take the server down
                session.env.close()

    def detached_ids(self) -> set[str]:
        """The ids of the clones nobody has attached to yet."""
        return {s.id for s in self._sessions.values() if not s.attached}

    def remove_detached(self, session_id: str) -> None:
        """Remove a clone if nobody has attached to it (an attached one belongs to its connection)."""
        session = self._sessions.get(session_id)
        if session is not None and not session.attached:
            self.remove(session_id)

    def expire(self) -> list[str]:
        """Remove every session idle for longer than the TTL (a clone nobody attached to: longer
        than :data:`DETACHED_TTL_S`, or the TTL if shorter); return their ids."""
        now = self._clock()
        detached_ttl = min(self.ttl_s, DETACHED_TTL_S)
        stale = [
            s.id
            for s in self._sessions.values()
            if not s.busy and now - s.last_used > (self.ttl_s if s.attached else detached_ttl)
        ]
        for session_id in stale:
            self.remove(session_id)
        return stale

    def close_all(self) -> None:
        for session_id in list(self._sessions):
            self.remove(session_id)
