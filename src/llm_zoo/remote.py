"""Envs that live on an ``llm-zoo serve`` server, used as PettingZoo AEC envs here.

:func:`make` opens a session on the server and returns a :class:`RemoteEnv`: a
:class:`pettingzoo.AECEnv` that mirrors the server's env after every call (agents, rewards,
cumulative rewards, terminations, truncations, infos, the selected agent and its prompt), so
``env.last()``, ``env.agent_iter()`` and PettingZoo's test suite work as they do in-process, with
the same rewards for the same seeds and actions::

    from llm_zoo import remote
    env = remote.make("http://127.0.0.1:8000", "PlanPath-v0", max_turns=3)
    env.reset(seed=0)
    for agent in env.agent_iter():
        observation, reward, termination, truncation, info = env.last()
        env.step(None if termination or truncation else my_model(observation["prompt"]))
    env.close()

``clone()`` opens a second session holding an independent copy (the tree rollout branches on
it). Errors the env raises on the server are raised here under their own type (``RuntimeError``,
``ValueError``, ...) with the server's message; a server that cannot be reached, dies, or breaks
the protocol raises :class:`RemoteEnvError` naming the server. Needs ``llm-zoo[serve]``
(the ``websockets`` client).
"""

from __future__ import annotations

import atexit
import builtins
import contextlib
import copy
import json
import logging
import sys
import weakref
from collections.abc import Sequence
from typing import Any

from gymnasium import spaces
from pettingzoo import AECEnv

from llm_zoo.core import MAX_ACTION_CHARS, MAX_PROMPT_CHARS, TextSpace
from llm_zoo.registry import UnknownEnvError
from llm_zoo.serve.auth import TOKEN_ENV, bearer_header
from llm_zoo.serve.protocol import REPLAYED_EXCEPTIONS, encode

_log = logging.getLogger("llm_zoo.remote")
#: Every connection still open, closed at interpreter exit: closing one joins websockets' thread,
#: which hangs forever once the interpreter is finalizing (a script that ended without close()
#: never exited).
_OPEN: weakref.WeakSet[_Connection] = weakref.WeakSet()
#: A server silent this long on one request is named in a warning line (then waited for until the
#: request's timeout): a hung server must not stall a run without a word.
SLOW_ANSWER_S = 10.0
#: websockets' own log of each connection. Its keepalive thread logs a server that stopped
#: answering pings as an error with a traceback (a stopped server printed them into a training
#: run); this client reports that connection itself, in one line, when it is next used.
_WEBSOCKETS_LOG = logging.getLogger("llm_zoo.remote.websockets")
_WEBSOCKETS_LOG.setLevel(logging.CRITICAL)

__all__ = ["RemoteEnv", "RemoteEnvError", "make"]


class RemoteEnvError(RuntimeError):
    """The env server could not be reached, closed the session, or answered out of protocol.

    ``connection_lost`` is true when the server itself is gone (unreachable, connection dropped,
    no answer in time), as opposed to a server that answered with an error.
    """

    def __init__(self, message: str, *, connection_lost: bool = False):
        super().__init__(message)
        self.connection_lost = connection_lost


def _ws_url(url: str) -> str:
    base = url.rstrip("/")
    for plain, secure in (("http://", "ws://"), ("https://", "wss://")):
        if base.startswith(plain):
            base = secure + base[len(plain) :]
    if not base.startswith(("ws://", "wss://")):
        raise ValueError(f"env server URL must start with http://, https://, ws:// or wss://, got {url!r}")
    return base + "/ws"


def _detail_of(body: bytes | None) -> str:
    """The ``detail`` of a JSON refusal body, else its first 200 characters of text."""
    text = (body or b"").decode("utf-8", "replace")
    try:
        detail = json.loads(text).get("detail")
    except (ValueError, AttributeError):
        detail = None
    return str(detail) if detail else text.strip()[:200]


class _Connection:
    """One WebSocket session: send a frame, wait for its answer, turn error frames into exceptions."""

    def __init__(self, url: str, *, timeout_s: float, connect_timeout_s: float, token: str | None = None):
        from websockets.exceptions import InvalidStatus
        from websockets.sync.client import connect

        self.url = url
        self.timeout_s = timeout_s
        self.token = token
        self.session_id = ""
        try:
            # __enter__: the connection under websockets' current and future connect() alike
            self._ws = connect(
                _ws_url(url),
                open_timeout=connect_timeout_s,
                max_size=None,
                close_timeout=2,
                additional_headers=bearer_header(token),
                logger=_WEBSOCKETS_LOG,
            ).__enter__()
        except ValueError:
            raise
        except InvalidStatus as err:
            status = err.response.status_code
            why = "refused the bearer token sent" if bearer_header(token) else "wants a bearer token"
            if status in (401, 403):
                raise RemoteEnvError(
                    f"the env server at {url} {why} (HTTP {status}): pass token= or set {TOKEN_ENV}"
                ) from None
            detail = _detail_of(err.response.body)
            raise RemoteEnvError(
                f"the env server at {url} refused the connection (HTTP {status})"
                + (f": {detail}" if detail else "")
            ) from None
        except Exception as err:
            raise RemoteEnvError(
                f"cannot reach the env server at {url}: {type(err).__name__}: {err}",
                connection_lost=True,
            ) from None
        _OPEN.add(self)

    def request(self, kind: str, data: dict[str, Any], expect: str) -> dict[str, Any]:
        try:
            self._ws.send(encode(kind, data))
            raw = self._receive(kind)
        except TimeoutError:
            raise RemoteEnvError(
                f"the env server at {self.url} sent no answer to {kind!r} within {self.timeout_s:g} s"
                f" (session {self.session_id or 'not made'})",
                connection_lost=True,
            ) from None
        except Exception as err:  # websockets' ConnectionClosed, OSError: the server went away
            raise RemoteEnvError(
                f"the env server at {self.url} dropped the connection during {kind!r}"
                f" (session {self.session_id or 'not made'}): {type(err).__name__}: {err}",
                connection_lost=True,
            ) from None
        try:
            message = json.loads(raw)
            reply, payload = message["type"], message["data"]
        except (ValueError, KeyError, TypeError):
            raise RemoteEnvError(
                f"the env server at {self.url} answered {kind!r} out of protocol: {raw!r:.200}"
            ) from None
        if reply == "error":
            raise _server_error(self.url, payload)
        if reply != expect:
            raise RemoteEnvError(
                f"the env server at {self.url} answered {kind!r} with {reply!r}, expected {expect!r}"
            )
        return payload

    def _receive(self, kind: str) -> str | bytes:
        """The answer to the frame just sent, within ``timeout_s``; a server silent for
        :data:`SLOW_ANSWER_S` is named at once in one warning line (a hung server stalled a run for
        its whole timeout without a word), then waited for until the timeout."""
        first = min(SLOW_ANSWER_S, self.timeout_s)
        try:
            return self._ws.recv(timeout=first)
        except TimeoutError:
            if self.timeout_s <= first:
                raise
        _log.warning(
            "the env server at %s has not answered %r for %g s (session %s); waiting up to %g s in all",
            self.url, kind, first, self.session_id or "not made", self.timeout_s,
        )  # fmt: skip
        return self._ws.recv(timeout=self.timeout_s - first)

    def close(self) -> None:
        _OPEN.discard(self)
        with contextlib.suppress(Exception):
            self._ws.send(encode("close", {}))
        with contextlib.suppress(Exception):
            self._ws.close()


@atexit.register
def _close_open_connections() -> None:
    for connection in list(_OPEN):
        connection.close()


def _server_error(url: str, data: dict[str, Any]) -> Exception:
    message = f"{data.get('message', 'error')} [{data.get('code', '?')} from {url}]"
    name = data.get("exception")
    if name == "UnknownEnvError":
        return UnknownEnvError(message)
    if name in REPLAYED_EXCEPTIONS and isinstance(getattr(builtins, name, None), type):
        return getattr(builtins, name)(message)
    return RemoteEnvError(message)


class RemoteEnv(AECEnv):
    """A PettingZoo AEC env whose env runs on an ``llm-zoo serve`` server. Build with :func:`make`.

    Attributes beyond PettingZoo's: ``url``, ``env_id``, ``session_id``, ``max_turns``, ``alpha``,
    and after a reset the env's ``turn``, ``task_id`` and ``success``.
    """

    def __init__(
        self,
        connection: _Connection,
        info: dict[str, Any],
        render_mode: str | None,
        *,
        kwargs: dict[str, Any] | None = None,
        failover: Sequence[str] = (),
        token: str | None = None,
    ):
        super().__init__()
        self._token = token
        self._kwargs = dict(kwargs or {})
        #: Other servers to replay the episode on if this one is lost (see :func:`make`).
        self.failover = list(failover)
        # What rebuilds the episode elsewhere: the seeded reset and the steps since (None: an
        # unseeded reset, which no other server can reproduce).
        self._log: list[tuple[str, dict[str, Any]]] | None = None
        self._connection: _Connection | _Closed = connection
        self.url = connection.url
        self.env_id = info["env_id"]
        self.session_id = info["session_id"]
        connection.session_id = self.session_id
        self.metadata = dict(info.get("metadata") or {})
        self.render_mode = render_mode
        self.max_turns = info.get("max_turns")
        self.alpha = info.get("alpha")
        self.possible_agents = list(info["possible_agents"])
        bounds = info.get("spaces") or {}
        self.observation_spaces = {
            a: spaces.Dict(
                {"prompt": TextSpace((bounds.get(a) or {}).get("observation_max_length") or MAX_PROMPT_CHARS)}
            )
            for a in self.possible_agents
        }
        self.action_spaces = {
            a: TextSpace((bounds.get(a) or {}).get("action_max_length") or MAX_ACTION_CHARS)
            for a in self.possible_agents
        }
        self.agents: list[str] = []
        self._prompts: dict[str, str] = {}
        self._has_reset = False
        self._info = info

    # ------------------------------------------------------------------ PettingZoo API

    def observation_space(self, agent: str) -> spaces.Space:
        return self.observation_spaces[agent]

    def action_space(self, agent: str) -> spaces.Space:
        return self.action_spaces[agent]

    def reset(self, seed: int | None = None, options: dict[str, Any] | None = None) -> None:
        data = {"seed": seed, "options": options}
        payload = self._request("reset", data, "observation")
        self._apply(payload)
        self._has_reset = True
        self._log = [("reset", data)] if seed is not None else None

    def step(self, action: Any) -> None:
        self._require_reset("step")
        text = action if isinstance(action, str) or action is None else str(action)
        self._apply(self._request("step", {"text": text}, "observation"))
        if self._log is not None:
            self._log.append(("step", {"text": text}))

    def observe(self, agent: str) -> dict[str, str]:
        self._require_reset("observe")
        if agent in self._prompts:
            return {"prompt": self._prompts[agent]}
        reply = self._request("observe", {"agent": agent}, "observe")
        return dict(reply["observation"])

    def last(self, observe: bool = True) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        self._require_reset("last")
        return super().last(observe)

    def render(self) -> str | None:
        if self.render_mode is None:
            return None
        self._require_reset("render")
        text = self._request("render", {}, "render")["text"]
        if self.render_mode == "human":
            print(text, flush=True)
            return None
        return text

    def state(self) -> dict[str, Any]:
        """OpenEnv's state of the session: ``episode_id`` (the task id), ``step_count``, ..."""
        return self._request("state", {}, "state")

    def close(self) -> None:
        """End the session on the server (idempotent)."""
        connection, self._connection = self._connection, _Closed(self.url, self.session_id)
        connection.close()

    def __del__(self) -> None:
        if sys.is_finalizing():  # too late to join the connection's thread; the server ends the session
            return
        with contextlib.suppress(Exception):
            self.close()

    def __enter__(self) -> RemoteEnv:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def clone(self) -> RemoteEnv:
        """An independent copy in a new server session: stepping one never changes the other.

        A clone is made on this env's server, then a second connection attaches to it. A server
        lost between the two (killed mid-handshake) moves this episode to a failover server, as
        any other call would, and the clone is made there.
        """
        for attempt in range(2):
            info = self._request("clone", {}, "session")
            connection: _Connection | None = None
            try:
                connection = _Connection(
                    self.url, timeout_s=self._connection.timeout_s, connect_timeout_s=30.0, token=self._token
                )
                connection.request("attach", {"session_id": info["session_id"]}, "session")
                break
            except RemoteEnvError as err:
                if connection is not None:
                    connection.close()
                if attempt or not (err.connection_lost and self.failover):
                    raise
                self._replay_elsewhere(err)
            except Exception:
                if connection is not None:
                    connection.close()
                raise
        assert connection is not None
        twin = RemoteEnv(connection, info, self.render_mode, kwargs=self._kwargs, failover=self.failover)
        twin._log = copy.deepcopy(self._log)
        for name in (
            "agents",
            "rewards",
            "_cumulative_rewards",
            "terminations",
            "truncations",
            "infos",
            "agent_selection",
            "turn",
            "task_id",
            "success",
            "_prompts",
            "_has_reset",
        ):
            if hasattr(self, name):
                setattr(twin, name, copy.deepcopy(getattr(self, name)))
        return twin

    # ------------------------------------------------------------------ failover

    def _request(self, kind: str, data: dict[str, Any], expect: str) -> dict[str, Any]:
        try:
            return self._connection.request(kind, data, expect)
        except RemoteEnvError as err:
            if not (err.connection_lost and self.failover):
                raise
            self._replay_elsewhere(err)
        return self._connection.request(kind, data, expect)

    def _replay_elsewhere(self, lost: RemoteEnvError) -> None:
        """Rebuild this episode on a failover server (make, the seeded reset, every step since):
        envs are deterministic given the seed and the actions, so it continues exactly."""
        dead = self.url
        if self._log is None and self._has_reset:
            raise RemoteEnvError(
                f"{lost}; the episode cannot move to another server: it was reset without a seed",
                connection_lost=True,
            ) from None
        failures = []
        for url in list(self.failover):
            connection: _Connection | None = None
            try:
                connection = _Connection(
                    url, timeout_s=self._connection.timeout_s, connect_timeout_s=30.0, token=self._token
                )
                info = connection.request("make", {"env_id": self.env_id, "kwargs": self._kwargs}, "session")
                for kind, data in self._log or []:
                    connection.request(kind, data, "observation")
            except RemoteEnvError as err:
                if connection is not None:
                    connection.close()
                failures.append(str(err))
                continue
            self._connection.close()
            self._connection = connection
            connection.session_id = self.session_id = info["session_id"]
            self.url = url
            self.failover = [u for u in self.failover if u != url] + [dead]
            return
        raise RemoteEnvError(
            f"{lost}; replaying the episode on the failover servers failed too: " + " | ".join(failures),
            connection_lost=True,
        ) from None

    # ------------------------------------------------------------------ mirroring

    def _apply(self, payload: dict[str, Any]) -> None:
        observation = payload["observation"]
        self.agents = list(observation["agents"])
        self.rewards = dict(observation["rewards"])
        self._cumulative_rewards = dict(observation["cumulative_rewards"])
        self.terminations = dict(observation["terminations"])
        self.truncations = dict(observation["truncations"])
        self.infos = dict(observation["infos"])
        self.agent_selection = observation["agent"]
        self.turn = observation.get("turn")
        self.task_id = observation.get("task_id")
        self.success = bool(observation.get("success"))
        prompt = observation.get("prompt")
        self._prompts = {self.agent_selection: prompt} if prompt is not None else {}

    def _require_reset(self, method: str) -> None:
        if not self._has_reset:
            raise RuntimeError(f"RemoteEnv({self.env_id}).{method}() before reset(): call env.reset() first")


class _Closed:
    """Stands in for the connection of a closed RemoteEnv: every call says so."""

    def __init__(self, url: str, session_id: str):
        self.url = url
        self.session_id = session_id
        self.timeout_s = 0.0

    def request(self, kind: str, data: dict[str, Any], expect: str) -> dict[str, Any]:
        raise RuntimeError(
            f"RemoteEnv session {self.session_id} on {self.url} is closed: {kind} after close()"
        )

    def close(self) -> None:
        pass


def make(
    url: str,
    env_id: str,
    *,
    timeout_s: float = 300.0,
    connect_timeout_s: float = 30.0,
    failover: Sequence[str] = (),
    token: str | None = None,
    **kwargs: Any,
) -> RemoteEnv:
    """Make ``env_id`` with ``kwargs`` on the server at ``url`` and return it as an AEC env.

    Args:
        url: The server, e.g. ``"http://127.0.0.1:8000"``.
        env_id: A registered id on the server (plugins included).
        timeout_s: Longest wait for one answer (a Code-v0 step runs programs).
        connect_timeout_s: Longest wait to open the connection.
        failover: Other servers: when ``url`` is lost mid-episode, the episode is replayed on the
            first of them that answers (made, reset with its seed, every step since) and goes on
            there; an episode reset without a seed cannot move.
        token: The server's bearer token (:mod:`llm_zoo.serve.auth`); default
            ``LLM_ZOO_SERVE_TOKEN`` from the environment, if set.
        **kwargs: The env's constructor arguments, as for :func:`llm_zoo.make` (JSON values).

    Raises:
        UnknownEnvError: The server has no such env. ``TypeError``/``ValueError``: bad kwargs.
        RemoteEnvError: The server cannot be reached.
    """
    render_mode = kwargs.get("render_mode")
    if render_mode == "human":
        kwargs["render_mode"] = "ansi"  # the picture is printed here, not in the server's log
    connection = _Connection(url, timeout_s=timeout_s, connect_timeout_s=connect_timeout_s, token=token)
    try:
        info = connection.request("make", {"env_id": env_id, "kwargs": kwargs}, "session")
    except Exception:
        connection.close()
        raise
    return RemoteEnv(
        connection, info, render_mode, kwargs=kwargs, failover=[u for u in failover if u != url], token=token
    )
