"""Bearer tokens for ``llm-zoo serve``: who may use the server.

A server started with a token (``LLM_ZOO_SERVE_TOKEN`` or ``--token-file``) answers only requests
that carry ``Authorization: Bearer TOKEN``: a WebSocket without it is closed before it is accepted
(code 1008, policy violation) and an HTTP request gets 401. The comparison takes the same time
whatever the token sent. Clients (:func:`llm_zoo.remote.make`, and the trainer's ``env.servers``
through it) send the token given to them, else ``LLM_ZOO_SERVE_TOKEN`` from their environment.

Clients that cannot set a header (OpenEnv's stock ``GenericEnvClient`` sends none) may put the
token in the URL as its password, ``http://llm-zoo:TOKEN@HOST:PORT/envs/ENV_ID``: HTTP and
WebSocket clients send a URL's credentials as ``Authorization: Basic``, which is accepted when its
password is a token (any user name).

A token file may hold several tokens, one per line: one per client (a trainer, a team). Each token
is then its own client for the server's per-client limits (``llm_zoo.serve.app``), so no client can
take every session from the others.

A server reachable from other machines must have a token: :func:`bind_problem` refuses a
non-loopback address without one unless the operator says ``--allow-no-token``.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import ipaddress
import json
import os
from collections.abc import Awaitable, Callable, MutableMapping, Sequence
from pathlib import Path
from typing import Any

__all__ = [
    "TOKEN_ENV",
    "TokenMiddleware",
    "bearer_header",
    "bind_problem",
    "client_of",
    "read_token",
    "read_tokens",
]

#: The environment variable holding the token, on the server and in clients.
TOKEN_ENV = "LLM_ZOO_SERVE_TOKEN"
#: Shortest token accepted: a guessable token protects nothing.
MIN_TOKEN_CHARS = 16

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]


def read_tokens(token_file: str | Path | None) -> tuple[str, ...]:
    """The server's tokens: every non-empty line of ``token_file`` (``#`` starts a comment line),
    else ``LLM_ZOO_SERVE_TOKEN``, else none. ``ValueError`` (one line) for an unreadable file, a
    file without a token, a token under 16 characters or the same token twice."""
    if token_file is not None:
        try:
            lines = Path(token_file).read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError) as err:
            raise ValueError(
                f"--token-file {token_file}: cannot read a token from it ({type(err).__name__})"
            ) from None
        tokens = tuple(line.strip() for line in lines if line.strip() and not line.strip().startswith("#"))
        if not tokens:
            raise ValueError(f"--token-file {token_file}: no token in it (one per line)")
    else:
        token = os.environ.get(TOKEN_ENV, "").strip()
        tokens = (token,) if token else ()
    for number, token in enumerate(tokens, 1):
        if len(token) < MIN_TOKEN_CHARS:
            raise ValueError(
                f"the server token{f' on line {number}' if len(tokens) > 1 else ''} must have at least "
                f"{MIN_TOKEN_CHARS} characters, got {len(token)}"
            )
    if len(set(tokens)) != len(tokens):
        raise ValueError("the same server token is given twice: each client needs a token of its own")
    return tokens


def read_token(token_file: str | Path | None) -> str | None:
    """The first of :func:`read_tokens` (``None`` without one)."""
    tokens = read_tokens(token_file)
    return tokens[0] if tokens else None


def client_of(scope: Scope) -> str:
    """Which client a request comes from, for the per-client limits: the number of the token it
    carried (``"token-1"``, ...), or ``"anyone"`` on a server without tokens."""
    return scope.get("state", {}).get("llm_zoo_client", "anyone")


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
    """ASGI middleware that lets through only requests carrying one of the server's bearer
    tokens, and notes which (:func:`client_of`)."""

    def __init__(self, app: Callable[[Scope, Receive, Send], Awaitable[None]], token: str | Sequence[str]):
        self.app = app
        tokens = (token,) if isinstance(token, str) else tuple(token)
        if not tokens:
            raise ValueError("TokenMiddleware needs at least one token")
        self._expected = [f"Bearer {t}".encode() for t in tokens]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        client = self._client(scope)
        if client is not None:
            scope.setdefault("state", {})["llm_zoo_client"] = client
            await self.app(scope, receive, send)
            return
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008, "reason": "missing or wrong bearer token"})
            return
        body = json.dumps({"error": "unauthorized: send Authorization: Bearer TOKEN"}).encode()
        await send({"type": "http.response.start", "status": 401,
                    "headers": [(b"content-type", b"application/json"), (b"www-authenticate", b"Bearer")]})  # fmt: skip
        await send({"type": "http.response.body", "body": body})

    def _client(self, scope: Scope) -> str | None:
        """``"token-N"`` for the N-th token, ``None`` for a missing or wrong one. Every token is
        compared, in constant time each, so the time taken says nothing of which matched."""
        sent = next((value for name, value in scope.get("headers", []) if name == b"authorization"), b"")
        sent = _basic_password_as_bearer(sent)
        matched = [hmac.compare_digest(sent, expected) for expected in self._expected]
        return f"token-{matched.index(True) + 1}" if any(matched) else None


def _basic_password_as_bearer(header: bytes) -> bytes:
    """``Basic base64(USER:TOKEN)`` (a URL's credentials) as ``Bearer TOKEN``; any other header
    as it is."""
    scheme, _, credentials = header.partition(b" ")
    if scheme.lower() != b"basic":
        return header
    try:
        decoded = base64.b64decode(credentials.strip(), validate=True)
    except (binascii.Error, ValueError):
        return header
    _, colon, password = decoded.partition(b":")
    return b"Bearer " + password if colon else header
