"""Bearer tokens for ``llm-zoo serve``: who may use the server.

A server started with a token (``LLM_ZOO_SERVE_TOKEN`` or ``--token-file``) answers only requests
that carry ``Authorization: Bearer TOKEN``: a WebSocket without it is closed before it is accepted
(code 1008, policy violation) and an HTTP request gets 401. The comparison takes the same time
whatever the token sent. Clients (:func:`llm_zoo.remote.make`, and the trainer's ``env.servers``
through it) send the token given to them, else ``LLM_ZOO_SERVE_TOKEN`` from their environment.

A server reachable from other machines must have a token: :func:`bind_problem` refuses a
non-loopback address without one unless the operator says ``--allow-no-token``.
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import os
from collections.abc import Awaitable, Callable, MutableMapping
from pathlib import Path
from typing import Any

__all__ = ["TOKEN_ENV", "TokenMiddleware", "bearer_header", "bind_problem", "read_token"]

#: The environment variable holding the token, on the server and in clients.
TOKEN_ENV = "LLM_ZOO_SERVE_TOKEN"
#: Shortest token accepted: a guessable token protects nothing.
MIN_TOKEN_CHARS = 16

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]


def read_token(token_file: str | Path | None) -> str | None:
    """The server's token: the first line of ``token_file``, else ``LLM_ZOO_SERVE_TOKEN``, else
    ``None``. ``ValueError`` (one line) for an unreadable file or a token under 16 characters."""
    if token_file is not None:
        try:
            token = Path(token_file).read_text(encoding="utf-8").strip().splitlines()[0].strip()
        except (OSError, UnicodeDecodeError, IndexError) as err:
            raise ValueError(
                f"--token-file {token_file}: cannot read a token from it ({type(err).__name__})"
            ) from None
    else:
        token = os.environ.get(TOKEN_ENV, "").strip()
        if not token:
            return None
    if len(token) < MIN_TOKEN_CHARS:
        raise ValueError(
            f"the server token must have at least {MIN_TOKEN_CHARS} characters, got {len(token)}"
        )
    return token


def bearer_header(token: str | None) -> dict[str, str]:
    """The request header carrying ``token`` (the client's, else ``LLM_ZOO_SERVE_TOKEN``); none
    without a token."""
    token = token if token is not None else os.environ.get(TOKEN_ENV, "").strip() or None
    return {"Authorization": f"Bearer {token}"} if token else {}


def bind_problem(host: str, token: str | None, allow_no_token: bool) -> str | None:
    """Why the server must not listen on ``host`` as configured, or ``None``."""
    if token is not None or allow_no_token:
        return None
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = host == "localhost"
    if loopback:
        return None
    return (
        f"--host {host} lets other machines in, and the server has no token: set {TOKEN_ENV} or "
        "--token-file (clients then send it), or pass --allow-no-token to serve everyone who can reach it"
    )


class TokenMiddleware:
    """ASGI middleware that lets through only requests carrying the server's bearer token."""

    def __init__(self, app: Callable[[Scope, Receive, Send], Awaitable[None]], token: str):
        self.app = app
        self._expected = f"Bearer {token}".encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket") or self._authorized(scope):
            await self.app(scope, receive, send)
            return
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008, "reason": "missing or wrong bearer token"})
            return
        body = json.dumps({"error": "unauthorized: send Authorization: Bearer TOKEN"}).encode()
        await send({"type": "http.response.start", "status": 401,
                    "headers": [(b"content-type", b"application/json"), (b"www-authenticate", b"Bearer")]})  # fmt: skip
        await send({"type": "http.response.body", "body": body})

    def _authorized(self, scope: Scope) -> bool:
        sent = next((value for name, value in scope.get("headers", []) if name == b"authorization"), b"")
        return hmac.compare_digest(sent, self._expected)
