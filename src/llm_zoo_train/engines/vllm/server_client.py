"""HTTP calls to vLLM servers: timeouts everywhere, retries with backoff, failover to the next server.

:class:`ServerClient` is the transport of the ``vllm_server`` engine
(:mod:`llm_zoo_train.engines.vllm.server`). Connection errors, timeouts, HTTP 408, 429 and 5xx
are transient: they are retried after ``retry_backoff_s``, then twice that, and so on (at most
30 s). Any other HTTP error is raised at once. Every error is an
:class:`~llm_zoo_train.engines.openai_compat.EndpointError` naming the server, the route and the
reason. Each thread keeps its own ``requests.Session`` (a pool of keep-alive connections).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Any

import requests

from llm_zoo_train.engines.openai_compat import EndpointError

__all__ = ["ServerClient", "is_transient"]

_RETRY_STATUS = {408, 429, 500, 502, 503, 504}
_BODY_CHARS = 500  # of an error body quoted in a message


def is_transient(error: EndpointError) -> bool:
    """Whether a retry may succeed: no answer (connection error, timeout) or HTTP 408, 429, 5xx."""
    return error.status is None or error.status in _RETRY_STATUS


class ServerClient:
    """Sends JSON requests to servers with a timeout, retries and backoff.

    Args:
        request_timeout_s: Seconds to wait for an answer (connecting: at most 10 of them).
        max_retries: Retries after a transient error.
        retry_backoff_s: First retry delay; it doubles with every retry (capped at 30 s).
    """

    def __init__(
        self, *, request_timeout_s: float = 600.0, max_retries: int = 3, retry_backoff_s: float = 1.0
    ):
        for name, value in (("request_timeout_s", request_timeout_s), ("retry_backoff_s", retry_backoff_s)):
            if not float(value) > 0:
                raise ValueError(f"{name} must be > 0, got {value!r}")
        if int(max_retries) < 0:
            raise ValueError(f"max_retries must be >= 0, got {max_retries!r}")
        self.request_timeout_s = float(request_timeout_s)
        self.max_retries = int(max_retries)
        self.retry_backoff_s = float(retry_backoff_s)
        self._local = threading.local()

    def send_to_any(
        self, servers: Sequence[str], first: int, route: str, body: dict[str, Any]
    ) -> tuple[dict[str, Any], str]:
        """POST ``body`` to ``servers[first]``; each retry goes to the next server. Returns the answer
        and the server that gave it; raises :class:`EndpointError` listing every failure."""
        failures = []
        for attempt in range(self.max_retries + 1):
            server = servers[(first + attempt) % len(servers)]
            try:
                return self.send(server, "POST", route, body, retries=0), server
            except EndpointError as err:
                if not is_transient(err):
                    raise
                failures.append(str(err))
            if attempt < self.max_retries:
                time.sleep(min(self.retry_backoff_s * 2**attempt, 30.0))
        raise EndpointError(
            f"{route} failed {len(failures)} time(s) on the vLLM servers: " + " | ".join(failures)
        )

    def send(
        self,
        server: str,
        method: str,
        route: str,
        body: dict[str, Any] | None,
        *,
        retries: int | None = None,
        parse: bool = True,
    ) -> Any:
        """``method`` ``server + route`` with JSON ``body``, retried on transient errors (``retries``,
        default ``max_retries``); the decoded JSON answer (``parse=False``: the text)."""
        retries = self.max_retries if retries is None else retries
        url = server + route
        session = getattr(self._local, "session", None)
        if session is None:
            session = self._local.session = requests.Session()
        timeout = (min(10.0, self.request_timeout_s), self.request_timeout_s)
        for attempt in range(retries + 1):
            try:
                response = session.request(method, url, json=body, timeout=timeout)
            except requests.RequestException as err:
                error = EndpointError(
                    f"cannot reach vLLM server {server} ({method} {route}): {type(err).__name__}: {err}. "
                    "Is it running, and is the URL right?"
                )
            else:
                if response.status_code < 400:
                    if not parse:
                        return response.text
                    try:
                        return response.json()
                    except ValueError:
                        raise EndpointError(
                            f"{url} answered with something that is not JSON: {response.text[:_BODY_CHARS]!r}"
                        ) from None
                error = EndpointError(
                    f"vLLM server {server} answered {method} {route} with HTTP {response.status_code}: "
                    f"{response.text.strip()[:_BODY_CHARS] or '(empty body)'}",
                    status=response.status_code,
                    server=server,
                )
            if not is_transient(error) or attempt >= retries:
                raise error
            time.sleep(min(self.retry_backoff_s * 2**attempt, 30.0))
        raise AssertionError("unreachable")  # pragma: no cover
