"""Per-client limits of ``llm-zoo serve``: env calls running at once, and connections open.

A client is a bearer token (``"token-1"``, ...; :func:`llm_zoo.serve.auth.client_of`), or
``"anyone"`` on a server without tokens. Sessions per client are the session store's own limit
(:class:`llm_zoo.serve.sessions.SessionStore`); these are the two others, so that no client can
take the server's threads or memory from the rest.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from starlette.responses import JSONResponse
from starlette.websockets import WebSocket

from llm_zoo.serve.protocol import encode

T = TypeVar("T")

#: Connections a client may have open beyond its share of sessions: those being made (before
#: their make or attach) or closed (before the server has seen the close).
CONNECTIONS_BEYOND_SESSIONS = 64


class ClientLimits:
    """The env threads and the connection counts, shared fairly between clients.

    Args:
        env_threads: Env calls running at once, all clients together.
        max_calls_per_client: Env calls one client may have on those threads at once; its further
            calls wait in the event loop, holding no thread.
        max_connections_per_client: WebSocket connections one client may have open.
    """

    def __init__(self, env_threads: int, max_calls_per_client: int, max_connections_per_client: int):
        #: Env steps mostly wait (on sandboxed programs), so one thread per session that may be
        #: stepping keeps a cheap step from queueing behind slow ones: asyncio's default pool
        #: (cpu_count + 4 threads, 6 on 2 CPUs) let six slow Code-v0 steps hold a cheap Plan-Path
        #: step for 95 s.
        self.workers = ThreadPoolExecutor(max_workers=env_threads, thread_name_prefix="llm-zoo-env")
        #: An outside load test held a cheap step 14.7 s behind 68 slow Code-v0 steps of another
        #: client, one past the 64 threads, before calls were capped per client.
        self.max_calls_per_client = min(env_threads, max_calls_per_client)
        #: Each connection holds at most one session; uncapped, one client held 3,000 connections
        #: without a session (160 MB of the server's memory).
        self.max_connections_per_client = max_connections_per_client
        self._calls: dict[str, asyncio.Semaphore] = {}
        self._connections: Counter[str] = Counter()

    async def on_thread(self, client: str, call: Callable[[], T]) -> T:
        """Run ``call`` on an env thread once ``client`` has fewer than its maximum running there."""
        slots = self._calls.setdefault(client, asyncio.Semaphore(self.max_calls_per_client))
        async with slots:
            return await asyncio.get_running_loop().run_in_executor(self.workers, call)

    def open_connection(self, client: str) -> bool:
        """Count a new connection of ``client`` in; ``False`` (nothing counted) when it has its
        maximum open."""
        if self._connections[client] >= self.max_connections_per_client:
            return False
        self._connections[client] += 1
        return True

    def close_connection(self, client: str) -> None:
        """Count a connection of ``client`` out."""
        self._connections[client] -= 1
        if self._connections[client] <= 0:
            del self._connections[client]

    def shutdown(self) -> None:
        """Stop the env threads, cancelling the calls that have not started."""
        self.workers.shutdown(wait=False, cancel_futures=True)


async def refuse_connection(websocket: WebSocket, why: str) -> None:
    """Refuse a WebSocket handshake with HTTP 429 and ``why`` (the client fails to connect, rather
    than connecting and failing on its first frame); where the ASGI server cannot answer a
    handshake with HTTP, one ``CAPACITY_REACHED`` error frame, then close code 1013."""
    with contextlib.suppress(Exception):
        if "websocket.http.response" in websocket.scope.get("extensions", {}):
            body = {"detail": why, "code": "CAPACITY_REACHED"}
            await websocket.send_denial_response(JSONResponse(body, status_code=429))
            return
        await websocket.accept()
        await websocket.send_text(encode("error", {"code": "CAPACITY_REACHED", "message": why}))
        await websocket.close(code=1013)  # "try again later"


__all__ = ["CONNECTIONS_BEYOND_SESSIONS", "ClientLimits", "refuse_connection"]
